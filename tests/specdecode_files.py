"""SYNTHETIC files in SpecDecode-Bench's JSON Lines format, written by the tests (never the published traces).

Each request: random prompt and generated token ids; per-start ``acc_len`` lists for EAGLE and n-gram that behave
like the real ones (values >= 1, not ``acc_len[g] - 1`` one position later, sometimes running past the end); the
EAGLE list's length differs from the generated ids in some requests, as in the published files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

SHARED = Path(os.environ.get("SPECGYM_SHARED", Path(__file__).resolve().parents[1] / ".." / "shared")) / "data" / \
    "specdecode-bench"


def shared_files() -> list[Path]:
    """The published files of the shared copy (empty when it is absent: tests that need them skip)."""
    return sorted(SHARED.glob("combined_*.jsonl")) if SHARED.is_dir() else []


def acc_list(rng: np.random.Generator, n: int, mean_run: float, max_acc: int = 21) -> list[int]:
    """A per-start ``acc_len`` list: geometric-ish runs (bonus included), independent per start."""
    p = mean_run / (1.0 + mean_run)
    return [int(min(rng.geometric(1.0 - p), max_acc)) for _ in range(n)]


def request(rng: np.random.Generator, rid: str, n_gen: int, eagle_delta: int = 0, prompt_len: int | None = None,
            vocab: int = 60) -> dict:
    """One synthetic request object (``eagle_delta``: how much longer the EAGLE list is than the generated ids)."""
    prompt_len = prompt_len or int(rng.integers(5, 40))
    gen = rng.integers(0, vocab, n_gen).tolist()
    return {"id": rid, "prompt_token_ids": rng.integers(0, vocab, prompt_len).tolist(), "generated_token_ids": gen,
            "acc_eagle": {"acc_len": acc_list(rng, n_gen + eagle_delta, 2.0)},
            "acc_ngram": {"acc_len": acc_list(rng, n_gen, 0.6)}}


def write_file(path: Path, requests: list[dict]) -> Path:
    """Write request objects as JSON Lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in requests), encoding="utf-8")
    return path


def synthetic_file(path: Path, n: int = 12, seed: int = 0, min_gen: int = 8, max_gen: int = 60,
                   mismatch_every: int = 3) -> Path:
    """A SYNTHETIC file of ``n`` requests; every ``mismatch_every``-th has an EAGLE list of another length."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        delta = 0 if (mismatch_every == 0 or i % mismatch_every) else int(rng.choice([-3, -1, 2, 5]))
        reqs.append(request(rng, f"q{i}", int(rng.integers(min_gen, max_gen)), delta))
    return write_file(path, reqs)


def two_drafter_file(path: Path, n: int, seed: int = 11) -> Path:
    """A SYNTHETIC file of ``n`` requests with EAGLE-like runs and n-gram-like runs (30% of them tripled), over a
    12-token vocabulary so that context lookups match: the drafter-choice tests' workload."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        r = request(rng, f"q{i}", int(rng.integers(20, 90)), vocab=12)
        r["acc_ngram"]["acc_len"] = [int(a) * (3 if rng.random() < 0.3 else 1) for a in r["acc_ngram"]["acc_len"]]
        reqs.append(r)
    return write_file(path, reqs)

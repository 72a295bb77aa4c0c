"""What both ``specgym bench vllm`` comparisons share: the served requests (a greedy recording's test prompts,
tokenized as recorded), the checks on the recording, the interleaved serving order and the machine's state.

:mod:`specgym.eval.bench.vllm` (vLLM's ``draft_model`` proposer under specgym's K policies) and
:mod:`specgym.eval.bench.vllm_proposer` (specgym's per-request proposer against vLLM's ``ngram``) both use them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.engines.live.model_loading import encode_prompt
from specgym.envs.workloads.trace_format import SIGNAL_COLUMNS, Workload
from specgym.errors import SpecgymError


@dataclass
class Served:
    """The requests of the benchmark: workload indices, prompt token ids, lengths."""

    index: np.ndarray
    prompts: list[list[int]]
    lengths: list[int]
    reference: list[list[int]] = field(default_factory=list)


def tokenized(workload: Workload, indices: np.ndarray, model: Path, max_tokens: int | None) -> Served:
    """Prompt token ids as the recorder tokenized them (``encode_prompt`` with the model folder's tokenizer: an
    instruct model's chat template included; checked against ``prompt_len``), and the recorded completions (cut to
    ``max_tokens``)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    assert workload.prompt_text is not None and workload.token_id is not None  # check_workload
    prompts, lengths, ref = [], [], []
    for r in indices.tolist():
        ids = encode_prompt(tok, workload.prompt_text[r])
        if len(ids) != int(workload.prompt_len[r]):
            raise SpecgymError(f"workload {workload.name!r}, request {workload.request_id[r]}: the prompt tokenizes "
                               f"to {len(ids)} tokens, the recording says {workload.prompt_len[r]} (another "
                               "tokenizer?)")
        n = int(workload.lengths[r]) if max_tokens is None else min(int(workload.lengths[r]), max_tokens)
        prompts.append(ids or [0])
        lengths.append(n)
        ref.append(workload.token_id[workload.span(r)][:n].tolist())
    return Served(indices, prompts, lengths, ref)


def truncated(workload: Workload, max_tokens: int | None) -> Workload:
    """The workload with every request cut to its first ``max_tokens`` positions (what the engine serves)."""
    if max_tokens is None or int(workload.lengths.max()) <= max_tokens:
        return workload
    lengths = np.minimum(workload.lengths, max_tokens)
    keep = np.concatenate([np.arange(s, s + n) for s, n in zip(workload.offsets[:-1].tolist(), lengths.tolist())])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    cols = {c: getattr(workload, c)[keep] for c in ("p_accept", "draft_conf", "draft_entropy", "target_entropy")}
    cols.update({c: getattr(workload, c)[keep] for c in SIGNAL_COLUMNS if getattr(workload, c) is not None})
    return dataclasses.replace(workload, offsets=offsets, **cols)


def check_workload(workload: Workload, pair: str) -> None:
    """The vLLM benchmark needs a greedy recording of the pair it serves, with prompt texts and token ids."""
    src = workload.source
    if src.get("kind") != "recorded" or float(src.get("temperature", -1)) != 0.0:
        raise SpecgymError(f"bench vllm: workload {workload.name!r} is not a greedy recording (vLLM serves it "
                           "greedily; its acceptance must be what vLLM sees)")
    if workload.prompt_text is None or workload.token_id is None:
        raise SpecgymError(f"bench vllm: workload {workload.name!r} has no prompt texts or token ids")
    if f"/{pair}/" not in f"/{src.get('target_model', '')}/":
        raise SpecgymError(f"bench vllm: workload {workload.name!r} was recorded from {src.get('target_model')}, "
                           f"not the shipped pair {pair!r}")


def load_average() -> list[float]:
    """The machine's load averages (1, 5 and 15 minutes), rounded."""
    return [round(x, 2) for x in os.getloadavg()]


def run_order(cells: list[Any], policies: list[str], repeats: int, seed: int) -> list[list[tuple[Any, str]]]:
    """Per repetition, every (cell, policy) run in its own seeded random order.

    The machine's speed drifts over minutes (a 2-vCPU VM's neighbours; seen here: one stretch of ~30 s ran 3-10x
    slower). In a fixed order the policies served last in each cell (the table, the plugin) always met the same part
    of the drift; shuffled per repetition, drift spreads over every policy and the paired intervals show it.
    """
    rng = np.random.default_rng(seed)
    runs = [(c, p) for c in cells for p in policies]
    return [[runs[i] for i in rng.permutation(len(runs))] for _ in range(repeats)]


#: A machine whose plain step moves by more than this across the profiling passes is not rated quiet.
DRIFT_LIMIT = 0.10


def machine_state(before: list[float], after: list[float], drift: dict[str, Any] | None = None) -> str:
    """``quiet`` when nothing else ran (1-minute load < 0.5 before the section on 2 CPUs) and the plain step held
    still (within :data:`DRIFT_LIMIT` across the profiling passes); else ``busy`` or ``drifting``, with the figures."""
    if before[0] >= 0.5:
        return f"busy (load average {before[0]} before, {after[0]} after)"
    if drift is not None and drift["spread"] > DRIFT_LIMIT:
        return (f"drifting (plain step at batch {drift['batch']}: {min(drift['step_ms']):.1f}-"
                f"{max(drift['step_ms']):.1f} ms over {len(drift['step_ms'])} profiling passes)")
    return "quiet"

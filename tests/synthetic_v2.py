"""A SYNTHETIC trace-format-v2 workload for the acceptance-predictor tests: acceptance driven by the lookup signal,
the draft's confidence only loosely related to it (not a recording)."""

from __future__ import annotations

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.lookup import lookup_columns
from specgym.envs.core.signals import TOPK
from specgym.envs.workloads.trace_format import Workload, workload_from_requests

PROFILE = CostProfile("flat-test", 1.0, tuple(10.0 + 0.5 * n for n in range(17)), 0.5, source="synthetic")


def v2_workload(n_req: int = 60, temperature: float = 0.0, seed: int = 0, signals: bool = True) -> Workload:
    """SYNTHETIC v2 trace: tokens repeat a short motif in half the requests, acceptance is high where the lookup
    agrees with the draft token and the draft's confidence is only loosely related to it."""
    rng = np.random.default_rng(seed)
    reqs = []
    for r in range(n_req):
        n = int(rng.integers(40, 80))
        prompt = rng.integers(0, 50, 6).tolist()
        if r % 2:
            motif = rng.integers(0, 50, 5)
            tokens = np.resize(motif, n).astype(np.int32)
        else:
            tokens = rng.integers(0, 50, n).astype(np.int32)
        _, look_tok, _ = lookup_columns(prompt, tokens.tolist(), tokens)
        agree_target = look_tok == tokens
        p = np.where(agree_target, 0.92, 0.35)
        accepted = rng.random(n) < p
        draft = np.where(accepted, tokens, (tokens + 1) % 50).astype(np.int32)
        lens, toks, agree = lookup_columns(prompt, tokens.tolist(), draft)
        conf = np.clip(0.5 + 0.2 * (accepted - 0.5) + 0.25 * rng.standard_normal(n), 0.05, 0.99)
        topk = np.sort(np.column_stack([conf, rng.dirichlet(np.ones(TOPK - 1), n) * (1 - conf)[:, None]]), axis=1)
        topk = topk[:, ::-1].astype(np.float32)
        label = accepted.astype(np.float32) if temperature == 0 else p.astype(np.float32)
        req = {"request_id": f"r{r}", "category": "loop" if r % 2 else "text", "temperature": temperature,
               "prompt_len": len(prompt), "p_accept": label, "draft_conf": topk[:, 0].copy(),
               "draft_entropy": np.full(n, 1.5, np.float32), "split": ["train", "train", "val", "test"][r % 4]}
        if signals:
            req.update({"token_id": tokens, "draft_token": draft, "target_rank": np.where(accepted, 0, 1)
                        .astype(np.int32), "draft_topk": topk, "lookup_len": lens, "lookup_token": toks,
                        "lookup_agree": agree})
        reqs.append(req)
    meta = {"topk": TOPK, "lookup_max_n": 4, "vocab_size": 50} if signals else None
    return workload_from_requests("synthetic-v2", {"kind": "synthetic"}, PROFILE, reqs, signal_meta=meta)

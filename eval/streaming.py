"""Evaluation of a sharded workload in memory bounded by one shard (``specgym eval --stream``, the scale bench).

The replay engine's common random numbers are a function of (seed, request id) only
(:func:`~specgym.envs.core.replay.request_uniforms`), and requests are independent, so replaying a
workload shard by shard gives every request exactly the draws, rounds and time of the in-memory evaluation
(:func:`specgym.eval.harness.evaluate`); controllers are served the requests in the same order and keep their state
across shards, as across requests. Per shard: the fixed-K references (vectorised), the clairvoyant oracle, the
informed oracle and every controller; only the per-request totals are kept (a few numbers per request), never the
columns. The rows carry the harness's figures (:func:`specgym.eval.metrics.figures`), without bootstrap CIs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specgym.agents.specs import EVAL_KINDS, Resolution, lookup, parse, resolve
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.kinds import kind_row
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.dataset import iter_workload_shards
from specgym.envs.workloads.trace_format import SPLITS
from specgym.errors import SpecgymError
from specgym.eval.metrics import figures, oracle_figures
from specgym.eval.references import INFORMED, References, references
from specgym.eval.runner import RunResult, concat_runs, grouped_notes, run_controller


def evaluate_streaming(workload: str | Path, controllers: str = "all", split: str = "all", seed: int = 0,
                       k_max: int = DEFAULT_K_MAX, profile: str | CostProfile | None = None,
                       on_shard: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Evaluate ``controllers`` on a workload (dataset folder or single file) one shard at a time.

    Args:
        workload: A dataset folder (:mod:`specgym.envs.workloads.dataset`) or a single-file workload.
        controllers: Comma-separated chain controller specs (as ``specgym eval``; ``all`` means what it means
            for the workload, judged on its first shard; tree controllers need the whole workload and are
            refused).
        split: ``train``/``val``/``test`` or ``all``.
        seed: Seed of the common random numbers.
        k_max: Largest draft cap.
        profile: Cost profile override; default the workload's own.
        on_shard: Called with ``(shard_index, requests_done)`` after each shard.

    Returns:
        ``{"workload", "split", "seed", "k_max", "requests", "tokens", "shards", "reference", "oracle",
        "informed_oracle", "rows", "per_request_time_ms"}``.
    """
    if split not in (*SPLITS, "all"):
        raise SpecgymError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)} or all")
    kinds = {s: lookup(s, EVAL_KINDS, k_max)[2].kind for s in parse(controllers) if s.lower() != "all"}
    others = [s for s, k in kinds.items() if not kind_row(k).streams]
    if others:
        what = " and ".join(sorted({kind_row(kinds[s]).label for s in others}))
        raise SpecgymError(f"--stream: {what} controllers ({', '.join(others)}) need the whole workload; evaluate "
                           f"them without --stream")
    shard_iter = iter_workload_shards(workload)
    first = next(shard_iter, None)
    named: Resolution = resolve(controllers, k_max, first, kinds=("chain",))
    prof = profile if isinstance(profile, CostProfile) else load_profile(profile) if profile else None
    parts: list[References] = []
    runs: dict[str, list[RunResult]] = {row.spec: [] for row in named}
    name = label = None
    shards = done = 0
    for i, wl in enumerate(itertools.chain([first] if first is not None else [], shard_iter)):
        shards += 1
        name, label = name or wl.name, label or wl.label
        engine = TraceEngine(wl, prof or wl.profile, k_max, seed=seed)
        req = np.arange(wl.n_requests) if split == "all" else np.flatnonzero(wl.split == split)
        if len(req):
            refs = references(engine, req)
            parts.append(refs)
            for row in named:
                runs[row.spec].append(run_controller(engine, req, row.controller, fixed=refs))
            done += len(req)
        if on_shard is not None:
            on_shard(i, done)
    if done == 0:
        raise SpecgymError(f"workload {name!r} has no requests in split {split!r}")
    refs = References.concat(parts)
    results = [concat_runs(row.spec, runs[row.spec]) for row in named]
    notes = grouped_notes(r for parts_ in runs.values() for r in parts_)
    rows = [dict(figures(r, refs).to_dict(), spec=row.spec, kind=row.kind, family=row.family)
            for r, row in zip(results, named)]
    rows.sort(key=lambda row: -row["throughput_tok_s"])
    informed_row = dict(figures(refs.informed, refs).to_dict(), spec=INFORMED,
                        expected_time_ms=refs.informed_expected_ms)
    per_request = {row.spec: r.time_ms for row, r in zip(named, results)}
    per_request.update({f"fixed:{k}": r.time_ms for k, r in refs.fixed.items()})
    per_request["oracle"] = refs.oracle_ms
    per_request[INFORMED] = refs.informed.time_ms
    tokens, best_k = refs.tokens, refs.best_k
    return {
        "workload": {"name": name, "label": label, "path": str(workload), "split": split, "shards": shards},
        "seed": seed, "k_max": k_max, "requests": done, "tokens": tokens,
        "reference": {"t_ar_ms": refs.t_ar_ms, "best_fixed_k": best_k,
                      "fixed_time_ms": {str(k): refs.t_fixed(k) for k in refs.fixed}},
        "oracle": oracle_figures(refs).to_dict(),
        "informed_oracle": informed_row,
        "rows": rows,
        "left_out": named.notes,
        "notes": notes,
        "per_request_time_ms": per_request,
    }

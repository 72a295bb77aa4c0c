"""Evaluation of a sharded workload in memory bounded by one shard (``specgym eval --stream``, the scale bench).

The replay engine's common random numbers are a function of (seed, request id) only
(:func:`~specgym.envs.engines.trace_engine.request_uniforms`), and requests are independent, so replaying a
workload shard by shard gives every request exactly the draws, rounds and time of the in-memory evaluation
(:func:`specgym.eval.harness.evaluate`); controllers are served the requests in the same order and keep their state
across shards, as across requests. Per shard: the fixed-K references (vectorised), the clairvoyant oracle, the
informed oracle and every controller; only the per-request totals are kept (a few numbers per request), never the
columns. The rows carry the harness's metrics (:func:`specgym.eval.metrics.run_metrics`), without bootstrap CIs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specgym.baselines.fixed import FixedK
from specgym.baselines.informed_oracle import informed_plan
from specgym.baselines.oracle import oracle_times
from specgym.agents.registry import expand_specs, make_controller
from specgym.agents.tree_registry import is_tree_spec
from specgym.envs.core.controller import Controller
from specgym.envs.core.cost import CostProfile, load_profile
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.trace_engine import TraceEngine
from specgym.envs.workloads.dataset import iter_workload_shards
from specgym.envs.workloads.trace_format import SPLITS
from specgym.errors import SpecgymError
from specgym.eval.metrics import run_metrics
from specgym.eval.runner import RunResult, run_controller, run_fixed_vectorised, run_plan_vectorised

INFORMED = "oracle:informed"
DEFAULT_CONTROLLERS = "marginal," + ",".join(f"fixed:{k}" for k in range(1, 9))
_FIELDS = ("tokens", "time_ms", "rounds", "drafted", "accepted")


def _concat(name: str, parts: list[RunResult]) -> RunResult:
    """One run over every shard (requests numbered in serving order over the whole workload)."""
    cols: dict[str, Any] = {f: np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS}
    return RunResult(name, np.arange(len(cols["tokens"])), **cols)


def _renamed(run: RunResult, name: str) -> RunResult:
    return RunResult(name, run.requests, run.tokens, run.time_ms, run.rounds, run.drafted, run.accepted)


def evaluate_streaming(workload: str | Path, controllers: str = DEFAULT_CONTROLLERS, split: str = "all", seed: int = 0,
                       k_max: int = DEFAULT_K_MAX, profile: str | CostProfile | None = None,
                       on_shard: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Evaluate ``controllers`` on a workload (dataset folder or single file) one shard at a time.

    Args:
        workload: A dataset folder (:mod:`specgym.envs.workloads.dataset`) or a single-file workload.
        controllers: Comma-separated chain controller specs (as ``specgym eval``; tree controllers need the whole
            workload and are refused).
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
    trees = [s.strip() for s in controllers.split(",") if is_tree_spec(s.strip())]
    if trees:
        raise SpecgymError(f"--stream: tree controllers ({', '.join(trees)}) need the whole workload; evaluate them "
                           f"without --stream")
    specs = expand_specs(controllers, k_max)
    named: list[tuple[str, Controller]] = [(s, make_controller(s, k_max)) for s in specs]
    prof = profile if isinstance(profile, CostProfile) else load_profile(profile) if profile else None
    fixed: dict[int, list[RunResult]] = {k: [] for k in range(k_max + 1)}
    runs: dict[str, list[RunResult]] = {s: [] for s, _ in named}
    oracle_parts: list[np.ndarray] = []
    informed_parts: list[RunResult] = []
    expected_ms = 0.0
    name = label = None
    shards = done = 0
    for i, wl in enumerate(iter_workload_shards(workload)):
        shards += 1
        name, label = name or wl.name, label or wl.label
        engine = TraceEngine(wl, prof or wl.profile, k_max, seed=seed)
        req = np.arange(wl.n_requests) if split == "all" else np.flatnonzero(wl.split == split)
        if len(req):
            for k in fixed:
                fixed[k].append(run_fixed_vectorised(engine, req, k))
            sub = wl if split == "all" else wl.subset(req)
            all_runs = engine.all_runs()
            sub_runs = all_runs if split == "all" else np.concatenate([all_runs[wl.span(r)] for r in req.tolist()])
            oracle_parts.append(oracle_times(sub_runs, sub.offsets, engine.round_times, k_max))
            plan = informed_plan(sub.p_accept, sub.offsets, engine.round_times, k_max)
            informed_parts.append(run_plan_vectorised(engine, req, plan.choice, sub.offsets, INFORMED))
            expected_ms += float(plan.expected_ms.sum())
            for spec, ctrl in named:
                if not isinstance(ctrl, FixedK):  # fixed K: the references above are the same run
                    runs[spec].append(run_controller(engine, req, ctrl))
            done += len(req)
        if on_shard is not None:
            on_shard(i, done)
    if done == 0:
        raise SpecgymError(f"workload {name!r} has no requests in split {split!r}")
    fixed_runs = {k: _concat(f"fixed:{k}", v) for k, v in fixed.items()}
    t_fixed = {k: float(r.time_ms.sum()) for k, r in fixed_runs.items()}
    best_k = min(range(1, k_max + 1), key=lambda k: t_fixed[k])
    t_oracle_req = np.concatenate(oracle_parts)
    t_oracle = float(t_oracle_req.sum())
    informed = _concat(INFORMED, informed_parts)
    t_informed = float(informed.time_ms.sum())
    t_ar = float(engine.t_ar)
    t_k4 = t_fixed[min(4, k_max)]
    results = [_concat(s, runs[s]) if not isinstance(c, FixedK) else _renamed(fixed_runs[min(c.k, k_max)], s)
               for s, c in named]
    rows = [run_metrics(r, t_ar, t_k4, t_fixed[best_k], t_oracle, t_informed) for r in results]
    for row, (spec, _) in zip(rows, named):
        row["spec"] = spec
    rows.sort(key=lambda row: -row["throughput_tok_s"])
    tokens = int(fixed_runs[1].tokens.sum())
    informed_row = run_metrics(informed, t_ar, t_k4, t_fixed[best_k], t_oracle, t_informed)
    informed_row.update(spec=INFORMED, expected_time_ms=expected_ms)
    per_request = {s: r.time_ms for (s, _), r in zip(named, results)}
    per_request.update({f"fixed:{k}": r.time_ms for k, r in fixed_runs.items()})
    per_request["oracle"] = t_oracle_req
    per_request[INFORMED] = informed.time_ms
    return {
        "workload": {"name": name, "label": label, "path": str(workload), "split": split, "shards": shards},
        "seed": seed, "k_max": k_max, "requests": done, "tokens": tokens,
        "reference": {"t_ar_ms": t_ar, "best_fixed_k": best_k,
                      "fixed_time_ms": {str(k): v for k, v in t_fixed.items()}},
        "oracle": {"controller": "oracle", "total_time_ms": t_oracle, "throughput_tok_s": tokens / t_oracle * 1000.0,
                   "speedup_vs_best_fixed": t_fixed[best_k] / t_oracle},
        "informed_oracle": informed_row,
        "rows": rows,
        "per_request_time_ms": per_request,
    }

"""The evaluation harness: every controller on the same requests with the same random numbers, plus the oracles.

``evaluate`` replays each controller over one split of a workload (common random numbers from one seed), always
computes the fixed-K references (K = 1..k_max, vectorised), the clairvoyant oracle (knows the draws) and the
informed oracle (knows each position's acceptance probability, never the draws; played with the same draws), splits
the headroom between them (*chance* and *prediction + decision*), and returns a JSON-ready report with
everything needed to reproduce any row: workload (name, path, sha256, synthetic or recorded), cost profile,
seeds, k_max and the package version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.version import __version__
from specgym.agents.predicted_marginal import planned_ready, predictors_for
from specgym.baselines.informed_oracle import informed_plan
from specgym.baselines.oracle import oracle_plan, oracle_times
from specgym.agents.registry import expand_specs, make_controller
from specgym.baselines.tree_static import StaticTree
from specgym.agents.tree_registry import TREE_ALL, TREE_ORACLE, is_tree_spec, make_tree_controller
from specgym.envs.core.controller import Controller
from specgym.envs.core.cost import CostProfile, load_profile
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.core.tree import TreeController
from specgym.envs.engines.tree_engine import TreeEngine, check_tree_workload
from specgym.envs.engines.trace_engine import TraceEngine
from specgym.envs.workloads.trace_format import Workload, cached_workload
import specgym.catalogue as catalogue
from specgym.eval.metrics import category_metrics, headroom_closed, run_metrics
from specgym.eval.runner import RunResult, run_controller, run_fixed_vectorised, run_plan_vectorised
from specgym.eval.stats import PairedBootstrap
from specgym.eval.tree_runner import run_tree_controller, run_tree_oracle
from specgym.errors import SpecgymError
from specgym.io import sha256_file


Specs = str | Sequence[str | Controller | TreeController | tuple[str, Controller | TreeController | None]]

INFORMED = "oracle:informed"  # the informed oracle's row name (the clairvoyant one's is "oracle")


@dataclass
class EvalConfig:
    """What to evaluate.

    Attributes:
        workload: Shipped workload name or path (or a loaded :class:`Workload`).
        controllers: Comma-separated controller specs (``all`` = every baseline + fixed:1..k_max), or a sequence
            of specs and :class:`Controller` objects (an in-memory policy, a controller of your own).
        split: Request split (``test`` by default; ``all`` for every request).
        seed: Seed of the common random numbers.
        k_max: Largest draft cap.
        profile: Cost profile override (name, path or object); default the workload's own.
        max_requests: Evaluate only the first N requests of the split (None = all).
        bootstrap: Bootstrap resamples for the paired 95% confidence intervals of every ratio (0 = none).
        per_request: Also return every controller's per-request times (``report["per_request_time_ms"]``).
    """

    workload: str | Workload
    controllers: Specs = "all"
    split: str = "test"
    seed: int = 0
    k_max: int = DEFAULT_K_MAX
    profile: str | CostProfile | None = None
    max_requests: int | None = None
    bootstrap: int = 2000
    per_request: bool = False


def tree_replayable(workload: Workload | None) -> bool:
    """True when ``workload`` can be tree-replayed (greedy, with ranks): ``all`` then brings the tree rows."""
    if workload is None:
        return False
    try:
        check_tree_workload(workload)
    except SpecgymError:
        return False
    return True


def _tree_specs(item: str, workload: Workload | None) -> tuple[str, list[str]]:
    """Split a comma-separated spec list into the chain part and the tree specs (``all`` adds :data:`TREE_ALL`
    and ``tree-predicted`` over the pair's shipped predictors when the workload carries ranks)."""
    parts = [p.strip() for p in item.split(",") if p.strip()]
    trees = [p for p in parts if is_tree_spec(p)]
    if any(p.lower() == "all" for p in parts) and tree_replayable(workload):
        extra = [f"tree-predicted:{name}" for name in predictors_for(workload)]
        trees += [t for t in (*TREE_ALL, *extra) if t not in trees]
    return ",".join(p for p in parts if not is_tree_spec(p)), trees


def resolve_controllers(specs: Specs, k_max: int, workload: Workload | None = None,
                        ) -> list[tuple[str, Controller | TreeController | None]]:
    """``(label, controller)`` pairs; specs are validated (and built) before any replay starts. With ``workload``,
    ``all`` also brings the shipped acceptance predictors of its pair (:func:`predictors_for`) and, when the trace
    carries ranks (greedy), the tree baselines (names starting with ``tree``; ``tree-oracle`` pairs with ``None``:
    it is a plan, not a controller)."""
    extra = tuple(f"{kind}:{name}" for name in predictors_for(workload) for kind in ("predicted", "planned")
                  if kind == "predicted" or planned_ready(name)) if workload is not None else ()
    items = [specs] if isinstance(specs, str) else list(specs)
    out: list[tuple[str, Controller | TreeController | None]] = []
    for item in items:
        if isinstance(item, (Controller, TreeController)):
            out.append((item.name, item))
        elif isinstance(item, tuple):  # an already resolved (label, controller) pair
            out.append(item)
        else:
            chain, trees = _tree_specs(item, workload)
            if chain or not trees:
                out += [(s, make_controller(s, k_max)) for s in expand_specs(chain, k_max, extra)]
            out += [(t, None if t == TREE_ORACLE else make_tree_controller(t, k_max)) for t in trees]
    return out


def _traced_requests(wl: Workload, requests: np.ndarray) -> dict[str, int]:
    """The first request of each category in serving order (the K-over-time plot)."""
    out: dict[str, int] = {}
    for r in requests.tolist():
        out.setdefault(str(wl.category[r]), r)
    return out


def evaluate(cfg: EvalConfig, progress: Callable[[str, int], Callable[[], None]] | None = None) -> dict[str, Any]:
    """Run the evaluation; returns the report dict (see :func:`specgym.eval.report.write_report`).

    Args:
        cfg: What to evaluate.
        progress: ``progress(controller_name, n_requests)`` returns a per-request callback (progress bars).
    """
    if isinstance(cfg.workload, Workload):
        wl, wl_path, wl_hash = cfg.workload, None, None
    else:
        path = catalogue.resolve("workload", cfg.workload)
        wl, wl_path = cached_workload(path), str(path)
        wl_hash = sha256_file(path if path.is_file() else path / "workload.json")  # a sharded one: its record
    named = resolve_controllers(cfg.controllers, cfg.k_max, wl)  # fail fast on bad specs
    specs = [label for label, _ in named]
    profile: CostProfile = (cfg.profile if isinstance(cfg.profile, CostProfile)
                            else load_profile(cfg.profile) if cfg.profile else wl.profile)
    engine = TraceEngine(wl, profile, cfg.k_max, seed=cfg.seed)
    requests = wl.split_indices(cfg.split)
    if cfg.max_requests is not None:
        if cfg.max_requests < 1:
            raise SpecgymError(f"max_requests must be >= 1, got {cfg.max_requests}")
        requests = requests[: cfg.max_requests]
    if len(requests) == 0:
        raise SpecgymError(f"workload {wl.name!r} has no requests in split {cfg.split!r}")
    traced = _traced_requests(wl, requests)
    categories = wl.category[requests]

    fixed = {k: run_fixed_vectorised(engine, requests, k) for k in range(0, cfg.k_max + 1)}
    t_fixed = {k: float(r.time_ms.sum()) for k, r in fixed.items()}
    best_k = min(range(1, cfg.k_max + 1), key=lambda k: t_fixed[k])
    t_k4 = t_fixed[min(4, cfg.k_max)]
    runs = engine.all_runs()
    sub = wl.subset(requests)
    sub_runs = np.concatenate([runs[wl.span(r)] for r in requests.tolist()])
    t_oracle_req = oracle_times(sub_runs, sub.offsets, engine.round_times, cfg.k_max)
    t_oracle = float(t_oracle_req.sum())
    plan = informed_plan(sub.p_accept, sub.offsets, engine.round_times, cfg.k_max)
    informed = run_plan_vectorised(engine, requests, plan.choice, sub.offsets, INFORMED)
    t_informed = float(informed.time_ms.sum())
    t_ar = engine.t_ar

    results: list[RunResult] = []
    tree_engine: TreeEngine | None = None
    for spec, ctrl in named:
        tick = progress(spec, len(requests)) if progress else None
        if isinstance(ctrl, Controller):
            trace = () if spec.startswith("fixed:") else traced.values()
            results.append(run_controller(engine, requests, ctrl, trace=trace, on_request=tick))
            continue
        if tree_engine is None:  # refuses v1 and sampled traces with one line
            tree_engine = TreeEngine(wl, profile, cfg.k_max)
        if ctrl is None:
            results.append(run_tree_oracle(tree_engine, requests, spec))
        else:
            ctrl.prepare(wl, profile)
            results.append(run_tree_controller(tree_engine, requests, ctrl))
        if tick is not None:
            for _ in requests:
                tick()

    rows = [run_metrics(r, t_ar, t_k4, t_fixed[best_k], t_oracle, t_informed) for r in results]
    boot = PairedBootstrap(len(requests), cfg.bootstrap, seed=0)  # fixed: reports are reproducible
    refs = {"speedup_vs_ar": sub.lengths * t_ar, "speedup_vs_k4": fixed[min(4, cfg.k_max)].time_ms,
            "speedup_vs_best_fixed": fixed[best_k].time_ms, "oracle_ratio": t_oracle_req,
            "informed_ratio": informed.time_ms}
    static = [(float(r.time_ms.sum()), r) for r, (_, c) in zip(results, named) if isinstance(c, StaticTree)]
    best_static = min(static, key=lambda x: x[0])[1] if static else None
    if best_static is not None:  # the fastest exact static tree (Sequoia's included): every row's paired ratio
        refs["speedup_vs_best_static_tree"] = best_static.time_ms
    for row, r, (spec, ctrl) in zip(rows, results, named):
        if best_static is not None:
            row["speedup_vs_best_static_tree"] = float(best_static.time_ms.sum() / r.time_ms.sum())
        row["spec"] = spec
        row["token_level"] = bool(getattr(ctrl, "token_level", False))
        if not isinstance(ctrl, Controller):
            row["tree"] = True
            row["approximate"] = bool(getattr(ctrl, "approximate", False))
        row["categories"] = category_metrics(r, categories)
        row["ci95"] = {key: boot.ratio_ci(ref, r.time_ms) for key, ref in refs.items()}
    rows.sort(key=lambda row: -row["throughput_tok_s"])
    informed_row = run_metrics(informed, t_ar, t_k4, t_fixed[best_k], t_oracle, t_informed)
    informed_row.update(spec=INFORMED, token_level=False, categories=category_metrics(informed, categories),
                        expected_time_ms=float(plan.expected_ms.sum()),
                        ci95={key: boot.ratio_ci(ref, informed.time_ms) for key, ref in refs.items()})
    n_tokens = int(sub.n_positions)
    oracle_row = {
        "controller": "oracle",
        "throughput_tok_s": n_tokens / t_oracle * 1000.0,
        "speedup_vs_ar": n_tokens * t_ar / t_oracle,
        "speedup_vs_k4": t_k4 / t_oracle,
        "speedup_vs_best_fixed": t_fixed[best_k] / t_oracle,
        "oracle_ratio": 1.0,
        "tpot_ms_mean": float((t_oracle_req / sub.lengths).mean()),
        "tpot_ms_p99": float(np.percentile(t_oracle_req / sub.lengths, 99)),
        "total_time_ms": t_oracle,
        "tokens": n_tokens,
    }
    traces = {}
    served = {r: m for m, r in enumerate(requests.tolist())}  # workload index -> index in `sub`
    for cat, req in traced.items():
        traces[cat] = {
            "request_id": str(wl.request_id[req]),
            "length": int(wl.lengths[req]),
            "oracle": _oracle_trace(runs[wl.span(req)], engine, cfg.k_max),
            "informed": _plan_trace(runs[wl.span(req)], plan.choice[sub.span(served[req])]),
            "controllers": {res.name: res.traces[req] for res in results if req in res.traces},
        }
    p_accept_by_cat = {
        cat: float(sub.p_accept[np.repeat(categories == cat, sub.lengths)].mean())
        for cat in dict.fromkeys(categories.tolist())
    }
    report: dict[str, Any] = {
        "specgym_version": __version__,
        "workload": {
            "name": wl.name, "label": wl.label, "synthetic": wl.is_synthetic, "path": wl_path, "sha256": wl_hash,
            "source": wl.source, "split": cfg.split, "requests": int(len(requests)), "tokens": n_tokens,
            "mean_p_accept_by_category": p_accept_by_cat,
        },
        "profile": profile.to_dict(),
        "seed": cfg.seed,
        "k_max": cfg.k_max,
        "controllers": specs,
        "best_static_tree": best_static.name if best_static is not None else None,
        "max_requests": cfg.max_requests,
        "reference": {"t_ar_ms": t_ar, "best_fixed_k": best_k,
                      "fixed_time_ms": {str(k): v for k, v in t_fixed.items()}},
        "oracle": oracle_row,
        "informed_oracle": informed_row,
        "headroom": headroom_split(n_tokens, t_fixed[best_k], t_informed, t_oracle),
        "rows": rows,
        "traces": traces,
    }
    report["bootstrap"] = {"resamples": cfg.bootstrap, "level": 0.95, "seed": 0, "unit": "request"}
    if cfg.per_request:
        report["per_request_time_ms"] = {spec: res.time_ms for (spec, _), res in zip(named, results)}
        report["per_request_time_ms"].update({f"fixed:{k}": f.time_ms for k, f in fixed.items()})
        report["per_request_time_ms"]["oracle"] = t_oracle_req
        report["per_request_time_ms"][INFORMED] = informed.time_ms
    return report


def headroom_split(tokens: int, t_best_fixed: float, t_informed: float, t_oracle: float) -> dict[str, Any]:
    """The headroom above the best fixed K, split at the informed oracle (throughputs in tok/s).

    *chance* = clairvoyant - informed: what knowing the draws adds, which no controller that has to predict can
    remove; *removable* = informed - best fixed K: what prediction + decision can gain. ``chance_share`` is the
    chance part of the best-fixed-to-clairvoyant headroom in time (the unit of ``headroom_closed``).
    """
    tps = {name: tokens / t * 1000.0 for name, t in (("best_fixed", t_best_fixed), ("informed", t_informed),
                                                     ("clairvoyant", t_oracle))}
    closed = headroom_closed(t_best_fixed, t_informed, t_oracle)  # the informed oracle's own share
    return {
        "best_fixed_tok_s": tps["best_fixed"], "informed_tok_s": tps["informed"],
        "clairvoyant_tok_s": tps["clairvoyant"],
        "chance_tok_s": tps["clairvoyant"] - tps["informed"],
        "removable_tok_s": tps["informed"] - tps["best_fixed"],
        "chance_share": None if closed is None else 1.0 - closed,
    }


def _oracle_trace(run: np.ndarray, engine: TraceEngine, k_max: int) -> list[tuple[int, int, int, int]]:
    """The oracle's rounds on one request: (position, K, drafted, accepted)."""
    plan = oracle_plan(run, engine.round_times, k_max)
    out, i = [], 0
    for k in plan:
        acc = min(int(run[i]), k)
        out.append((i, k, k, acc))
        i += acc + 1
    return out


def _plan_trace(run: np.ndarray, choice: np.ndarray) -> list[tuple[int, int, int, int]]:
    """The informed oracle's rounds on one request under the replayed draws: (position, K, drafted, accepted)."""
    out, i = [], 0
    while i < len(run):
        k = int(choice[i])
        acc = min(int(run[i]), k)
        out.append((i, k, k, acc))
        i += acc + 1
    return out

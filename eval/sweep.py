"""Serving sweep: batch controllers across concurrencies, against the best fixed K at each (closed loop, paired CIs).

At each concurrency ``c`` a replication draws ``max(3c, 24)`` requests of the workload (a seed per concurrency and
replication draws them and the acceptance draws) and serves them in a closed loop with every controller, every
static K in ``0..k_max`` and the clairvoyant oracle. The figure is the **steady-state** throughput: tokens per second
up to the step in which the last request entered (after it the batch drains, a tail no serving engine has). The
best fixed K at ``c`` is the static K with the most tokens/s summed over the replications (in hindsight); every
ratio is paired across replications (:class:`~specgym.eval.stats.PairedBootstrap`, 95% percentile interval). Each
row also carries the median TPOT of the requests finished in the window (mean over replications).

The **clairvoyant oracle** (``oracle-clairvoyant``, replay only) reads the replay's runs: each step every request
verifies (and drafts) exactly the drafts that will be accepted, up to ``k_max``: no verified token is wasted. Its
ratio to the best fixed K is the cell's headroom. It is a clairvoyant *greedy* reference, not a bound: where each
draft position costs a forward of its own (a grid profile, drafting on a CPU), skipping some accepted tokens can
pay, and an allocator may beat it. Under switch costs
it drafts ``k_max`` every step (one tier, never switching; verification still exact).

The **request-rates oracle** (``oracle-request-rates``, replay only) is specgym's allocator told, in hindsight, each
request's own acceptance by position (``P(run >= j + 1 | run >= j)`` over all its starts): what knowing every
request's acceptance profile, but none of its steps, is worth. Its ratio is the cell's ``request_rates_headroom``.

Controllers that take the engine's switch costs (an attribute ``switch_costs``, specgym's allocator) are told them.
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specgym.agents.specs import Resolved, resolve
from specgym.baselines.acceptance_estimators import AcceptanceEstimator
from specgym.baselines.budget_allocator import BudgetAllocator
from specgym.envs.core.batch import BatchController, BatchDecision, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.switching import SwitchCosts
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.workloads.trace_format import Workload
from specgym.eval.stats import PairedBootstrap
from specgym.io import atomic_write_bytes

ORACLE = "oracle-clairvoyant"
REQUEST_ORACLE = "oracle-request-rates"
SCHEMA = "specgym-serving-sweep/1"


class ClairvoyantBudget(BatchController):
    """Verifies exactly the drafts each request will have accepted (reads the replay: an oracle, replay only)."""

    name = ORACLE
    family = "oracle"

    def __init__(self, replay: BatchReplay):
        self.replay = replay

    def propose(self, state: BatchState) -> BatchDecision:
        sim = self.replay
        v = np.minimum(sim.runs[sim.pos[state.slots]], self.k_max)
        # under switch costs: one tier, k_max drafted every step (an oracle of verification only)
        return BatchDecision(v, v if sim.switch is None else self.k_max)


class RequestRates(AcceptanceEstimator):
    """Each request's own acceptance by position in hindsight: ``P(run >= j + 1 | run >= j)`` over all of its starts
    (reads the replay; knows every request's acceptance profile, none of its steps)."""

    name = "request-rates"

    def __init__(self, replay: BatchReplay):
        self.replay = replay

    def reset(self, slots: int, width: int) -> None:
        super().reset(slots, width)
        sim = self.replay
        self.table = np.zeros((len(sim.requests), width))
        j = np.arange(width)
        for r in range(len(sim.requests)):
            runs = np.minimum(sim.runs[sim.start[r]:sim.end[r]], width)
            reach = (runs[:, None] >= j).sum(axis=0)
            self.table[r] = np.where(reach > 0, (runs[:, None] >= j + 1).sum(axis=0) / np.maximum(reach, 1), 0.0)

    def confidences(self, slots: np.ndarray) -> np.ndarray:
        return self.table[self.replay.slot_req[slots]]

    def update(self, step: BatchStep) -> None:
        pass


def steady_throughput(sim: BatchReplay, ctrl: BatchController) -> float:
    """Serve until the last request entered; tokens per second up to then."""
    ctrl.reset(sim.profile, sim.k_max)
    n = len(sim.requests)
    while sim.next_req < n and not sim.done:
        ctrl.observe(sim.step(ctrl.propose(sim.state())))
    return sim.tokens / sim.now_ms * 1000.0


def median_tpot_ms(sim: BatchReplay) -> float:
    """Median TPOT of the requests that finished (in the steady-state window)."""
    tpot = sim.tpot_ms()
    done = tpot[np.isfinite(tpot)]
    return float(np.median(done)) if len(done) else float("nan")


def sweep(workload: Workload, profile: BatchCostProfile, concurrencies: Sequence[int],
          specs: Sequence[str | BatchController | Resolved], replications: int = 5, k_max: int = 12,
          split: str = "all", seed: int = 0, switch_costs: SwitchCosts | None = None,
          progress: Any = None, capture_sizes: Sequence[int] | None = None) -> dict[str, Any]:
    """Every controller at every concurrency against the best fixed K there (module docstring)."""
    pool = workload.split_indices(split)
    named = [(r.spec, r.controller) for r in resolve(specs, k_max, workload, kinds=("batch",))
             if r.family != "fixed"]  # the static K rows are the reference, run separately
    signals: dict[str, np.ndarray | None] = {}  # the draft view an estimator reads (a predictor's probabilities)
    for name, ctrl in named:
        if hasattr(ctrl, "switch_costs"):  # a controller that prices tier switches is told the engine's
            ctrl.switch_costs = switch_costs
        fn = getattr(getattr(ctrl, "estimator", None), "workload_signal", None)
        signals[name] = fn(workload) if fn is not None else None
    statics = [f"static:{k}" for k in range(k_max + 1)]
    rows: list[dict[str, Any]] = []
    cells: dict[str, Any] = {}
    boot = PairedBootstrap(replications, 2000, seed=0)
    t_start = time.perf_counter()
    for c in concurrencies:
        thr: dict[str, list[float]] = {s: [] for s in [*statics, *(n for n, _ in named), ORACLE, REQUEST_ORACLE]}
        tpot: dict[str, list[float]] = {s: [] for s in thr}
        for rep in range(replications):
            rng = np.random.default_rng([seed, int(c), rep])
            size = min(max(3 * int(c), 24), len(pool))
            reqs = rng.choice(pool, size=size, replace=False)
            oseed = int(rng.integers(2**31))

            def replay(signal: np.ndarray | None = None) -> BatchReplay:
                return BatchReplay(workload, profile, int(c), requests=reqs, k_max=k_max, seed=oseed,
                                   switch_costs=switch_costs, draft_signal=signal, capture_sizes=capture_sizes)

            for k in range(k_max + 1):
                sim = replay()
                thr[f"static:{k}"].append(steady_throughput(sim, _Static(k)))
                tpot[f"static:{k}"].append(median_tpot_ms(sim))
            for name, ctrl in named:
                sim = replay(signals[name])
                thr[name].append(steady_throughput(sim, ctrl))
                tpot[name].append(median_tpot_ms(sim))
            sim = replay()
            thr[ORACLE].append(steady_throughput(sim, ClairvoyantBudget(sim)))
            tpot[ORACLE].append(median_tpot_ms(sim))
            sim = replay()
            thr[REQUEST_ORACLE].append(steady_throughput(sim, BudgetAllocator(RequestRates(sim), switch_costs)))
            tpot[REQUEST_ORACLE].append(median_tpot_ms(sim))
            if progress is not None:
                progress(c, rep)
        arr = {s: np.asarray(v) for s, v in thr.items()}
        best_k = int(np.argmax([arr[s].sum() for s in statics]))
        best = arr[f"static:{best_k}"]
        cells[str(c)] = {"best_fixed_k": best_k, "best_fixed_tok_s": float(best.mean()),
                         "oracle_headroom": float(arr[ORACLE].sum() / best.sum()),
                         "request_rates_headroom": float(arr[REQUEST_ORACLE].sum() / best.sum()),
                         "per_replication_tok_s": {s: v for s, v in thr.items()}}
        for s in [f"best-fixed:{best_k}", *(n for n, _ in named), ORACLE, REQUEST_ORACLE]:
            v = best if s.startswith("best-fixed") else arr[s]
            key = f"static:{best_k}" if s.startswith("best-fixed") else s
            ci = boot.ratio_ci(v, best) if s != f"best-fixed:{best_k}" else (1.0, 1.0)
            rows.append({"controller": s, "concurrency": int(c), "tok_s": float(v.mean()),
                         "vs_best_fixed": float(v.sum() / best.sum()),
                         "ci95_low": float(ci[0]) if ci else None, "ci95_high": float(ci[1]) if ci else None,
                         "wins_vs_best_fixed": int((v > best).sum()), "best_fixed_k": best_k,
                         "tpot_ms_median": float(np.nanmean(tpot[key]))})
    return {"schema": SCHEMA, "workload": workload.name, "synthetic": workload.is_synthetic,
            "profile": profile.name, "concurrencies": [int(c) for c in concurrencies],
            "controllers": [n for n, _ in named], "replications": replications, "k_max": k_max,
            "switch_costs": None if switch_costs is None else switch_costs.__dict__.copy(),
            "capture_sizes": None if capture_sizes is None else [int(x) for x in capture_sizes],
            "measure": "closed loop, steady state (until the last request entered), tokens/s",
            "rows": rows, "cells": cells, "seconds": time.perf_counter() - t_start}


class _Static(BatchController):
    def __init__(self, k: int):
        self.k = k
        self.name = f"static:{k}"

    def propose(self, state: BatchState) -> int:
        return self.k


def table_lines(res: dict[str, Any]) -> list[str]:
    """One markdown table: a row per controller, a column per concurrency (ratio to the best fixed K [95% CI])."""
    concs = res["concurrencies"]
    by = {(r["controller"].split(":")[0] if r["controller"].startswith("best-fixed") else r["controller"],
           r["concurrency"]): r for r in res["rows"]}
    names = ["best-fixed", *res["controllers"], ORACLE, REQUEST_ORACLE]
    out = ["| controller | " + " | ".join(f"c={c}" for c in concs) + " |",
           "|---|" + "---:|" * len(concs)]
    for n in names:
        cells = []
        for c in concs:
            r = by[(n, c)]
            if n == "best-fixed":
                cells.append(f"K={r['best_fixed_k']}: {r['tok_s']:.0f} tok/s")
            else:
                lo, hi = r["ci95_low"], r["ci95_high"]
                ci = f" [{lo:.3f}, {hi:.3f}]" if lo is not None else ""
                cells.append(f"{r['vs_best_fixed']:.3f}x{ci}")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out


def plot(res: dict[str, Any], path: Path, overwrite: bool = False) -> Path:
    """Ratio to the best fixed K against concurrency, one line per controller (matplotlib PNG, written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    concs = res["concurrencies"]
    for name in [*res["controllers"], ORACLE, REQUEST_ORACLE]:
        rows = [next(r for r in res["rows"] if r["controller"] == name and r["concurrency"] == c) for c in concs]
        y = [r["vs_best_fixed"] for r in rows]
        line = ax.plot(concs, y, marker="o", label=name, linestyle="--" if name.startswith("oracle") else "-")
        if rows[0]["ci95_low"] is not None:
            ax.fill_between(concs, [r["ci95_low"] for r in rows], [r["ci95_high"] for r in rows], alpha=0.15,
                            color=line[0].get_color())
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (closed loop)")
    ax.set_ylabel("tokens/s vs the best fixed K at that concurrency")
    label = "SYNTHETIC workload" if res["synthetic"] else "replay of published traces"
    ax.set_title(f"{res['workload']} on {res['profile']} ({label})", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue(), overwrite=overwrite)

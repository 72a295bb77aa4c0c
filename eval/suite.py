"""The generalisation suite (``specgym eval --suite generalization``): learned policies on held-out cells.

A cell is a workload never trained on (a recorded workload held out entirely, a recorded workload's test split, or
a synthetic preset regenerated with an unseen seed) priced with a cost profile never used as such in training
(:func:`specgym.envs.workloads.domains.suite_cells`). In every cell every baseline runs, plain decoding (``fixed:0``)
included, and each policy is compared with

* the **best baseline in hindsight** for that cell (the best of them all, chosen after seeing the results), with a
  paired bootstrap 95% interval of the throughput ratio;
* for K-mode policies, the **best K-level baseline in hindsight** (fixed K, ASSC, SpecLane, the transformers
  heuristic, the bandit);
* ``marginal``, the strongest analytic rule, the clairvoyant **oracle** (the share of the best-fixed-K-to-oracle
  headroom closed) and the **informed oracle** (knows p_accept, not the draws: the share of the headroom that
  prediction + decision can remove which the policy closes).

The summary gives the geometric mean of each ratio over the cells and the worst cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specgym.agents.specs import Resolution, Traits, all_specs
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.domains import Cell, cell_workload, suite_cells
from specgym.eval.harness import open_replay, resolve_controllers, run_controllers
from specgym.eval.metrics import figures
from specgym.eval.references import references
from specgym.eval.stats import PairedBootstrap, geomean


def baseline_specs(k_max: int = DEFAULT_K_MAX) -> list[str]:
    """Every baseline of the suite: the chain ``all`` of a workload-independent cell (the literature's rules,
    ``marginal``, fixed K), plus ``speclane:ratio`` and plain decoding (``fixed:0``)."""
    chain, _ = all_specs(Traits.anything(), k_max, ("chain",))
    return list(dict.fromkeys([*chain, "speclane:ratio", *(f"fixed:{k}" for k in range(k_max + 1))]))


def run_suite(policies: Sequence[str], cells: Sequence[Cell] | None = None, k_max: int = DEFAULT_K_MAX,
              bootstrap: int = 2000, progress: Callable[[str], None] | None = None,
              max_requests: int | None = None) -> dict[str, Any]:
    """Evaluate ``policies`` (controller specs) and every baseline on every cell; returns the suite report.

    ``max_requests`` caps the requests of each cell (quick looks; the published suite uses them all).
    """
    cells = list(cells) if cells is not None else suite_cells()
    baselines = baseline_specs(k_max)
    specs = [*baselines, *policies]
    built: Resolution | None = resolve_controllers(",".join(specs), k_max)  # fail fast; serves the first cell
    rows = []
    for cell in cells:
        if progress is not None:
            progress(cell.name)
        replay = open_replay(cell_workload(cell.workload), cell.split, 0, k_max, load_profile(cell.profile),
                             max_requests)
        named, built = built or resolve_controllers(",".join(specs), k_max), None  # fresh controllers per cell
        refs = references(replay.engine, replay.requests)
        runs = run_controllers(replay, named, refs)
        times = {row.spec: run.time_ms for row, run in zip(named, runs)}
        total = {spec: float(t.sum()) for spec, t in times.items()}
        best = min(baselines, key=lambda s: total[s])
        k_level = {row.spec for row in named if not row.token_level and row.family in ("fixed", "rule")}
        best_k_level = min([s for s in baselines if s in k_level], key=lambda s: total[s])
        boot = PairedBootstrap(len(replay.requests), bootstrap, seed=0)
        tok_s = {name: refs.tokens / t * 1000.0 for name, t in (("best", total[best]), ("marginal",
                 total["marginal"]), ("oracle", refs.t_oracle), ("informed", refs.t_informed))}
        row: dict[str, Any] = {
            "cell": cell.name, "workload": cell.workload, "profile": cell.profile, "split": cell.split,
            "synthetic": bool(replay.workload.is_synthetic), "requests": int(len(replay.requests)),
            "best_baseline": best, "best_baseline_tok_s": tok_s["best"],
            "best_k_level_baseline": best_k_level, "marginal_tok_s": tok_s["marginal"],
            "oracle_tok_s": tok_s["oracle"], "informed_oracle_tok_s": tok_s["informed"],
            "policies": {},
        }
        for spec, run in ((row.spec, r) for row, r in zip(named, runs) if row.spec in policies):
            f = figures(run, refs)
            t = f.total_time_ms
            row["policies"][spec] = {
                "tok_s": f.throughput_tok_s,
                "vs_best_baseline": total[best] / t, "vs_best_baseline_ci95": boot.ratio_ci(times[best], times[spec]),
                "vs_best_k_level": total[best_k_level] / t,
                "vs_best_k_level_ci95": boot.ratio_ci(times[best_k_level], times[spec]),
                "vs_marginal": total["marginal"] / t, "vs_marginal_ci95": boot.ratio_ci(times["marginal"],
                                                                                        times[spec]),
                "oracle_ratio": f.oracle_ratio, "headroom_closed": f.headroom_closed,
                "informed_ratio": f.informed_ratio, "headroom_closed_informed": f.headroom_closed_informed,
            }
        rows.append(row)
    summary = {}
    for spec in policies:
        per = [r["policies"][spec] for r in rows]
        summary[spec] = {
            "geomean_vs_best_baseline": geomean([p["vs_best_baseline"] for p in per]),
            "geomean_vs_best_k_level": geomean([p["vs_best_k_level"] for p in per]),
            "geomean_vs_marginal": geomean([p["vs_marginal"] for p in per]),
            "worst_vs_best_baseline": min(p["vs_best_baseline"] for p in per),
            "worst_ci_low_vs_best_baseline": min((p["vs_best_baseline_ci95"] or (math.nan,))[0] for p in per),
            "worst_vs_best_k_level": min(p["vs_best_k_level"] for p in per),
            "cells_at_or_above_best_baseline": sum(p["vs_best_baseline"] >= 1.0 for p in per),
            "mean_headroom_closed": _mean_defined([p["headroom_closed"] for p in per]),
            "mean_headroom_closed_informed": _mean_defined([p["headroom_closed_informed"] for p in per]),
        }
    return {"suite": "generalization", "k_max": k_max, "max_requests": max_requests, "policies": list(policies),
            "baselines": baselines,
            "bootstrap": bootstrap, "cells": rows, "summary": summary}


def _mean_defined(values: list[float | None]) -> float:
    return float(np.mean([v for v in values if v is not None] or [math.nan]))


def markdown(report: dict[str, Any]) -> str:
    """The suite as markdown: one table per policy (a row per cell) and the summary."""
    lines = ["# Generalisation suite", "",
             f"{len(report['cells'])} held-out cells (workload x cost profile never seen in training); every "
             "baseline (plain decoding included) runs in every cell; ratios are throughput ratios (> 1: the policy is "
             "faster) with paired bootstrap 95% intervals over requests; *(synthetic)* marks synthetic workloads.", ""]
    if report.get("max_requests"):
        lines[-1:-1] = ["", f"**Quick look: only the first {report['max_requests']} requests of each cell** "
                            "(`--max-requests`); the published suite uses them all."]
    for spec in report["policies"]:
        s = report["summary"][spec]
        lines += [f"## {spec}", "",
                  f"Geometric mean over cells: **{s['geomean_vs_best_baseline']:.3f}x** the best baseline in "
                  f"hindsight (worst cell {s['worst_vs_best_baseline']:.3f}x, worst interval low "
                  f"{s['worst_ci_low_vs_best_baseline']:.3f}; {s['cells_at_or_above_best_baseline']}/"
                  f"{len(report['cells'])} cells at or above it), {s['geomean_vs_best_k_level']:.3f}x the best "
                  f"K-level baseline, {s['geomean_vs_marginal']:.3f}x marginal; mean oracle headroom closed "
                  f"{s['mean_headroom_closed']:+.1%} (clairvoyant), "
                  f"{s.get('mean_headroom_closed_informed', math.nan):+.1%} (informed).", "",
                  "| cell | best baseline in hindsight | policy tok/s | vs best baseline [95% CI] | vs best K-level | "
                  "vs marginal [95% CI] | oracle ratio | headroom closed | informed oracle tok/s | "
                  "headroom closed (informed) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in report["cells"]:
            p = r["policies"][spec]
            name = r["cell"] + (" *(synthetic)*" if r["synthetic"] else "")
            ci, cm = p["vs_best_baseline_ci95"], p["vs_marginal_ci95"]
            hc = "–" if p["headroom_closed"] is None else f"{p['headroom_closed']:+.1%}"
            hi = "–" if p.get("headroom_closed_informed") is None else f"{p['headroom_closed_informed']:+.1%}"
            it = "–" if r.get("informed_oracle_tok_s") is None else f"{r['informed_oracle_tok_s']:.1f}"
            lines.append(f"| {name} | {r['best_baseline']} ({r['best_baseline_tok_s']:.1f}) | {p['tok_s']:.1f} | "
                         f"{p['vs_best_baseline']:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "") +
                         f" | {p['vs_best_k_level']:.3f}x | {p['vs_marginal']:.3f}x" +
                         (f" [{cm[0]:.3f}, {cm[1]:.3f}]" if cm else "") +
                         f" | {p['oracle_ratio']:.3f} | {hc} | {it} | {hi} |")
        lines.append("")
    return "\n".join(lines)

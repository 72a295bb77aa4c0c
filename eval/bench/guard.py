"""Benchmark section ``guard``: every shipped policy against its teacher, everywhere it can run (target >= 0.98x).

Each shipped chain policy runs on the test split of every shipped workload under every shipped chain cost profile
and the cpu-midpair profile with its verify slope doubled (a steeper machine of the same kind), with ``marginal`` on
the same requests and draws; the figure is the policy's throughput over ``marginal``'s. A cell where the policy is
refused (a predictor-reading policy on another pair's trace) is counted as refused, not as a loss. The guard
(:mod:`specgym.agents.policy_controller`) hands decisions outside a policy's training range to its teacher; the
share handed over is reported per cell.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from rich.table import Table

import specgym.catalogue as catalogue
from specgym.agents.artifact import list_policies
from specgym.envs.core.cost import CostProfile
from specgym.envs.profiles import load_profile
from specgym.errors import SpecgymError
from specgym.eval.harness import open_replay, resolve_controllers, run_controllers
from specgym.eval.references import references

TARGET = 0.98


def steep_verify(profile: CostProfile) -> CostProfile:
    """``profile`` with its verify slope doubled (``verify(n) = verify(1) + 2 (verify(n) - verify(1))``)."""
    v = np.asarray(profile.verify_ms, dtype=np.float64)
    return dataclasses.replace(profile, name=f"{profile.name}-steep", source="synthetic",
                               verify_ms=tuple(float(x) for x in v[0] + 2.0 * (v - v[0])),
                               description=f"{profile.name} with its verify slope doubled")


def guard_cells(policies: list[str], k_max: int = 8) -> list[dict[str, Any]]:
    """One record per (workload, profile, policy): its throughput over ``marginal``'s (None: refused)."""
    profiles = [p for p in (load_profile(n) for n in catalogue.names("profile")) if p.max_k >= k_max]
    profiles.append(steep_verify(load_profile("cpu-midpair")))
    cells: list[dict[str, Any]] = []
    for wl in catalogue.names("workload"):
        for prof in profiles:
            replay = open_replay(wl, "test", 0, k_max, prof)
            refs = references(replay.engine, replay.requests)
            teacher = run_controllers(replay, ["marginal"], refs)[0].time_ms.sum()
            for spec in policies:
                try:
                    (row,) = resolve_controllers([spec], k_max, replay.workload).rows
                    run = run_controllers(replay, [row], refs)[0]
                except SpecgymError as exc:
                    cells.append({"workload": wl, "profile": prof.name, "policy": spec, "vs_marginal": None,
                                  "refused": str(exc)})
                    continue
                stats = row.controller.guard_stats() if hasattr(row.controller, "guard_stats") else None
                cells.append({"workload": wl, "profile": prof.name, "policy": spec,
                              "vs_marginal": float(teacher / run.time_ms.sum()),
                              "handed": None if stats is None else stats["share"]})
    return cells


def guard_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """Every shipped chain policy vs ``marginal`` on every shipped workload x profile (+ steep verify)."""
    policies = [f"ppo:{p}" for p in list_policies(kind="chain")]
    cells = guard_cells(policies)
    rows, figures = [], {}
    for spec in policies:
        mine = [c for c in cells if c["policy"] == spec and c["vs_marginal"] is not None]
        refused = sum(c["policy"] == spec and c["vs_marginal"] is None for c in cells)
        worst = min(mine, key=lambda c: c["vs_marginal"])
        handed = float(np.mean([c["handed"] or 0.0 for c in mine]))
        rows.append((spec, f"{len(mine)} cells ({refused} refused)", f"{worst['vs_marginal']:.3f}x",
                     f"{worst['workload']} / {worst['profile']}", f"{handed:.1%}",
                     "met" if worst["vs_marginal"] >= TARGET else "MISSED"))
        figures[spec] = {"cells": len(mine), "refused": refused, "worst_vs_marginal": worst["vs_marginal"],
                         "worst_cell": f"{worst['workload']}/{worst['profile']}", "mean_handed": handed}
    table = Table(title="shipped policies vs marginal (every shipped workload x profile + steep verify, test splits; "
                        f"target >= {TARGET}x)", header_style="bold")
    for col in ("policy", "cells", "worst", "worst cell", "decisions handed (mean)", "target"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    console.print(table)
    return {"policies": figures, "cells": cells}

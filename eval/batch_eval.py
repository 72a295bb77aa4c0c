"""Batch controllers compared on a mixed-concurrency workload, with paired confidence intervals.

Each replication serves the same requests under the same concurrency schedule (a seed draws the schedule, the
request order and the acceptance draws) with every controller; the figure is each controller's throughput, and a
ratio of two controllers is paired across replications (:class:`~specgym.eval.stats.PairedBootstrap` over
replications, 95% percentile interval).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specgym.agents.specs import Resolved, resolve
from specgym.envs.core.batch import BatchController
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.replay.batch_engine import BatchReplay, mixed_schedule
from specgym.envs.workloads.trace_format import Workload
from specgym.eval.stats import PairedBootstrap


def compare(workload: Workload, profile: BatchCostProfile, specs: Sequence[str | BatchController | Resolved],
            replications: int = 10,
            requests: int = 256, max_batch: int = 256, split: str = "test", k_max: int = DEFAULT_K_MAX,
            seed: int = 0, reference: str | None = None) -> dict[str, Any]:
    """Throughput of every controller in every replication, and paired ratios against ``reference``."""
    pool = workload.split_indices(split)
    named = [(r.spec, r.controller) for r in resolve(specs, k_max, kinds=("batch",))]
    signals = {}  # the draft view an estimator reads (a predictor's probabilities), as in the sweep
    for name, ctrl in named:
        fn = getattr(getattr(ctrl, "estimator", None), "workload_signal", None)
        signals[name] = fn(workload) if fn is not None else None
    names = [n for n, _ in named]
    reference = reference or names[0]
    thr: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(replications):
        rng = np.random.default_rng([seed, rep])
        reqs = rng.choice(pool, size=min(requests, len(pool)), replace=False)
        schedule = mixed_schedule(rng, profile, max_batch)
        outcome_seed = int(rng.integers(2**31))
        for name, ctrl in named:
            sim = BatchReplay(workload, profile, schedule, requests=reqs, k_max=k_max, seed=outcome_seed,
                              draft_signal=signals[name])
            sim.run(ctrl)
            thr[name].append(sim.throughput())
    arr = {s: np.asarray(v) for s, v in thr.items()}
    boot = PairedBootstrap(replications, 2000, seed=0)
    rows = []
    for s in names:
        ci = boot.ratio_ci(arr[s], arr[reference])
        rows.append({"controller": s, "tok_s_mean": float(arr[s].mean()), "vs_reference": float(arr[s].sum() /
                     arr[reference].sum()), "vs_reference_ci95": list(ci) if ci is not None else None,
                     "wins": int((arr[s] > arr[reference]).sum())})
    return {"workload": workload.name, "synthetic": workload.is_synthetic, "profile": profile.name,
            "replications": replications, "requests": requests, "max_batch": max_batch, "reference": reference,
            "rows": rows, "per_replication_tok_s": {s: v for s, v in thr.items()}}

"""Benchmark section ``tree``: steps/s of ``specgym/SpecDecodeTree-v0`` (target >= 20,000).

The tree env needs a greedy trace with ranks (format v2). When the benchmarked workload has none (the shipped v1
workloads), the section runs on a synthetic one with geometric ranks, labelled *(synthetic)*: the env's speed does
not depend on where the ranks came from.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from specgym.agents.traits import Traits
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload, workload_from_requests
from specgym.eval.bench.common import print_table, timeit, versus

TREE_ENV_TARGET = 20_000


def rank_workload(n_requests: int = 200, seed: int = 0) -> Any:
    """A synthetic greedy workload with geometric ranks (P(rank 0) = 0.6) and Dirichlet top-8 rows."""
    rng = np.random.default_rng(seed)
    reqs = []
    for r in range(n_requests):
        n = int(rng.integers(64, 257))
        rank = np.minimum(rng.geometric(0.6, n) - 1, 50).astype(np.int32)
        topk = np.sort(rng.dirichlet(np.ones(10), n)[:, :8], axis=1)[:, ::-1].astype(np.float32)
        reqs.append({"request_id": f"s{r}", "category": "synthetic", "temperature": 0.0, "prompt_len": 16,
                     "p_accept": (rank == 0).astype(np.float32), "draft_conf": topk[:, 0],
                     "draft_entropy": np.ones(n, np.float32), "target_rank": rank, "draft_topk": topk})
    return workload_from_requests("tree-bench", {"kind": "synthetic", "generator": "bench.rank_workload"},
                                  load_profile("gpu-like-published"), reqs)


def bench_tree_env(workload: str, steps: int = 100_000) -> dict[str, Any]:
    """Steps/s of the tree env through ``gymnasium.make`` under random menu actions (resets included)."""
    wl = cached_workload(workload)
    if not Traits.of(wl).tree:
        wl = rank_workload()
    env = gym.make("specgym/SpecDecodeTree-v0", workload=wl, split="all")
    env.reset(seed=0)
    space: Any = env.action_space
    actions = np.random.default_rng(0).integers(0, space.n, steps).tolist()

    def run() -> int:
        for a in actions:
            if env.step(a)[2]:
                env.reset()
        return len(actions)

    return {"tree_env_workload": wl.label, "env_tree_steps_per_s": timeit(run, 1.0)}


def tree_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``tree``: steps/s of SpecDecodeTree-v0."""
    f = bench_tree_env(workload)
    print_table(console, f"tree environment (gymnasium.make, random shapes, {f['tree_env_workload']})", [
        ("SpecDecodeTree-v0 steps/s", f"{f['env_tree_steps_per_s']:,.0f}",
         versus(f["env_tree_steps_per_s"], TREE_ENV_TARGET))])
    return f

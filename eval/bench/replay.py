"""Benchmark sections of the replay path: workload loading, single-env steps/s, vectorised rounds/s."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

import specgym.catalogue as catalogue
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.envs.workloads.trace_format import cached_workload, load_workload
from specgym.eval.bench.common import TARGETS, print_table, timeit, versus


def bench_load(workload: str) -> dict[str, Any]:
    """Cold load + validation time of a workload file."""
    path = catalogue.resolve("workload", workload)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        wl = load_workload(path)
        times.append(time.perf_counter() - t0)
    return {"workload": wl.label, "requests": wl.n_requests, "tokens": wl.n_positions,
            "load_s": min(times), "file_mb": path.stat().st_size / 1e6}


def bench_env(workload: str, steps: int = 100_000) -> dict[str, Any]:
    """Steps/s of ``gymnasium.make`` environments under random actions (resets included)."""
    out = {}
    for key, env_id in (("k", "specgym/SpecDecode-v1"), ("token", "specgym/SpecDecodeToken-v1")):
        env = gym.make(env_id, workload=workload)
        env.reset(seed=0)
        space: Any = env.action_space
        actions = np.random.default_rng(0).integers(space.start, space.start + space.n, steps).tolist()

        def run() -> int:
            for a in actions:
                if env.step(a)[2]:
                    env.reset()
            return len(actions)

        out[f"env_{key}_steps_per_s"] = timeit(run, 1.0)
    return out


def bench_vector(workload: str) -> dict[str, Any]:
    """Rounds/s of the vectorised replay (all requests at once, fixed K=4, one process)."""
    engine = TraceEngine(cached_workload(workload), k_max=DEFAULT_K_MAX, seed=0)
    engine.all_runs()

    def run() -> int:
        v = VectorReplay(engine)
        v.run_fixed(4)
        return int(v.rounds.sum())

    return {"vector_rounds_per_s": timeit(run, 1.0)}


def load_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``load``: cold load + validation of the workload file."""
    f = bench_load(workload)
    print_table(console, "workload load", [(f"load {f['requests']} requests ({f['file_mb']:.1f} MB)",
                                            f"{f['load_s'] * 1000:.1f} ms", "well under 1 s")])
    return f


def env_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``env``: steps/s of both environments through ``gymnasium.make``."""
    f = bench_env(workload)
    print_table(console, "single environment (gymnasium.make, random actions)", [
        ("SpecDecode-v1 steps/s", f"{f['env_k_steps_per_s']:,.0f}",
         versus(f["env_k_steps_per_s"], TARGETS["env_steps_per_s"])),
        ("SpecDecodeToken-v1 steps/s", f"{f['env_token_steps_per_s']:,.0f}",
         versus(f["env_token_steps_per_s"], TARGETS["env_steps_per_s"])),
    ])
    return f


def vector_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``vector``: rounds/s of the vectorised replay."""
    f = bench_vector(workload)
    print_table(console, "vectorised replay (one process)", [
        ("rounds/s", f"{f['vector_rounds_per_s']:,.0f}", versus(f["vector_rounds_per_s"],
                                                                 TARGETS["vector_rounds_per_s"]))])
    return f

"""``specgym bench serving``: the serving engine's speed (the batch env at concurrency 64, ragged steps,
the engine rules' decision time) and the sweep's time, against the serving issue's targets."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

from specgym.agents.specs import make
from specgym.envs.core.batch import BatchDecision
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.profiles import load_batch_profile
from specgym.envs.workloads.synthetic import generate_workload
from specgym.eval.bench.common import print_table, versus

TARGET_ENV_STEPS = 20_000  # batch env steps per second at concurrency 64
CONCURRENCY = 64


def env_steps_per_s(wl: Any, profile: Any, seconds: float = 1.0) -> tuple[float, float]:
    """``(steps per second, seconds per reset)`` of the batch env at a fixed concurrency 64 with a fixed action (the
    env's own cost; the resets, which draw a new episode's runs, are timed apart)."""
    env = gym.make("specgym/SpecDecodeBatch-v0", workload=wl, batch_profile=profile, requests=wl.n_requests,
                   concurrency=CONCURRENCY, max_batch=CONCURRENCY, split="all").unwrapped  # the env, no wrappers
    steps, stepping, resets, resetting = 0, 0.0, 0, 0.0
    while stepping < seconds:
        t0 = time.perf_counter()
        env.reset(seed=resets)
        resetting += time.perf_counter() - t0
        resets += 1
        done = False
        t0 = time.perf_counter()
        while not done:
            _, _, done, _, _ = env.step(3)
            steps += 1
        stepping += time.perf_counter() - t0
    return steps / stepping, resetting / resets


def replay_steps_per_s(wl: Any, profile: Any, spec: str | None, seconds: float = 1.0) -> float:
    """Steps per second of the engine at concurrency 64 with ragged random decisions (``spec=None``) or a rule."""
    sim = BatchReplay(wl, profile, CONCURRENCY, seed=0)
    ctrl = make(spec, sim.k_max, kinds=("batch",)) if spec else None
    if ctrl is not None:
        ctrl.reset(profile, sim.k_max)
    rng = np.random.default_rng(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds and not sim.done:
        st = sim.state()
        if ctrl is None:
            v = rng.integers(0, sim.k_max + 1, st.batch)
            sim.step(BatchDecision(v, np.maximum(v, 3)))
        else:
            ctrl.observe(sim.step(ctrl.propose(st)))
        n += 1
    return n / (time.perf_counter() - t0)


def serving_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """The batch env's and the engine's steps per second at concurrency 64, and each rule's."""
    wl = generate_workload("speclane-mix", 2000, seed=0)  # SYNTHETIC: the speed does not depend on the traces
    rows, figures = [], {}
    for pname in ("h100-llama31-8b", "batch-cpu-midpair"):
        prof = load_batch_profile(pname)
        rate, reset_s = env_steps_per_s(wl, prof)
        figures[f"batch_env_steps_per_s/{pname}"] = rate
        figures[f"batch_env_reset_s/{pname}"] = reset_s
        rows.append((f"batch env, concurrency 64, {pname}", f"{rate:,.0f} steps/s", versus(rate, TARGET_ENV_STEPS)))
        rows.append((f"batch env reset (2,000 requests' runs drawn), {pname}", f"{reset_s * 1e3:.0f} ms", "-"))
        rate = replay_steps_per_s(wl, prof, None)
        figures[f"ragged_replay_steps_per_s/{pname}"] = rate
        rows.append((f"ragged replay steps, concurrency 64, {pname}", f"{rate:,.0f} steps/s", "-"))
    prof = load_batch_profile("h100-llama31-8b")
    for spec in ("vllm-adaptive:ema", "vllm-adaptive:logistic", "budget:logistic", "sglang-adaptive"):
        rate = replay_steps_per_s(wl, prof, spec)
        figures[f"rule_steps_per_s/{spec}"] = rate
        rows.append((f"{spec} deciding every step, concurrency 64", f"{rate:,.0f} steps/s", "-"))
    print_table(console, "serving under load (synthetic speclane-mix, 2,000 requests)", rows)
    return figures

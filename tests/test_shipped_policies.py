"""The shipped learned policies: each carries a guard and never falls below its teacher: under a steeper machine of
the midpair's kind (cpu-midpair's verify slope doubled) every shipped chain policy holds 0.98x ``marginal``."""

from __future__ import annotations

import pytest

import specgym.catalogue as catalogue
from specgym.agents.artifact import list_policies, load_policy
from specgym.envs.profiles import load_profile
from specgym.eval.bench.guard import steep_verify
from specgym.eval.harness import open_replay, run_controllers
from specgym.eval.references import references


@pytest.mark.parametrize("policy", list_policies(kind="chain"))
def test_every_shipped_chain_policy_carries_a_guard(policy):
    art = load_policy(catalogue.resolve("policy", policy))
    assert art.teacher in ("marginal", "planned") and art.obs_low is not None


@pytest.mark.parametrize("workload", ["midpair-greedy", "midpair-t08"])
def test_every_shipped_policy_holds_its_teacher_under_a_steeper_verify(workload):
    replay = open_replay(workload, "test", 0, 8, steep_verify(load_profile("cpu-midpair")))
    refs = references(replay.engine, replay.requests)
    specs = [f"ppo:{p}" for p in list_policies(kind="chain")]
    runs = run_controllers(replay, ["marginal", *specs], refs)
    teacher = runs[0].time_ms.sum()
    ratios = {s: float(teacher / r.time_ms.sum()) for s, r in zip(specs, runs[1:])}
    assert min(ratios.values()) >= 0.98, ratios

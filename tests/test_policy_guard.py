"""A learned policy never below its teacher: the training range under its checksum, the guard, the report."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from specgym.agents.artifact import load_policy, random_artifact, write_artifact
from specgym.agents.policy_controller import PolicyController
from specgym.baselines.marginal import MarginalStop
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.features import feature_bounds
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.domains import ProfileJitter
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.report import markdown_report
from specgym.eval.runner import run_controller


def steep(p: CostProfile) -> CostProfile:
    """The profile with its verify slope doubled (a steeper machine of the same kind)."""
    v = np.asarray(p.verify_ms)
    return dataclasses.replace(p, name=f"{p.name}-steep", verify_ms=tuple(float(x) for x in v[0] + 2 * (v - v[0])))


def guarded(mode: str, low: np.ndarray, high: np.ndarray, seed: int = 0):
    return dataclasses.replace(random_artifact(mode, seed=seed), obs_low=low, obs_high=high, teacher="marginal")


@pytest.mark.parametrize("mode", ["k", "token"])
def test_inside_its_range_the_policy_decides_as_without_a_guard(mix_workload, mode):
    low, high = feature_bounds(mode)
    art = random_artifact(mode, seed=1)
    wide = dataclasses.replace(art, obs_low=low.astype(np.float64), obs_high=high.astype(np.float64),
                               teacher="marginal")
    engine = TraceEngine(mix_workload, k_max=8, seed=0)
    req = np.arange(20)
    plain, guard = PolicyController(art, "p"), PolicyController(wide, "p")
    a, b = run_controller(engine, req, plain), run_controller(engine, req, guard)
    np.testing.assert_array_equal(a.time_ms, b.time_ms)
    stats = guard.guard_stats()
    assert stats is not None and stats["handed"] == 0 and stats["decisions"] > 0 and plain.guard_stats() is None


@pytest.mark.parametrize("mode", ["k", "token"])
def test_outside_its_range_every_decision_is_the_teachers(mix_workload, mode, capsys):
    n = len(feature_bounds(mode)[0])
    nowhere = np.full(n, -50.0)  # a range no observation is in
    ctrl = PolicyController(guarded(mode, nowhere, nowhere), "ppo:probe")
    engine = TraceEngine(mix_workload, k_max=8, seed=0)
    req = np.arange(20)
    got, teacher = run_controller(engine, req, ctrl), run_controller(engine, req, MarginalStop())
    np.testing.assert_array_equal(got.time_ms, teacher.time_ms)
    np.testing.assert_array_equal(got.drafted, teacher.drafted)
    stats = ctrl.guard_stats()
    assert stats["share"] == 1.0 and stats["teacher"] == "marginal" and stats["first_outside"]["low"] == -50.0
    err = capsys.readouterr().err
    assert err.count("outside its training range") == 1  # said once


def test_the_range_and_teacher_are_under_the_checksum(tmp_path):
    n = len(feature_bounds("token")[0])
    art = guarded("token", np.zeros(n), np.ones(n))
    folder = write_artifact(art, tmp_path / "pol")
    back = load_policy(folder)
    assert back.teacher == "marginal" and np.array_equal(back.obs_high, np.ones(n))
    meta = json.loads((folder / "policy.json").read_text())
    meta["guard"]["margin"] = 0.5
    (folder / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(SpecgymError, match="function_sha256"):
        load_policy(folder)
    with pytest.raises(SpecgymError, match="come together"):
        dataclasses.replace(art, teacher=None).validate()
    with pytest.raises(SpecgymError, match="teacher 'planned' needs"):
        dataclasses.replace(art, teacher="planned").validate()


def test_the_report_marks_a_row_that_ran_outside_its_range(mix_workload):
    n = len(feature_bounds("k")[0])
    ctrl = PolicyController(guarded("k", np.full(n, -50.0), np.full(n, -50.0)), "ppo:probe")
    rep = evaluate(EvalConfig(mix_workload, ["fixed:2", ctrl], split="all", max_requests=15, bootstrap=0))
    row = next(r for r in rep["rows"] if r["spec"] == "ppo:probe")
    assert row["guard"]["share"] == 1.0
    md = markdown_report(rep)
    assert "ppo:probe †" in md and "Outside their training range" in md


def test_profile_jitter_stays_around_its_base():
    base = load_profile("cpu-midpair")
    jit = ProfileJitter(base, 2.0)
    rng = np.random.default_rng(0)
    slopes = []
    for _ in range(200):
        p = jit.sample(rng)
        assert p.t_ar_ms == base.t_ar_ms and 0.5 * base.draft_ms <= p.draft_ms <= 2.0 * base.draft_ms
        slopes.append((p.verify_ms[-1] - p.verify_ms[0]) / (base.verify_ms[-1] - base.verify_ms[0]))
    assert 0.5 <= min(slopes) < 0.6 and 1.8 < max(slopes) <= 2.0  # the doubled slope is inside the spread
    assert steep(base).verify_ms[-1] - base.verify_ms[0] == pytest.approx(2 * (base.verify_ms[-1] - base.verify_ms[0]))


def test_range_recorder_keeps_the_raw_observation_range():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env

    from specgym.envs.gym.spec_env import SpecDecodeEnv
    from specgym.envs.gym.wrappers import SB3ActionWrapper
    from specgym.training.feature_ranges import vecnorm_range
    from specgym.training.range_vecnormalize import RangeVecNormalize

    venv = RangeVecNormalize(make_vec_env(lambda: SB3ActionWrapper(SpecDecodeEnv({"workload": "speclane-mix"})),
                                          n_envs=2, seed=0))
    raw = [venv.reset()]
    raw = [venv.get_original_obs()]
    for _ in range(50):
        venv.step(np.array([3, 5]))
        raw.append(venv.get_original_obs())
    lo, hi = vecnorm_range(venv)
    seen = np.concatenate(raw)
    np.testing.assert_allclose(lo, seen.min(0))
    np.testing.assert_allclose(hi, seen.max(0))
    venv.training = False
    venv.step(np.array([8, 8]))  # not training: the range stays
    np.testing.assert_allclose(vecnorm_range(venv)[0], lo)

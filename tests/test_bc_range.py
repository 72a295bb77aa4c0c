"""The guard's range of a behaviour-cloned policy covers the demonstrations it was cloned on.

A clone's experience is its demonstrations: its actor was fitted on them and ``VecNormalize``'s statistics were set
from them. Before this was recorded, a run's range held only the env's ``reset()`` observations until PPO stepped,
so a clone validated (and kept as the best model) at step 0 carried a one-point range: the shipped
``ppo:smollm2-drafter`` (kept at step 0) handed 97.7% of its val decisions to its teacher and tied
``drafter-marginal`` exactly. Every trace here is SYNTHETIC (tests/specdecode_files.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from specdecode_files import two_drafter_file

from specgym.envs.workloads.specdecode import import_file

pytest.importorskip("stable_baselines3")

K_MAX = 8


@pytest.fixture(scope="module")
def wl(tmp_path_factory):
    """A SYNTHETIC two-drafter workload (EAGLE-like and n-gram-like runs)."""
    return import_file(two_drafter_file(tmp_path_factory.mktemp("bcr") / "combined_instructcoder.jsonl", 24)).workload


def _covers(lo: np.ndarray, hi: np.ndarray, obs: np.ndarray) -> bool:
    return bool((lo <= obs.min(0)).all() and (hi >= obs.max(0)).all())


def test_cloning_adds_the_demonstrations_to_the_recorded_range(wl):
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from specgym.training.bc_init import clone_into, demonstrations
    from specgym.training.feature_ranges import vecnorm_range
    from specgym.training.range_vecnormalize import RangeVecNormalize

    venv = RangeVecNormalize(make_vec_env(lambda: gym.make("specgym/SpecDecodeDrafter-v0", workload=wl, split="all",
                                                           k_max=K_MAX), n_envs=2, seed=0))
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, seed=0, device="cpu")
    venv.reset()
    lo0, hi0 = vecnorm_range(venv)
    obs, labels = demonstrations("drafter-marginal", wl, "drafter", 0, K_MAX)
    assert not _covers(lo0, hi0, obs)  # the reset observations alone: a clone would be guarded off its own inputs
    clone_into(model, venv, obs, labels, epochs=1)
    lo, hi = vecnorm_range(venv)
    assert _covers(lo, hi, obs) and _covers(lo, hi, np.stack([lo0, hi0]))
    np.testing.assert_allclose(lo, np.minimum(lo0, obs.min(0)))  # no wider than what was seen
    np.testing.assert_allclose(hi, np.maximum(hi0, obs.max(0)))


@pytest.mark.slow
def test_a_clone_kept_at_step_zero_decides_on_its_fit_split_itself(wl, tmp_path):
    """A drafter run cloned from drafter-marginal and kept at step 0: the exported range covers the demonstrations
    and, where it plays the teacher's rounds, the policy decides them itself (none handed over)."""
    from specgym.agents.artifact import load_policy
    from specgym.agents.drafter_policy import DrafterPolicyController
    from specgym.envs.core.drafter_choice import drive_drafters
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.envs.workloads.trace_format import save_workload
    from specgym.training.bc_init import demonstrations
    from specgym.training.export import export_run
    from specgym.training.ppo import TrainRequest, train

    path = save_workload(wl, tmp_path / "w.parquet")
    tiny = {"n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "eval_freq": 10_000, "k_max": K_MAX,
            "bc_init": "drafter-marginal", "bc_warmup": 0}
    train(TrainRequest(workload=str(path), mode="drafter", out=tmp_path / "run", timesteps=128, seed=0,
                       overrides=tiny, quiet=True))
    art = load_policy(export_run(tmp_path / "run", tmp_path / "policy", force=True))
    assert art.obs_low is not None and art.obs_high is not None
    obs, _ = demonstrations("drafter-marginal", wl, "drafter", 0, K_MAX)
    assert _covers(art.obs_low, art.obs_high, obs)

    class Teacher(DrafterPolicyController):
        """The guarded policy checking its range on the teacher's rounds (it plays the teacher's decisions)."""

        def propose(self, start):
            assert self.teacher is not None and self.guard is not None
            self.guard.outside(self.tracker.observation(start))
            return self.teacher.propose(start)

    ctrl = Teacher(art, "clone")
    ctrl.prepare(wl, wl.profile)
    engine = TraceEngine(wl, k_max=K_MAX)
    for r in wl.split_indices(wl.fit_split):
        drive_drafters(ctrl, engine.start(int(r)), wl.drafter_names)
    stats = ctrl.guard_stats()
    assert stats is not None and stats["decisions"] == len(obs) and stats["handed"] == 0


def _shipped_guarded() -> list:
    from specgym.agents.artifact import list_policies

    return list(list_policies())


@pytest.mark.parametrize("policy", _shipped_guarded())
def test_a_shipped_range_holds_every_feature_its_normaliser_saw_vary(policy):
    """The range and the normalisation statistics come from the same experience: a feature whose recorded variance
    is positive cannot have a one-point range (the signature of a range that missed the demonstrations)."""
    import specgym.catalogue as catalogue
    from specgym.agents.artifact import load_policy

    art = load_policy(catalogue.resolve("policy", policy))
    if art.obs_low is None or art.obs_high is None or art.obs_var is None:
        pytest.skip(f"{policy}: no guard or no normalisation")
    flat = [f for f, v, lo, hi in zip(art.features, art.obs_var, art.obs_low, art.obs_high) if v > 1e-6 and hi <= lo]
    assert not flat, f"{policy}: one-point range in features the normaliser saw vary: {flat}"

"""The vectorised training environment of a PPO run: SB3's ``make_vec_env`` + ``VecNormalize``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

import specgym.catalogue as catalogue
from specgym.envs.core.acceptance_predictor import load_predictor
from specgym.agents.modes import get_mode
from specgym.envs.gym.wrappers import SB3ActionWrapper
from specgym.envs.core.cost import load_profile
from specgym.envs.workloads.domains import DomainDistribution, ProfileJitter
from specgym.errors import SpecgymError
from specgym.training.config import RunConfig
from specgym.training.rewards import TokenShaping, TokenValueReward
from specgym.training.run_folder import load_vecnormalize


def run_predictor(run: RunConfig) -> Any:
    """The acceptance predictor a run's token-mode observations read (config key ``predictor``), or ``None``; the
    very one the run started with (its checksum is in the run config), else a one-line error."""
    if run.ppo.predictor is None:
        return None
    path = catalogue.resolve("predictor", run.ppo.predictor)
    pred = load_predictor(path)
    sha = pred.to_dict()["sha256"]
    if run.predictor_sha256 is not None and sha != run.predictor_sha256:
        raise SpecgymError(f"{path}: acceptance predictor changed since the run started (sha256 {sha[:12]}, the run "
                           f"used {run.predictor_sha256[:12]}): restore that file or train a new run")
    return pred


def training_distribution(run: RunConfig, workload: Any) -> Any:
    """What a run's episodes are drawn from: ``workload``, or with ``profile_jitter`` the workload under profiles
    jittered around its own (or the run's ``profile``), a quarter of the episodes at that profile itself
    (:class:`~specgym.envs.workloads.domains.ProfileJitter`); behaviour cloning draws its demonstrations from the
    same distribution."""
    if run.ppo.profile_jitter is None or isinstance(workload, DomainDistribution):
        return workload
    base = load_profile(run.ppo.profile) if run.ppo.profile is not None else workload.profile
    return DomainDistribution([workload], profiles=ProfileJitter(base, float(run.ppo.profile_jitter)),
                              own_profile_share=0.25)


def env_config(run: RunConfig, workload: Any, split: str) -> dict[str, Any]:
    """The env configuration of a run (the keys of :meth:`SpecDecodeEnv.default_config`).

    ``workload`` is a :class:`Workload` or, for domain-randomised runs, a :class:`DomainDistribution`.
    """
    cfg: dict[str, Any] = {"split": split, "k_max": run.ppo.k_max, "k_min": run.ppo.k_min,
                           "outcome_seed": run.ppo.outcome_seed, "profile": run.ppo.profile}
    if run.ppo.predictor is not None:
        cfg["predictor"] = run_predictor(run)
    if isinstance(workload, DomainDistribution):
        return {**cfg, "domains": workload, "workload": workload.workloads[0]}
    return {**cfg, "workload": workload}


def make_env_fn(run: RunConfig, workload: Any, split: str = "train") -> Callable[[], gym.Env]:
    """A zero-argument env factory: the mode's env (its Gymnasium id, :attr:`PolicyMode.env_id`), then
    ``SB3ActionWrapper`` where actions are draft caps, the token-value reward and (token-level modes) shaping. The
    batch env is rewarded in tokens per step time by itself (no reward wrapper)."""
    row = get_mode(run.mode)
    if row.kind == "batch":
        bcfg = {"workload": workload, "batch_profile": run.ppo.batch_profile, "split": split,
                "requests": run.ppo.batch_requests, "max_batch": run.ppo.max_batch, "k_max": run.ppo.k_max}
        return lambda: gym.make(row.env_id, disable_env_checker=True, config=bcfg).unwrapped
    cfg = env_config(run, training_distribution(run, workload) if split == "train" else workload, split)
    token_value = None if cfg.get("domains") is not None else float(run.token_value_resolved)
    shaping = list(run.ppo.shaping) if row.token_level else []

    def make() -> gym.Env:
        env: gym.Env = gym.make(row.env_id, disable_env_checker=True, config=cfg).unwrapped
        if row.k_actions:
            env = SB3ActionWrapper(env)
        env = TokenValueReward(env, token_value)
        if shaping:
            env = TokenShaping(env, shaping, run.ppo.gamma)
        return env

    return make


def make_training_env(run: RunConfig, workload: Any, seed: int, stats: Path | None = None) -> Any:
    """``make_vec_env`` (DummyVecEnv, Monitor) wrapped in ``VecNormalize`` (loaded from ``stats`` on resume)."""
    from stable_baselines3.common.env_util import make_vec_env

    from specgym.training.range_vecnormalize import RangeVecNormalize

    venv = make_vec_env(make_env_fn(run, workload), n_envs=run.ppo.n_envs, seed=seed)
    if stats is not None:
        vec = load_vecnormalize(stats, venv)
        vec.training = True
        return vec
    norm = run.ppo.normalize
    return RangeVecNormalize(venv, norm_obs=norm.norm_obs, norm_reward=norm.norm_reward, clip_obs=norm.clip_obs,
                             clip_reward=norm.clip_reward, gamma=run.ppo.gamma)


class SpacesOnlyEnv(gym.Env):
    """An env that only carries a model's spaces (``VecNormalize.load`` needs one to attach statistics to)."""

    def __init__(self, model: Any):
        self.observation_space = model.observation_space
        self.action_space = model.action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # pragma: no cover
        raise NotImplementedError("statistics-only environment")

    def step(self, action: Any):  # pragma: no cover
        raise NotImplementedError("statistics-only environment")

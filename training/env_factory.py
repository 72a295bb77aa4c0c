"""The vectorised training environment of a PPO run: SB3's ``make_vec_env`` + ``VecNormalize``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from specgym.agents.modes import get_mode
from specgym.envs.core.kinds import kind_row
from specgym.envs.gym.wrappers import SB3ActionWrapper
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.domains import DomainDistribution, ProfileJitter
from specgym.training.config import RunConfig
from specgym.training.rewards import TokenShaping, TokenValueReward
from specgym.training.run import TrainingRun
from specgym.training.run_folder import load_vecnormalize


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


def env_config(run: TrainingRun, workload: Any, split: str) -> dict[str, Any]:
    """The env configuration of a run (the keys of :meth:`SpecDecodeEnv.default_config`).

    ``workload`` is a :class:`Workload` or, for domain-randomised runs, a :class:`DomainDistribution`; the
    observations read the run's own acceptance predictor (:attr:`~specgym.training.run.TrainingRun.predictor`).
    """
    ppo = run.config.ppo
    cfg: dict[str, Any] = {"split": split, "k_max": ppo.k_max, "k_min": ppo.k_min,
                           "outcome_seed": ppo.outcome_seed, "profile": ppo.profile}
    if ppo.predictor is not None:
        cfg["predictor"] = run.predictor
    if ppo.drafter is not None:  # tree mode: trees drafted by the head (checked against the mode by specgym train)
        cfg["drafter"] = ppo.drafter
    if ppo.shapes is not None:  # tree mode: its action menu
        cfg["shapes"] = ppo.shapes
    if isinstance(workload, DomainDistribution):
        return {**cfg, "domains": workload, "workload": workload.workloads[0]}
    return {**cfg, "workload": workload}


def make_env_fn(run: TrainingRun, split: str | None = None) -> Callable[[], gym.Env]:
    """A zero-argument env factory of a run: the mode's env (its Gymnasium id, :attr:`PolicyMode.env_id`), then
    ``SB3ActionWrapper`` where actions are draft caps, the token-value reward and (token-level modes) shaping. The
    batch env is rewarded in tokens per step time by itself (no reward wrapper). ``split`` ``None``: the training
    requests: the workload's fit split (:attr:`Workload.fit_split`; where that is val, its fit rows,
    :attr:`TrainingRun.fit_workload`)."""
    fitting = split is None
    rc, ppo, workload = run.config, run.config.ppo, run.fit_workload if fitting else run.workload
    split = workload.fit_split if split is None else split
    row = get_mode(rc.mode)
    if kind_row(row.kind).serving_step:
        bcfg = {"workload": workload, "batch_profile": ppo.batch_profile, "split": split,
                "requests": ppo.batch_requests, "max_batch": ppo.max_batch, "k_max": ppo.k_max}
        if row.draft_view:
            bcfg["predictor"] = run.predictor
        return lambda: gym.make(row.env_id, disable_env_checker=True, config=bcfg).unwrapped
    cfg = env_config(run, training_distribution(rc, workload) if fitting else workload, split)
    token_value = None if cfg.get("domains") is not None else float(rc.token_value_resolved)
    shaping = list(ppo.shaping) if row.token_level else []

    def make() -> gym.Env:
        env: gym.Env = gym.make(row.env_id, disable_env_checker=True, config=cfg).unwrapped
        if row.k_actions:
            env = SB3ActionWrapper(env)
        env = TokenValueReward(env, token_value)
        if shaping:
            env = TokenShaping(env, shaping, ppo.gamma)
        return env

    return make


def make_training_env(run: TrainingRun, seed: int, stats: Path | None = None) -> Any:
    """``make_vec_env`` (DummyVecEnv, Monitor) of the run's envs wrapped in ``VecNormalize`` (loaded from ``stats``
    on resume)."""
    from stable_baselines3.common.env_util import make_vec_env

    from specgym.training.range_vecnormalize import RangeVecNormalize

    ppo = run.config.ppo
    venv = make_vec_env(make_env_fn(run), n_envs=ppo.n_envs, seed=seed)
    if stats is not None:
        vec = load_vecnormalize(stats, venv)
        vec.training = True
        return vec
    norm = ppo.normalize
    return RangeVecNormalize(venv, norm_obs=norm.norm_obs, norm_reward=norm.norm_reward, clip_obs=norm.clip_obs,
                             clip_reward=norm.clip_reward, gamma=ppo.gamma)


class SpacesOnlyEnv(gym.Env):
    """An env that only carries a model's spaces (``VecNormalize.load`` needs one to attach statistics to)."""

    def __init__(self, model: Any):
        self.observation_space = model.observation_space
        self.action_space = model.action_space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):  # pragma: no cover
        raise NotImplementedError("statistics-only environment")

    def step(self, action: Any):  # pragma: no cover
        raise NotImplementedError("statistics-only environment")

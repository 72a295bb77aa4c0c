"""The range of every observation feature a policy saw in training: what its guard checks in deployment.

:class:`~specgym.training.range_vecnormalize.RangeVecNormalize` is SB3's ``VecNormalize`` that also keeps the
per-feature minimum and maximum of the raw observations (before normalisation) the training envs returned while
training. It is saved with every model of a run (``vecnormalize.pkl``, ``best_vecnormalize.pkl``) and in the resume
snapshot, so the model exported from a run carries the range it was trained on, and a resumed run keeps the range of
the steps before the resume. Export puts it in the artifact beside the policy's teacher
(:class:`~specgym.agents.policy_controller.PolicyController`'s guard).

:func:`observed_range` measures the same thing afterwards, for a policy whose run predates the record: the range of
the observations the policy itself meets on its training requests (the train split, or episodes of its training
distribution), documented as such in the artifact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from specgym.agents.policy_controller import PolicyController
from specgym.envs.core.request import drive
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.domains import DomainDistribution


def vecnorm_range(vecnorm: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The recorded range of a run's ``VecNormalize`` (None for one that did not record, or before any step)."""
    lo, hi = getattr(vecnorm, "obs_low", None), getattr(vecnorm, "obs_high", None)
    return None if lo is None or hi is None else (np.asarray(lo, np.float64).copy(), np.asarray(hi, np.float64).copy())


class _Recording(PolicyController):
    """The policy itself, recording every observation it decides on."""

    def __init__(self, artifact: Any):
        super().__init__(artifact, name="range")
        self.seen: list[np.ndarray] = []

    def act(self, obs: np.ndarray) -> int:
        self.seen.append(np.asarray(obs, np.float64).copy())
        return super().act(obs)


def observed_range(artifact: Any, workload: Any, split: str | None = None, passes: int = 2, episodes: int = 3000,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The range of the observations ``artifact``'s policy decides on over its training requests (``passes`` of
    ``split`` with fresh outcome draws each, or ``episodes`` episodes of a :class:`DomainDistribution`; ``None``: the
    workload's fit split, :attr:`Workload.fit_split`)."""
    split = split or workload.fit_split
    rec = _Recording(dataclasses.replace(artifact, obs_low=None, obs_high=None, teacher=None))  # every decision its own
    k_max = artifact.k_max
    if isinstance(workload, DomainDistribution):
        rng = np.random.default_rng(seed)
        for e in range(episodes):
            wl, profile = workload.sample(rng)
            r = int(rng.choice(wl.split_indices(split)))
            drive(rec, TraceEngine(wl, profile, k_max=k_max, seed=seed).start(r, seed=seed + e + 1))
    else:
        engine = TraceEngine(workload, k_max=k_max, seed=seed)
        for p in range(passes):
            for r in workload.split_indices(split):
                drive(rec, engine.start(int(r), seed=seed + 1000 * p + 1))
    seen = np.stack(rec.seen)
    return seen.min(axis=0), seen.max(axis=0)

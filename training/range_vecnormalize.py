"""SB3's ``VecNormalize`` that also records the range of the raw observations a run trained on
(:mod:`specgym.training.feature_ranges` says what the range is for). Imports stable-baselines3.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecNormalize


class RangeVecNormalize(VecNormalize):
    """``VecNormalize`` that also records the range of the raw observations seen while ``training``.

    Attributes:
        obs_low, obs_high: Per-feature minimum and maximum so far (None before the first observation).
    """

    obs_low: np.ndarray | None = None
    obs_high: np.ndarray | None = None

    def _record(self, obs: Any) -> None:
        if not self.training or not isinstance(obs, np.ndarray) or obs.ndim != 2:
            return
        lo, hi = obs.min(axis=0).astype(np.float64), obs.max(axis=0).astype(np.float64)
        self.obs_low = lo if self.obs_low is None else np.minimum(self.obs_low, lo)
        self.obs_high = hi if self.obs_high is None else np.maximum(self.obs_high, hi)

    def include(self, obs: np.ndarray) -> None:
        """Raw observations a policy was fitted on outside the env's steps (behaviour cloning's demonstrations, a
        ``(n, obs_dim)`` array) join the range: they are its experience too, and a clone validated before PPO steps
        would otherwise carry the range of the ``reset()`` observations alone."""
        self._record(np.asarray(obs))

    def step_wait(self) -> Any:
        """SB3's step, then the raw observations join the range."""
        out = super().step_wait()
        self._record(self.old_obs)
        return out

    def reset(self) -> Any:
        """SB3's reset, then the raw observations join the range."""
        obs = super().reset()
        self._record(self.old_obs)
        return obs

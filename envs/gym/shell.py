"""The shell every specgym environment shares: configuration merged over ``default_config()``, the render-mode
check, the action check, the reset guard, the round reward and the round's info keys.

The replay envs (K, token, tree), the batch env and the live env differ in what they replay; how they take a
configuration, refuse a bad action or a step after the end, and price and report a round is written once here.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from specgym.envs.core.rounds import RoundOutcome
from specgym.envs.gym.config import update_config
from specgym.errors import InvalidAction, SpecgymError


class EnvShell(gym.Env):
    """Base of the specgym environments (subclasses define ``default_config`` and ``action_space``)."""

    metadata: dict[str, Any] = {"render_modes": []}
    #: how configuration errors name the env ("unknown batch env config key(s) ...")
    config_name = "env"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        """Every configuration key with its default."""
        raise NotImplementedError

    def _merge_config(self, config: dict[str, Any] | None, overrides: dict[str, Any],
                      render_mode: str | None = None) -> None:
        """``self.config`` = the defaults, then ``config``, then the keyword overrides (unknown keys are errors)."""
        self.config = self.default_config()
        for c in (config or {}, overrides):
            update_config(self.config, c, self.config_name)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise SpecgymError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode

    def _check_action(self, action: Any) -> int:
        """The action as an ``int``; anything outside the action space raises :class:`InvalidAction`."""
        space: Any = self.action_space
        if type(action) is int:  # the common case, checked without numpy
            if space.start <= action < space.start + space.n:
                return action
        elif space.contains(action):
            return int(action)
        raise InvalidAction(f"{type(self).__name__}: action {action!r} ({type(action).__name__}) is not in "
                            f"{space} (integers {int(space.start)}..{int(space.start + space.n - 1)})")

    @staticmethod
    def _check_running(running: bool) -> None:
        """The reset guard: ``step()`` needs a started episode that has not ended."""
        if not running:
            raise SpecgymError("call reset() before step() (the episode is over)")

    @staticmethod
    def round_reward(o: RoundOutcome, t_ar: float) -> float:
        """A round's reward: tokens produced minus its time in plain decoding steps (``produced - time / t_AR``)."""
        return o.produced - o.time_ms / t_ar

    @staticmethod
    def round_info(o: RoundOutcome) -> dict[str, Any]:
        """The info keys every single-request env reports for a round."""
        return {"planned_k": o.planned_k, "drafted": o.drafted, "accepted": o.accepted, "produced": o.produced,
                "time_ms": o.time_ms}

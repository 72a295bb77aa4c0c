"""Wrappers that adapt the environments to learning libraries."""

from __future__ import annotations

import gymnasium as gym
from gymnasium import spaces


class SB3ActionWrapper(gym.ActionWrapper):
    """Expose a ``Discrete(n, start=s)`` action space as ``Discrete(n)`` (stable-baselines3 requires start 0).

    The agent's action ``a`` becomes the env action ``a + start``; everything else passes through.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, spaces.Discrete):
            raise TypeError(f"SB3ActionWrapper needs a Discrete action space, got {space}")
        self.start = int(space.start)
        self.action_space = spaces.Discrete(int(space.n))

    def action(self, action):
        """Shift the agent's 0-based action to the env's range."""
        return int(action) + self.start

"""Gymnasium environments over the engines (registered by ``import specgym``)."""

from specgym.envs.gym.spec_env import SpecDecodeEnv, SpecDecodeTokenEnv
from specgym.envs.gym.wrappers import SB3ActionWrapper

__all__ = ["SB3ActionWrapper", "SpecDecodeEnv", "SpecDecodeTokenEnv"]

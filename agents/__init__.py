"""Deployable agents: the exported-policy controller (numpy only) and the transformers ``generate()`` integration.

Nothing here imports torch or stable-baselines3 at import time. Exported policies are named in controller specs as
``ppo:NAME_OR_DIR`` (:mod:`specgym.agents.specs`, the one table of every controller spec).
"""

from __future__ import annotations

from specgym.agents.artifact import list_policies, load_policy
from specgym.agents.policy_controller import PolicyController

__all__ = ["PolicyController", "list_policies", "load_policy"]

"""Deployable agents: the exported-policy controller and the transformers ``generate()`` integration.

Importing this package registers the ``ppo:DIR`` controller spec (an exported policy folder, see
:mod:`specgym.agents.policy_controller`), so ``specgym eval --controllers all,ppo:policy`` works. Nothing here
imports torch or stable-baselines3.
"""

from __future__ import annotations

from pathlib import Path

from specgym.agents.policy_controller import PolicyController, load_policy
from specgym.baselines.base import Controller
from specgym.baselines.registry import register_prefix
from specgym.errors import SpecgymError


def _ppo_factory(arg: str | None, k_max: int) -> Controller:
    """``ppo:DIR`` -> the exported policy in DIR, checked against the evaluation's ``k_max``."""
    if not arg:
        raise SpecgymError("ppo needs the exported policy folder, e.g. ppo:runs/NAME/policy")
    art = load_policy(arg)
    if art.k_max != k_max:
        raise SpecgymError(f"policy {arg} was trained with k_max={art.k_max}, evaluation uses k_max={k_max} "
                           f"(pass --k-max {art.k_max})")
    run = (art.meta.get("training") or {}).get("run") if isinstance(art.meta.get("training"), dict) else None
    return PolicyController(art, name=f"ppo-{art.mode}:{run or Path(arg).name}")


register_prefix("ppo", _ppo_factory, "ppo:DIR (exported policy)", replace=True)

__all__ = ["PolicyController", "load_policy"]

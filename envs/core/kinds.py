"""The closed name sets of "what is decided": decision kinds, controller families and policy modes.

One home for the names; everything that lists them derives from here, and mypy checks every use of the ``Literal``
types. The rows that give each name its behaviour live where the layering allows:

* a **decision kind** (``chain``: a draft cap per round, or a stop per draft token; ``tree``: a draft tree per round;
  ``batch``: one decision per serving step of a batch; ``drafter``: which drafter and K per round) is the ``kind`` of
  every controller-spec row (:data:`specgym.agents.specs.TABLE`), which decides the runner that plays it;
* a **controller family** (``fixed``, ``rule``, ``predictor``, ``learned``, ``oracle``) is the ``family`` of a spec
  row: how reports group rows and plots colour them (:data:`FAMILY_STYLE`);
* a **policy mode** (``k``, ``token``, ``tree``, ``batch``, ``drafter``, ``alloc``) is one row of
  :data:`specgym.agents.modes.MODES`: what ``specgym train --mode`` trains and an exported ``policy.json`` names,
  with its kind, env id, features, controller and compared baselines.

Code asks a resolved spec's row (``row.kind``, ``row.family``), never its prefix (``spec.startswith("fixed:")``).
``docs/guides/adding-a-decision-kind.md`` lists the files a new kind touches.
"""

from __future__ import annotations

from typing import Literal, get_args

KindName = Literal["chain", "tree", "batch", "drafter"]
FamilyName = Literal["fixed", "rule", "predictor", "learned", "oracle"]
ModeName = Literal["k", "token", "batch", "tree", "drafter", "alloc"]
#: The decision level of a spec row: one decision per round (``k``), a stop per draft token, a tree or a batch step.
LevelName = Literal["k", "token", "tree", "batch", "drafter"]

#: Decision kinds, in the order usage lines list them.
KINDS: tuple[KindName, ...] = get_args(KindName)
#: What ``specgym eval`` (the replay harness) runs.
EVAL_KINDS: tuple[KindName, ...] = ("chain", "tree", "drafter")
FAMILIES: tuple[FamilyName, ...] = get_args(FamilyName)
#: Policy modes, in the order ``specgym train --mode`` lists them.
MODE_NAMES: tuple[ModeName, ...] = get_args(ModeName)
#: The colour and legend label of each family in every plot (matplotlib colour names).
FAMILY_STYLE: dict[FamilyName, tuple[str, str]] = {
    "fixed": ("tab:gray", "fixed K or tree shape"), "rule": ("tab:blue", "adaptive rule"),
    "predictor": ("tab:purple", "rule on a learned acceptance predictor"), "learned": ("tab:red", "learned policy"),
    "oracle": ("black", "clairvoyant plan")}

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

Code asks a resolved spec's row (``row.kind``, ``row.family``), never its prefix (``spec.startswith("fixed:")``),
and asks a kind's :class:`DecisionKind` row (:data:`KIND_ROWS`) what the kind does, never its name
(``row.kind == "tree"``). ``docs/guides/adding-a-decision-kind.md`` lists the files a new kind touches.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args, overload

KindName = Literal["chain", "tree", "batch", "drafter"]
FamilyName = Literal["fixed", "rule", "predictor", "learned", "oracle"]
ModeName = Literal["k", "token", "batch", "tree", "drafter", "alloc"]
#: The decision level of a spec row: one decision per round (``k``), a stop per draft token, a tree or a batch step.
LevelName = Literal["k", "token", "tree", "batch", "drafter"]

FAMILIES: tuple[FamilyName, ...] = get_args(FamilyName)
#: The drafters specgym's live engines serve: the draft model (the one drafter of a profile or per-position trace
#: that names none), prompt lookup (vLLM's ``ngram`` proposer) and the EAGLE-style draft head. Traces imported from
#: published data may name others (``eagle``, ``suffix``); specs name a drafter after ``@`` (``fixed:3@head``).
DrafterName = Literal["draft", "ngram", "head"]
DRAFTER_NAMES: tuple[DrafterName, ...] = get_args(DrafterName)
IMPLICIT_DRAFTER: DrafterName = "draft"
NGRAM_DRAFTER: DrafterName = "ngram"
HEAD_DRAFTER: DrafterName = "head"
#: Policy modes, in the order ``specgym train --mode`` lists them.
MODE_NAMES: tuple[ModeName, ...] = get_args(ModeName)
#: The colour and legend label of each family in every plot (matplotlib colour names).
FAMILY_STYLE: dict[FamilyName, tuple[str, str]] = {
    "fixed": ("tab:gray", "fixed K or tree shape"), "rule": ("tab:blue", "adaptive rule"),
    "predictor": ("tab:purple", "rule on a learned acceptance predictor"), "learned": ("tab:red", "learned policy"),
    "oracle": ("black", "clairvoyant plan")}
#: Policy modes whose decisions are per draft token (the policy stops drafting; token features and shaping apply).
TOKEN_LEVEL_MODES: frozenset[ModeName] = frozenset({"token"})


@dataclass(frozen=True)
class DecisionKind:
    """One decision kind: what code outside this table asks of a kind instead of comparing its name.

    The runners, environments and controllers of a kind live in their layers (its replay runner, named here by
    ``replay_runner``; the spec rows of ``agents/specs.py``, the policy modes of ``agents/modes.py``); this row
    holds what every layer may read.

    Attributes:
        name: The kind.
        level: The decision level of its spec rows (a chain row may also decide per draft token, ``per_token``).
        label: How messages name its controllers (``drafter-choice controllers``).
        per_token: Its rows may decide per draft token (a learned row's level follows the policy it loads).
        streams: ``specgym eval --stream`` runs it shard by shard (it needs no whole-workload preparation).
        drafts_trees: Its draft is a tree: replay and live runs verify trees, reports mark its rows ``tree``, the
            fastest static shape is a reference, ``specgym generate`` runs the live tree engine.
        chooses_drafter: It names the drafter of each round: its workloads need two drafters, its reference is the
            best single drafter, its demonstrations are the drafter replay's, the live bench adds the n-gram runs.
        fitted: Its controllers are prepared on the workload's train split under the profile before a live run
            (instead of being bound to the live engine's signals).
        serving_step: It decides once per serving step of a batch (what SGLang's and vLLM's step hooks run).
        runs_in: Where its policies run when ``specgym eval`` does not (appended to the wrong-mode message).
        replay_runner: ``"module:function"`` that runs one of its rows in ``specgym eval`` (the replay harness
            imports it by name, so the core names it without importing upward); empty: not run by ``eval``.
        live_runner: ``"module:function"`` that decodes one request with one of its controllers on a live engine
            (:func:`specgym.envs.engines.live.runners.run_live` imports it by name: ``specgym generate``, the live
            bench); empty: no live engine runs it.
        interface: ``"module:Class"``, the controller interface its controllers implement: a controller built
            outside the spec table (an object of your own) is of the kind whose interface it is an instance of
            (:func:`controller_kind`), and a learned row's kind follows the interface of the policy it loads.
        references: ``"module:function"`` that adds its reference runs to an evaluation's report (the replay
            harness calls it with the replay, the resolved rows, their results and the chain references, and it
            returns a :class:`specgym.eval.harness.KindReferences`: the columns every row is compared with, such
            as the fastest static tree or the best single drafter); empty: none beyond the chain references.
        wraps: The kind whose rules its ``SPEC@DRAFTER`` row runs on one drafter (``marginal@head``: a chain rule
            deciding the head's K each round); empty: none.
    """

    name: KindName
    level: LevelName
    label: str
    per_token: bool = False
    streams: bool = False
    drafts_trees: bool = False
    chooses_drafter: bool = False
    fitted: bool = False
    serving_step: bool = False
    runs_in: str = ""
    replay_runner: str = ""
    live_runner: str = ""
    interface: str = ""
    references: str = ""
    wraps: str = ""


#: One row per decision kind, in ``KindName`` order.
KIND_ROWS: dict[KindName, DecisionKind] = {row.name: row for row in (
    DecisionKind("chain", "k", "chain", per_token=True, streams=True,
                 replay_runner="specgym.eval.harness:run_chain",
                 live_runner="specgym.envs.engines.live.runners:run_chain",
                 interface="specgym.envs.core.controller:Controller"),
    DecisionKind("tree", "tree", "tree", drafts_trees=True, fitted=True, replay_runner="specgym.eval.harness:run_tree",
                 live_runner="specgym.envs.engines.live.runners:run_tree",
                 interface="specgym.envs.core.tree:TreeController",
                 references="specgym.eval.harness:tree_references"),
    DecisionKind("batch", "batch", "batch", serving_step=True, runs_in="specgym tune compare",
                 interface="specgym.envs.core.batch:BatchController"),
    DecisionKind("drafter", "drafter", "drafter-choice", chooses_drafter=True, fitted=True,
                 replay_runner="specgym.eval.harness:run_drafter",
                 live_runner="specgym.envs.engines.live.runners:run_drafter",
                 interface="specgym.envs.core.drafter_choice:DrafterController",
                 references="specgym.eval.harness:drafter_references", wraps="chain"),
)}
assert tuple(KIND_ROWS) == get_args(KindName), "one row per kind, in KindName order"


class KindNames(Sequence[KindName]):
    """The names of the kinds whose row passes a test, in table order, read from :data:`KIND_ROWS` at each use.

    What derives from the table (every kind, the kinds ``specgym eval`` runs, the kinds a live engine runs) is a view,
    not a copy taken at import: a row added to :data:`KIND_ROWS` joins every list that derives from it, default
    arguments included, so a new kind needs its row and nothing else to be resolved, listed and run
    (``tests/test_new_kind.py`` adds one at run time). It compares equal to the tuple of its names.
    """

    def __init__(self, test: Callable[[DecisionKind], bool]) -> None:
        self._test = test

    def names(self) -> tuple[KindName, ...]:
        """The names, now."""
        return tuple(name for name, row in KIND_ROWS.items() if self._test(row))

    @overload
    def __getitem__(self, index: int) -> KindName: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[KindName, ...]: ...

    def __getitem__(self, index: int | slice) -> KindName | tuple[KindName, ...]:
        return self.names()[index]

    def __len__(self) -> int:
        return len(self.names())

    def __iter__(self) -> Iterator[KindName]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __eq__(self, other: object) -> bool:
        return self.names() == (other.names() if isinstance(other, KindNames) else other)

    def __hash__(self) -> int:
        return hash(self.names())

    def __repr__(self) -> str:
        return repr(self.names())


#: Decision kinds, in the order usage lines list them.
KINDS: KindNames = KindNames(lambda row: True)
#: What ``specgym eval`` (the replay harness) runs: the kinds with a replay runner.
EVAL_KINDS: KindNames = KindNames(lambda row: bool(row.replay_runner))
#: What ``specgym generate`` and the live bench run: the kinds with a live runner.
LIVE_KINDS: KindNames = KindNames(lambda row: bool(row.live_runner))

#: The kind whose specs name a drafter (``SPEC@DRAFTER``): the one that chooses the drafter of each round.
DRAFTER_KIND: KindName = next(row.name for row in KIND_ROWS.values() if row.chooses_drafter)


def kind_row(name: str) -> DecisionKind:
    """The row of decision kind ``name`` (a resolved spec's or policy mode's ``kind``)."""
    return KIND_ROWS[name]  # type: ignore[index]


def load_runner(path: str) -> Any:
    """The object a row names as ``"module:name"`` (:attr:`DecisionKind.replay_runner`,
    :attr:`DecisionKind.live_runner`, :attr:`DecisionKind.interface`, :attr:`DecisionKind.references`), imported
    when asked: the core names runners and interfaces without importing upward; None for an empty name."""
    if not path:
        return None
    module, func = path.split(":")
    return getattr(importlib.import_module(module), func)


def controller_kind(ctrl: object) -> DecisionKind | None:
    """The row of the kind whose controller interface (:attr:`DecisionKind.interface`) ``ctrl`` implements, the
    first in table order; None when it implements none (it is not a controller)."""
    for row in KIND_ROWS.values():
        interface = load_runner(row.interface)
        if interface is not None and isinstance(ctrl, interface):
            return row
    return None


def interface_names() -> str:
    """The controller interfaces, named for messages (``Controller, TreeController, ...``)."""
    return ", ".join(row.interface.rpartition(":")[2] for row in KIND_ROWS.values() if row.interface)


def runs_in(name: str) -> str:
    """`` in WHERE`` for a kind whose policies run outside ``specgym eval`` (:attr:`DecisionKind.runs_in`), else ``""``
    (the tail of the wrong-mode message)."""
    where = kind_row(name).runs_in
    return f" in {where}" if where else ""

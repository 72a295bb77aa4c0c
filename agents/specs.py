"""The one table of controller specs: every prefix with its decision kind, family, factory, usage and `all` rule.

A spec names a controller: ``NAME`` or ``NAME:ARG`` (split at the first ``:``), e.g. ``fixed:4``, ``marginal``,
``ppo:midpair-token``, ``tree-static:2-2-1``, ``table:FILE``. Each row of :data:`TABLE` is an :class:`Entry`:

* ``kind``: the decision it takes, which decides the runner that plays it (``chain``: a draft cap per round, or a
  stop per draft token; ``tree``: a draft tree per round; ``batch``: the draft length of each serving step;
  ``drafter``: the drafter and draft cap of each round, on an engine with several drafters);
* ``family``: ``fixed``, ``rule`` (an analytic or adaptive baseline), ``predictor`` (a rule on a learned acceptance
  predictor), ``learned`` (an exported policy) or ``oracle`` (a clairvoyant plan: a report row, never deployable);
  plots colour rows by it;
* ``factory(arg, k_max)``: builds the controller (a bad ``arg`` raises :class:`SpecgymError`);
* ``in_all(traits, k_max)``: the specs the row adds to ``all`` for a workload with those :class:`Traits`, and
  ``needs``: the traits it needs (a row whose needs are unmet is left out of ``all`` with a note, never run on a
  stand-in of zeros).

:func:`resolve` is the one way a list of specs becomes controllers: it expands ``all`` for the workload, builds each
spec **once**, and returns :class:`Resolved` rows that carry their entry, so runners dispatch on ``entry.kind``,
plots colour by ``entry.family`` and reports say which controllers were left out of ``all`` and why. A bad spec is
one short line naming it and the bad part, pointing to the ``--help`` that lists the valid forms. Users add rows
with :func:`register`.

A ``@DRAFTER`` in a spec's argument picks the ``drafter`` row of a shared prefix: ``fixed:10@ngram`` is the n-gram
drafter alone at K = 10, ``fixed:10`` the chain row (the workload's default drafter). On a tree spec it names who
drafts the trees live: ``tree-eagle:5:3:10@head`` is EAGLE-2's rule on the pair's draft head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import specgym.catalogue as catalogue
from specgym.agents.artifact import load_policy, policy_mode
from specgym.agents.modes import MODES
from specgym.agents.traits import Traits
from specgym.baselines.acceptance_estimators import make_estimator
from specgym.baselines.assc import ASSC
from specgym.baselines.batch_rules import BatchSizeTable, GoodputRule, PerSequence, StaticK
from specgym.baselines.budget_allocator import BudgetAllocator
from specgym.baselines.confidence import ConfidenceStop
from specgym.baselines.cumulative import CumulativeStop
from specgym.baselines.drafter_chain import ChainOnDrafter
from specgym.baselines.drafter_fixed import FixedDrafter
from specgym.baselines.drafter_marginal import DrafterMarginal
from specgym.baselines.drafter_online import DrafterOnline
from specgym.baselines.entropy import EntropyStop
from specgym.baselines.fixed import FixedK
from specgym.baselines.hf_heuristic import HFHeuristic
from specgym.baselines.lookup_rule import LookupRule
from specgym.baselines.lookup_switch import LookupSwitch
from specgym.baselines.marginal import MarginalStop
from specgym.baselines.planned_stop import make_planned
from specgym.baselines.predicted_marginal import make_predicted
from specgym.baselines.sglang_adaptive import SGLangAdaptiveSpec
from specgym.baselines.speclane import SpecLane
from specgym.baselines.tree_chain import ChainAsTree
from specgym.baselines.tree_eagle import EagleTree
from specgym.baselines.tree_eagle_fit import FittedEagleTree
from specgym.baselines.tree_hybrid import TreeHybrid
from specgym.baselines.tree_online import TreeDrafterChoice
from specgym.baselines.tree_predicted import PredictedTree
from specgym.baselines.tree_static import SequoiaTree, StaticTree
from specgym.baselines.trtllm_offswitch import TRTLLMOffSwitch
from specgym.baselines.ucb import UCBBandit
from specgym.baselines.vllm_adaptive import VLLMAdaptiveVerification
from specgym.envs.core.acceptance_predictor import load_draft_predictor
from specgym.envs.core.batch import BatchController
from specgym.envs.core.cost import TREE_NODE_LIMIT
from specgym.envs.core.drafter_choice import parse_drafter_k
from specgym.envs.core.kinds import (
    DRAFTER_KIND,
    EVAL_KINDS,
    FAMILIES,
    HEAD_DRAFTER,
    IMPLICIT_DRAFTER,
    KINDS,
    FamilyName,
    KindName,
    LevelName,
    controller_kind,
    interface_names,
    kind_row,
    runs_in,
)
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.core.run_predictor import load_run_predictor
from specgym.envs.core.tree import TreeController, TreeShape
from specgym.errors import SpecgymError

Factory = Callable[[str | None, int], Any]
"""``factory(arg, k_max)``: ``arg`` is the text after the first ``:`` (None if absent)."""
InAll = Callable[[Traits, int], Sequence[str]]


@dataclass(frozen=True)
class Entry:
    """One row of the table.

    Attributes:
        prefix: The name before ``:`` (lower case).
        kind: The decision kind (:data:`KINDS`).
        family: :data:`FAMILIES`.
        factory: ``factory(arg, k_max) -> controller`` (``None`` for a plan row, e.g. the tree oracle).
        usage: How the spec is written (``K_MAX`` is replaced by the k_max in force).
        in_all: The specs this row adds to ``all`` (None: it never joins).
        needs: Traits (:class:`Traits` flags) the row needs to join ``all``.
        level: ``k`` (one decision per round), ``token`` (a stop per draft token), ``tree`` or ``batch``.
        live: It runs on a live engine (an oracle plans over known outcomes: replay only).
        builtin: Shipped with specgym (False: added by :func:`register`).
    """

    prefix: str
    kind: KindName
    family: FamilyName
    factory: Factory | None
    usage: str
    in_all: InAll | None = None
    needs: tuple[str, ...] = ()
    level: LevelName = "k"
    live: bool = True
    builtin: bool = True


@dataclass
class Resolved:
    """A spec built into its controller, with the row it came from.

    Attributes:
        spec: The spec as written (its report label).
        controller: The controller (``None`` for a plan row such as ``tree-oracle``).
        entry: Its table row.
    """

    spec: str
    controller: Any
    entry: Entry

    @property
    def kind(self) -> KindName:
        """The decision kind (which runner plays it)."""
        return self.entry.kind

    @property
    def family(self) -> FamilyName:
        """fixed, rule, predictor, learned or oracle."""
        return self.entry.family

    @property
    def token_level(self) -> bool:
        """True when the controller stops drafting token by token."""
        return bool(getattr(self.controller, "token_level", False))


@dataclass
class Resolution:
    """What :func:`resolve` returns: the built rows, in order, and why rows were left out of ``all``."""

    rows: list[Resolved] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def specs(self) -> list[str]:
        """The specs, in order."""
        return [r.spec for r in self.rows]


TABLE: dict[tuple[str, str], Entry] = {}  # (kind, prefix) -> entry, in registration order


# ----------------------------------------------------------------------------------------------------- parsing
def split_spec(spec: str) -> tuple[str, str | None]:
    """``(prefix, arg)`` of a spec: the prefix lower-cased, ``arg`` None when there is no ``:``."""
    name, sep, arg = spec.strip().partition(":")
    return name.strip().lower(), (arg.strip() if sep else None)


def parse(specs: str) -> list[str]:
    """The items of a comma-separated spec list, stripped, empty ones dropped (``all`` kept as written).

    Commas inside brackets belong to an inline table: ``table:[[1,64,3],[65,128,1]],goodput`` is two specs.
    """
    items, depth, cur = [], 0, ""
    for ch in specs:
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth <= 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [s.strip() for s in items if s.strip()]


def usage_line(kinds: Sequence[str] = EVAL_KINDS, k_max: int = DEFAULT_K_MAX, live: bool = False) -> str:
    """One line naming every valid spec form of ``kinds`` (``live``: only rows a live engine can run)."""
    forms = [e.usage.replace("K_MAX", str(k_max)) for e in entries(kinds) if e.live or not live]
    return "valid: " + ", ".join(forms) + ", all"


def entries(kinds: Sequence[str] = KINDS) -> list[Entry]:
    """The rows of ``kinds``, in table order."""
    return [e for e in TABLE.values() if e.kind in kinds]


def where_listed(kinds: Sequence[str] = EVAL_KINDS) -> str:
    """Where a user finds every valid spec form of ``kinds`` (an error names the bad part and points here, rather
    than listing 30 forms in one line)."""
    places = {kind_row(kind).runs_in for kind in kinds}  # a kind specgym eval does not run names where it runs
    command = places.pop() if len(places) == 1 and "" not in places else "specgym eval"
    return f"'{command} --help' lists the valid forms"


def _bad(spec: str, why: str, kinds: Sequence[str], k_max: int) -> SpecgymError:
    hint = where_listed(kinds)
    return SpecgymError(f"bad controller spec {spec!r} ({why})" + ("" if hint in why else f"; {hint}"))


def _policy_dir_spec(spec: str) -> str | None:
    """A bare exported-policy folder as the spec of its mode (``ppo:DIR``, ``tree-ppo:DIR``), else None."""
    path = Path(spec.strip())
    if not (path / "policy.json").is_file():
        return None
    mode = MODES.get(policy_mode(path) or "")
    return f"{mode.spec_prefix if mode else 'ppo'}:{spec.strip()}"


def lookup(spec: str, kinds: Sequence[str] = EVAL_KINDS, k_max: int = DEFAULT_K_MAX) -> tuple[str, str | None,
                                                                                               Entry]:
    """``(spec, arg, entry)`` of one spec among the rows of ``kinds`` (the first kind listed wins a shared prefix,
    e.g. ``ppo`` of chain and batch); a bare policy folder becomes its mode's ``ppo:DIR`` spec."""
    if not isinstance(spec, str):
        raise SpecgymError(f"controller spec: expected a string such as 'fixed:4' or 'ppo:NAME', got {spec!r}")
    spec = _policy_dir_spec(spec) or spec.strip()
    if len(parse(spec)) > 1:
        raise SpecgymError(f"controller spec {spec!r}: one spec expected, got a comma-separated list")
    prefix, arg = split_spec(spec)
    if arg is not None and "@" in arg and (DRAFTER_KIND, prefix) in TABLE:
        if DRAFTER_KIND in kinds:
            return spec, arg, TABLE[(DRAFTER_KIND, prefix)]
        raise _bad(spec, "'@DRAFTER' picks a drafter, which only specgym eval does, on a workload with several "
                         "drafters", kinds, k_max)
    inner, at, drafter = spec.rpartition("@")
    wrapped = (kind_row(DRAFTER_KIND).wraps, split_spec(inner)[0])  # marginal@head: a chain rule on one drafter
    if at and drafter.strip() and wrapped in TABLE and (DRAFTER_KIND, ON_DRAFTER) in TABLE:
        if DRAFTER_KIND in kinds:  # a chain rule deciding one drafter's K (marginal@head)
            return spec, spec, TABLE[(DRAFTER_KIND, ON_DRAFTER)]
        raise _bad(spec, "'@DRAFTER' picks a drafter, which needs a workload or engine with several drafters", kinds,
                   k_max)
    for kind in kinds:
        entry = TABLE.get((kind, prefix))
        if entry is not None:
            return spec, arg, entry
        base, at, drafter = prefix.rpartition("@")
        if at and arg is None and kind_row(kind).drafts_trees and (kind, base) in TABLE:  # tree-hybrid@head
            return spec, f"@{drafter}", TABLE[(kind, base)]
    other = [k for k in KINDS if k not in kinds and (k, prefix) in TABLE]
    why = (f"a {other[0]} controller, not {' or '.join(kinds)}" if other else f"unknown controller {prefix!r}")
    raise _bad(spec, why, kinds, k_max)


def build(spec: str, k_max: int = DEFAULT_K_MAX, kinds: Sequence[str] = EVAL_KINDS) -> Resolved:
    """Build one spec (see the module docstring); a bad spec raises one line listing the valid forms."""
    spec, arg, entry = lookup(spec, kinds, k_max)
    if entry.factory is None:
        if arg is not None:
            raise _bad(spec, "takes no argument", kinds, k_max)
        return Resolved(spec, None, entry)
    tree_drafter = None
    if arg is not None and "@" in arg and kind_row(entry.kind).drafts_trees:  # tree-eagle:5:3:10@head
        arg, _, tree_drafter = arg.rpartition("@")
        tree_drafter = tree_drafter.strip().lower()
        if tree_drafter not in TREE_DRAFTERS:
            raise _bad(spec, f"a tree is drafted by the draft model or @{HEAD_DRAFTER}, not @{tree_drafter}", kinds,
                       k_max)
        arg = arg or None
    try:
        ctrl = entry.factory(arg, k_max)
    except SpecgymError as exc:
        if str(exc).startswith("bad controller spec"):  # an inner spec (per-seq:SPEC, tree-chain:SPEC) named it
            raise SpecgymError(f"{spec}: {exc}") from None
        raise _bad(spec, str(exc), kinds, k_max) from None
    if tree_drafter is not None and tree_drafter != IMPLICIT_DRAFTER:
        ctrl.drafter, ctrl.name = tree_drafter, f"{ctrl.name}@{tree_drafter}"
    return Resolved(spec, ctrl, _mode_entry(ctrl, entry))


def kind_of(spec: str, kinds: Sequence[str] = EVAL_KINDS) -> KindName:
    """The decision kind of a spec's row (``chain``, ``tree``...)."""
    return lookup(spec, kinds)[2].kind


def row_of(spec: str, kinds: Sequence[str] = EVAL_KINDS) -> Entry:
    """The table row a spec names (its kind, family, level...): what code asks instead of the spec's prefix."""
    return lookup(spec, kinds)[2]


def make(spec: str, k_max: int = DEFAULT_K_MAX, kinds: Sequence[str] = ("chain",)) -> Any:
    """The controller one spec names (default: a chain controller, what :func:`specgym.make_controller` gives)."""
    return build(spec, k_max, kinds).controller


def _mode_entry(ctrl: Any, entry: Entry) -> Entry:
    """A learned row's kind and level follow the policy it loaded: the kind whose interface its controller
    implements (``ppo:`` names chain, drafter and batch policies alike), and K or token mode within a chain."""
    built = controller_kind(ctrl) if entry.family == "learned" else None
    if built is not None and built.name != entry.kind:
        return Entry(**{**entry.__dict__, "kind": built.name, "level": built.level})
    if entry.family == "learned" and kind_row(entry.kind).per_token:
        level = "token" if getattr(ctrl, "token_level", False) else "k"
        if level != entry.level:
            return Entry(**{**entry.__dict__, "level": level})
    return entry


# ---------------------------------------------------------------------------------------------------- `all`
def expand(specs: str | Sequence[str], k_max: int = DEFAULT_K_MAX, traits: Traits | None = None,
           kinds: Sequence[str] = EVAL_KINDS, live: bool = False) -> tuple[list[str], list[str]]:
    """Specs with ``all`` expanded for ``traits`` (default: a workload with every trait but no predictor), in
    order, deduplicated, each checked to name a row; and the notes on rows left out of ``all``.

    Args:
        live: Only rows a live engine can run join ``all`` (the live bench).
    """
    traits = traits or Traits.anything()
    items = parse(specs) if isinstance(specs, str) else [s.strip() for s in specs if s.strip()]
    out: list[str] = []
    notes: list[str] = []
    for item in items:
        if item.lower() == "all":
            expanded, left = all_specs(traits, k_max, kinds, live)
            notes += [n for n in left if n not in notes]
        else:
            expanded = [lookup(item, kinds, k_max)[0]]
        out.extend(s for s in expanded if s not in out)
    if not out:
        raise SpecgymError(f"no controller spec given; {where_listed(kinds)}")
    return out, notes


def all_specs(traits: Traits, k_max: int = DEFAULT_K_MAX, kinds: Sequence[str] = EVAL_KINDS,
              live: bool = False) -> tuple[list[str], list[str]]:
    """What ``all`` means for a workload with ``traits``: every joining row's specs, in table order; and one note
    per row left out for an unmet need."""
    specs: list[str] = []
    left: dict[str, list[str]] = {}  # why -> the rows left out for it
    for e in entries(kinds):
        if e.in_all is None or (live and not e.live):
            continue
        missing = [n for n in e.needs if not traits.has(n)]
        if missing:
            if traits.say_missing(missing):
                left.setdefault(traits.describe_missing(missing), []).append(e.prefix)
            continue
        specs += [s for s in e.in_all(traits, k_max) if s not in specs]
    return specs, [f"{', '.join(rows)}: {why}" for why, rows in left.items()]


def resolve(specs: str | Resolution | Sequence[Any], k_max: int = DEFAULT_K_MAX, workload: Any = None,
            kinds: Sequence[str] = EVAL_KINDS, live: bool = False) -> Resolution:
    """Build every controller a list names, each spec once; ``all`` is expanded for ``workload``'s traits.

    ``specs``: a comma-separated string, or a sequence of specs, built controllers (a controller of your own, an
    in-memory policy: its entry follows its type) and already resolved rows or ``(label, controller)`` pairs.
    """
    if isinstance(specs, Resolution):
        return specs
    traits = Traits.of(workload) if workload is not None else None
    res = Resolution()
    items = [specs] if isinstance(specs, str) else list(specs)
    for item in items:
        if isinstance(item, Resolved):
            res.rows.append(item)
        elif isinstance(item, tuple):
            label, ctrl = item
            res.rows.append(Resolved(label, ctrl, entry_of(ctrl, label)))
        elif isinstance(item, str):
            names, notes = expand(item, k_max, traits, kinds, live)
            res.notes += [n for n in notes if n not in res.notes]
            res.rows += [build(s, k_max, kinds) for s in names]
        else:
            res.rows.append(Resolved(getattr(item, "name", type(item).__name__), item, entry_of(item)))
    if not res.rows:
        raise SpecgymError(f"no controller spec given; {where_listed(kinds)}")
    return res


def entry_of(ctrl: Any, label: str | None = None) -> Entry:
    """The row of an object built outside the table: its kind is the one whose controller interface it implements
    (:func:`~specgym.envs.core.kinds.controller_kind`); a plan row such as ``tree-oracle`` is found by label."""
    if ctrl is None:
        return lookup(label or "tree-oracle", KINDS)[2]
    row = controller_kind(ctrl)
    if row is None:
        raise SpecgymError(f"{ctrl!r} is not a controller (it implements none of {interface_names()})")
    own = getattr(ctrl, "family", None)
    family: FamilyName = own if own in FAMILIES else ("fixed" if type(ctrl) is FixedK else
                                                      "learned" if hasattr(ctrl, "artifact") else "rule")
    level: LevelName = "token" if getattr(ctrl, "token_level", False) else row.level
    return Entry(getattr(ctrl, "name", "controller"), row.name, family, None, "", level=level, builtin=False)


def register(prefix: str, factory: Factory, usage: str | None = None, *, kind: KindName = "chain",
             family: FamilyName = "rule", in_all: InAll | None = None, needs: Iterable[str] = (),
             level: LevelName = "k", live: bool = True,
             replace: bool = False) -> Entry:
    """Add a row: ``prefix`` / ``prefix:ARG`` becomes a valid spec of ``kind`` (see :class:`Entry`).

    Raises:
        SpecgymError: An invalid prefix, kind or family, or a prefix already taken (without ``replace``).
    """
    if not prefix or any(ch in prefix for ch in ":, ") or prefix != prefix.lower() or prefix == "all":
        raise SpecgymError(f"invalid controller prefix {prefix!r}")
    if kind not in KINDS or family not in FAMILIES:
        raise SpecgymError(f"controller prefix {prefix!r}: kind must be one of {KINDS}, family one of {FAMILIES}")
    if (kind, prefix) in TABLE and not replace:
        raise SpecgymError(f"controller prefix {prefix!r} is already registered")
    bad_needs = sorted(set(needs) - set(Traits.FLAGS))
    if bad_needs:
        raise SpecgymError(f"controller prefix {prefix!r}: unknown needs {bad_needs}; known {Traits.FLAGS}")
    entry = Entry(prefix, kind, family, factory, usage or f"{prefix}:ARG", in_all, tuple(needs), level, live,
                  builtin=False)
    TABLE[(kind, prefix)] = entry
    return entry


# -------------------------------------------------------------------------------------------------- factories
def _float(arg: str, what: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    try:
        value = float(arg)
    except ValueError:
        raise SpecgymError(f"{what} must be a number, got {arg!r}") from None
    if not (lo <= value <= hi):
        raise SpecgymError(f"{what} must be in [{lo:g}, {hi:g}], got {arg!r}")
    return value


def _ints(arg: str, sep: str) -> list[int]:
    try:
        return [int(x) for x in arg.split(sep)]
    except ValueError:
        raise SpecgymError("integers expected") from None


def _no_arg(make_one: Callable[[], Any]) -> Factory:
    def factory(arg: str | None, k_max: int) -> Any:
        if arg is not None:
            raise SpecgymError("takes no argument")
        return make_one()

    return factory


def _fixed(arg: str | None, k_max: int) -> FixedK:
    if arg is None or not arg.isdigit() or int(arg) > k_max:
        raise SpecgymError(f"fixed needs an integer K in 0..{k_max}, got {arg!r}")
    return FixedK(int(arg))


def _assc(arg: str | None, k_max: int) -> ASSC:
    """``assc`` gets the range [2, k_max] (the write-up's [2, 8] is its example for k_max = 8)."""
    if arg is not None:
        raise SpecgymError("takes no argument")
    return ASSC(k_max=max(2, k_max))


def _speclane(arg: str | None, k_max: int) -> SpecLane:
    if arg is None:
        return SpecLane()
    if arg == "ratio":
        ctrl = SpecLane(estimator="ratio")
        ctrl.name = "speclane:ratio"
        return ctrl
    raise SpecgymError(f"speclane takes no argument or 'ratio', got {arg!r}")


def _confidence(arg: str | None, k_max: int) -> ConfidenceStop:
    if arg is not None and arg.lower() == "adaptive":
        return ConfidenceStop(adaptive=True)
    return ConfidenceStop(tau=0.4 if arg is None else _float(arg, "confidence TAU", 0.0, 1.0))


def _entropy(arg: str | None, k_max: int) -> EntropyStop:
    if arg is None:
        return EntropyStop()
    lam, _, gamma = arg.partition(":")
    return EntropyStop(lam=_float(lam, "entropy LAM", 0.0, 1.0),
                       gamma=_float(gamma, "entropy GAMMA", 0.0) if gamma else 0.2)


def _policy(prefix: str) -> Factory:
    """``ppo:NAME|DIR`` / ``tree-ppo:NAME|DIR``: an exported policy, built as its mode's controller."""
    def factory(arg: str | None, k_max: int) -> Any:
        if not arg:
            raise SpecgymError(f"{prefix} needs a shipped policy name or an exported policy folder, e.g. "
                               f"{prefix}:runs/NAME/policy")
        artifact = load_policy(catalogue.resolve("policy", arg))
        mode = MODES[artifact.mode]
        if mode.spec_prefix != prefix:
            raise SpecgymError(f"{arg} is a {artifact.mode}-mode policy: name it {mode.spec_prefix}:{arg}"
                               + runs_in(mode.kind))
        return mode.controller(artifact, f"{prefix}:{arg}", k_max)

    return factory


def _chain_policy(arg: str | None, k_max: int) -> Any:
    ctrl = _policy("ppo")(arg, k_max)
    if isinstance(ctrl, BatchController):
        raise SpecgymError(f"{arg} is a batch-mode policy: it chooses K for serving steps (specgym tune compare "
                           f"--controllers ppo:{arg})")
    return ctrl


def _batch_policy(arg: str | None, k_max: int) -> Any:
    ctrl = _policy("ppo")(arg, k_max)
    if not isinstance(ctrl, BatchController):
        raise SpecgymError(f"{arg} is not a batch-mode policy: per-seq:ppo:{arg} runs it on every sequence")
    return ctrl


def _predictors(traits: Traits, k_max: int) -> list[str]:
    return [f"predicted:{p}" for p in traits.predictors]


def _planned_all(traits: Traits, k_max: int) -> list[str]:
    return [f"planned:{p}" for p in traits.planned]


def _tree_static(arg: str | None, k_max: int) -> StaticTree:
    if not arg:
        raise SpecgymError("tree-static needs per-depth widths, e.g. tree-static:2-2-1")
    tree = TreeShape.from_widths(_ints(arg, "-"))
    if tree.depth > k_max:
        raise SpecgymError(f"depth {tree.depth} above k_max {k_max}")
    return StaticTree(tree)


def _tree_sequoia(arg: str | None, k_max: int) -> SequoiaTree:
    budget = _ints(arg, ":")[0] if arg is not None else TREE_NODE_LIMIT
    if not 1 <= budget <= TREE_NODE_LIMIT:
        raise SpecgymError(f"BUDGET must be in 1..{TREE_NODE_LIMIT}")
    return SequoiaTree(budget, k_max)


def _tree_eagle(arg: str | None, k_max: int) -> EagleTree:
    if arg is not None and arg.strip().lower() == "fit":  # tree-eagle:fit[@DRAFTER]: fitted in prepare
        return FittedEagleTree(k_max)
    if arg is not None and (len(arg.split(":")) != 3 or not all(p.strip().isdigit() for p in arg.split(":"))):
        raise SpecgymError(f"tree-eagle takes DEPTH:BEAM:M (e.g. tree-eagle:3:3:3), or fit to fit them on the fit "
                           f"split (tree-eagle:fit@head), got {arg!r}")
    depth, beam, m = _ints(arg, ":") if arg is not None else (5, 4, 16)
    if depth > k_max or m > TREE_NODE_LIMIT:
        raise SpecgymError(f"DEPTH <= k_max {k_max}, M <= {TREE_NODE_LIMIT}")
    return EagleTree(depth, beam, m)


def _tree_chain(arg: str | None, k_max: int) -> ChainAsTree:
    if not arg:
        raise SpecgymError("tree-chain needs a chain controller spec, e.g. tree-chain:marginal")
    return ChainAsTree(make(arg, k_max))


def _tree_hybrid(arg: str | None, k_max: int) -> TreeHybrid:
    """``tree-hybrid[:M:KN][:TREE_SPEC]`` (the ``@DRAFTER`` of the inner trees is taken off by :func:`build`)."""
    parts = (arg or "").split(":")
    m = kn = None
    if len(parts) >= 2 and parts[0].strip().isdigit() and parts[1].strip().isdigit():
        m, kn = int(parts[0]), int(parts[1])
        parts = parts[2:]
    elif parts[0].strip().isdigit():
        raise SpecgymError(f"tree-hybrid takes M:KN (both, e.g. tree-hybrid:2:8) before an optional tree spec, got "
                           f"{arg!r}")
    inner = ":".join(parts).strip() or "tree-eagle:fit"
    if "@" in inner:
        raise SpecgymError(f"tree-hybrid names its drafter at the end (tree-hybrid:{inner.replace('@', '')}"
                           f"@{inner.rpartition('@')[2]}), not inside, got {arg!r}")
    ctrl = build(inner, k_max, ("tree",)).controller
    if not isinstance(ctrl, TreeController) or isinstance(ctrl, TreeHybrid):
        raise SpecgymError(f"tree-hybrid's model side is a tree controller other than itself, got {inner!r}")
    return TreeHybrid(ctrl, m, kn, k_max)


def _tree_online(arg: str | None, k_max: int) -> TreeDrafterChoice:
    """``tree-online[:TREE_SPEC]`` (the ``@DRAFTER`` of the trees is taken off by :func:`build`)."""
    inner = (arg or "").strip() or "tree-eagle:fit"
    if "@" in inner:
        raise SpecgymError(f"tree-online names its drafter at the end (tree-online:{inner.replace('@', '')}"
                           f"@{inner.rpartition('@')[2]}), not inside, got {arg!r}")
    tree = build(inner, k_max, ("tree",)).controller
    if not isinstance(tree, TreeController) or isinstance(tree, (TreeHybrid, TreeDrafterChoice)):
        raise SpecgymError(f"tree-online's head rounds are a tree controller's (not a hybrid), got {inner!r}")
    return TreeDrafterChoice(DrafterOnline(), tree, "tree-online" + ("" if arg is None else f":{inner}"))


def _tree_predicted(arg: str | None, k_max: int) -> PredictedTree:
    if not arg:
        raise SpecgymError("tree-predicted needs a predictor, e.g. tree-predicted:midpair")
    name = f"tree-predicted:{arg}"
    return PredictedTree(load_draft_predictor(catalogue.resolve("predictor", arg), name), name, k_max)


def _static(arg: str | None, k_max: int) -> StaticK:
    if arg is None or not arg.isdigit() or int(arg) > k_max:
        raise SpecgymError(f"static needs K in 0..{k_max}")
    return StaticK(int(arg))


def _table(arg: str | None, k_max: int) -> BatchSizeTable:
    if not arg:
        raise SpecgymError("table needs a vLLM table, e.g. table:[[1,4,4],[5,512,1]] or table:FILE")
    return BatchSizeTable.parse(arg)


def _per_seq(arg: str | None, k_max: int) -> PerSequence:
    if not arg:
        raise SpecgymError("per-seq needs a chain controller spec, e.g. per-seq:marginal")
    make(arg, k_max)  # a bad inner spec fails now
    return PerSequence(lambda: make(arg, k_max), f"per-seq:{arg}")


def _trtllm_off(arg: str | None, k_max: int) -> TRTLLMOffSwitch:
    if arg is None:
        return TRTLLMOffSwitch(min(3, k_max), 32)
    parts = arg.split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) > k_max or int(parts[1]) < 1:
        raise SpecgymError(f"trtllm-off needs K:MAX_CONCURRENCY with K in 0..{k_max}, e.g. trtllm-off:3:32")
    return TRTLLMOffSwitch(int(parts[0]), int(parts[1]))


def _fixed_drafter(arg: str | None, k_max: int) -> FixedDrafter:
    if arg is None:
        raise SpecgymError(f"fixed needs K@DRAFTER with K in 0..{k_max}, e.g. fixed:10@ngram")
    k, drafter = parse_drafter_k(arg, k_max)
    return FixedDrafter(drafter, k)


def _fixed_drafter_all(traits: Traits, k_max: int) -> list[str]:
    """Every drafter but the default (whose fixed K are the chain rows) alone at K = 1..k_max."""
    return [f"fixed:{k}@{d}" for d in traits.drafters[1:] for k in range(1, k_max + 1)]


def _lookup_rule(arg: str | None, k_max: int) -> LookupRule:
    if arg is not None and not arg.isdigit():
        raise SpecgymError(f"lookup-rule takes a match length N in 1..4, got {arg!r}")
    return LookupRule(3 if arg is None else int(arg))


#: Who may draft a tree (``TREE_SPEC@DRAFTER``; a head tree replays from a recording with ``ranks_head``).
TREE_DRAFTERS = (IMPLICIT_DRAFTER, HEAD_DRAFTER)
#: The row of ``SPEC@DRAFTER`` where ``SPEC`` is a chain rule (``marginal@head``): keyed by its ``@``.
ON_DRAFTER = "@"


def _on_drafter(arg: str | None, k_max: int) -> ChainOnDrafter:
    inner, _, drafter = (arg or "").rpartition("@")
    return ChainOnDrafter(build(inner, k_max, (kind_row(DRAFTER_KIND).wraps,)).controller, drafter.strip().lower())


def _on_drafter_all(traits: Traits, k_max: int) -> list[str]:
    """The marginal rule on every drafter but the default (whose adaptive K are the chain rows)."""
    return [f"marginal@{d}" for d in traits.drafters[1:]]


def _lookup_switch(arg: str | None, k_max: int) -> LookupSwitch:
    if arg is None:
        return LookupSwitch(k_max=k_max)
    body, _, model = arg.partition("@")
    parts = body.split(":")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise SpecgymError(f"lookup-switch takes M:KN:KH[@MODEL] (e.g. lookup-switch:2:8:3@head), or nothing to fit "
                           f"them, got {arg!r}")
    m, kn, kh = (int(p) for p in parts)
    if not 1 <= m <= 4 or not 1 <= kn <= k_max or not 1 <= kh <= k_max:
        raise SpecgymError(f"lookup-switch:M:KN:KH needs M in 1..4 and KN, KH in 1..{k_max}, got {arg!r}")
    return LookupSwitch(m, kn, kh, model.strip().lower() or None)


def _on_run_predictor(rule: type[DrafterMarginal]) -> Factory:
    """``PREFIX[:FILE]``: a rule on a run predictor, fitted in its ``prepare`` or loaded from FILE."""
    def make_rule(arg: str | None, k_max: int) -> DrafterMarginal:
        if arg is None:
            return rule()
        ctrl = rule(load_run_predictor(arg))
        ctrl.name = f"{ctrl.name}:{arg}"
        return ctrl
    return make_rule


def _fixed_all(traits: Traits, k_max: int) -> list[str]:
    return [f"fixed:{k}" for k in range(1, k_max + 1)]


def _const(*specs: str) -> InAll:
    return lambda traits, k_max: specs


def _tree_predicted_all(traits: Traits, k_max: int) -> list[str]:
    return [f"tree-predicted:{p}" for p in traits.predictors]


for _row in (
    # chain: one draft cap per round (level k) or a stop after each draft token (level token)
    Entry("marginal", "chain", "rule", lambda a, k: MarginalStop(1.0 if a is None else
                                                                 _float(a, "marginal THRESHOLD", 0.0, 10.0)),
          "marginal[:THRESHOLD]", _const("marginal"), level="token"),
    Entry("assc", "chain", "rule", _assc, "assc", _const("assc")),
    Entry("speclane", "chain", "rule", _speclane, "speclane[:ratio]", _const("speclane")),
    Entry("hf-heuristic", "chain", "rule", _no_arg(HFHeuristic), "hf-heuristic", _const("hf-heuristic")),
    Entry("confidence", "chain", "rule", _confidence, "confidence[:TAU|:adaptive]",
          _const("confidence:0.4", "confidence:adaptive"), needs=("conf",), level="token"),
    Entry("cumulative", "chain", "rule", lambda a, k: CumulativeStop(0.3 if a is None else
                                                                     _float(a, "cumulative H", 0.0, 1.0)),
          "cumulative[:H]", _const("cumulative:0.3"), needs=("conf",), level="token"),
    Entry("entropy", "chain", "rule", _entropy, "entropy[:LAM[:GAMMA]]", _const("entropy"), needs=("conf",),
          level="token"),
    Entry("ucb", "chain", "rule", _no_arg(UCBBandit), "ucb", _const("ucb")),
    Entry("predicted", "chain", "predictor", lambda a, k: make_predicted(a, k),
          "predicted:NAME|FILE (acceptance predictor; FILE@head: one trained on the draft head's tokens)", _predictors,
          needs=("predictor",), level="token"),
    Entry("planned", "chain", "predictor", lambda a, k: make_planned(a, k),
          "planned:NAME|FILE (optimal stopping on an acceptance predictor)", _planned_all, needs=("predictor",),
          level="token"),
    Entry("fixed", "chain", "fixed", _fixed, "fixed:K (K=0..K_MAX)", _fixed_all),
    Entry("ppo", "chain", "learned", _chain_policy, "ppo:NAME|DIR (exported policy)"),
    # tree: a draft tree per round
    Entry("tree-sequoia", "tree", "rule", _tree_sequoia, "tree-sequoia[:BUDGET]", _const("tree-sequoia"),
          needs=("tree",), level="tree"),
    Entry("tree-eagle", "tree", "rule", _tree_eagle,
          "tree-eagle[:DEPTH:BEAM:M|:fit] (EAGLE-2's rule, default 5:4:16; fit: all three fitted on the fit split)",
          _const("tree-eagle"),
          needs=("tree",), level="tree"),
    Entry("tree-static", "tree", "fixed", _tree_static, "tree-static:W1-W2-..", _const("tree-static:2-2-1"),
          needs=("tree",), level="tree"),
    Entry("tree-oracle", "tree", "oracle", None, "tree-oracle (the clairvoyant limit, replay only)",
          _const("tree-oracle"), needs=("tree",), level="tree", live=False),
    Entry("tree-predicted", "tree", "predictor", _tree_predicted, "tree-predicted:NAME|FILE",
          _tree_predicted_all, needs=("tree", "predictor"), level="tree", live=False),
    Entry("tree-hybrid", "tree", "rule", _tree_hybrid,
          "tree-hybrid[:M:KN][:TREE_SPEC][@DRAFTER] (prompt lookup at KN on a context match of M+ tokens, else the "
          "tree of TREE_SPEC, default tree-eagle:fit; M and KN fitted on the fit split when not given)",
          needs=("tree",), level="tree"),
    Entry("tree-online", "tree", "predictor", _tree_online,
          "tree-online[:TREE_SPEC]@head (drafter-online picks prompt lookup's chain, the head's tree of TREE_SPEC, "
          "default tree-eagle:fit, or plain decoding every round)", needs=("tree",), level="tree"),
    Entry("tree-chain", "tree", "rule", _tree_chain, "tree-chain:SPEC (a chain controller as width-1 trees)",
          level="tree"),
    Entry("tree-ppo", "tree", "learned", _policy("tree-ppo"), "tree-ppo:NAME|DIR (exported tree policy)",
          level="tree"),
    # drafter: the drafter and draft cap of each round (a workload with several drafters)
    Entry("fixed", "drafter", "fixed", _fixed_drafter, "fixed:K@DRAFTER (one drafter alone)", _fixed_drafter_all,
          needs=("drafters",), level="drafter"),
    Entry("lookup-rule", "drafter", "rule", _lookup_rule,
          "lookup-rule[:N] (n-gram when the last N tokens occurred earlier, else the model drafter at K=10)",
          _const("lookup-rule:3"), needs=("drafters",), level="drafter"),
    Entry(ON_DRAFTER, "drafter", "rule", _on_drafter,
          "SPEC@DRAFTER (a chain rule deciding one drafter's K each round: marginal@head, assc@ngram)",
          _on_drafter_all, needs=("drafters",), level="drafter"),
    Entry("lookup-switch", "drafter", "rule", _lookup_switch,
          "lookup-switch[:M:KN:KH[@MODEL]] (n-gram at KN when the last M tokens occurred earlier, else the model "
          "drafter at KH; all four fitted on the fit split when not given)",
          _const("lookup-switch"), needs=("drafters",), level="drafter"),
    Entry("drafter-marginal", "drafter", "predictor", _on_run_predictor(DrafterMarginal),
          "drafter-marginal[:FILE] (most predicted tokens per ms over every drafter and K; its run predictor "
          "fitted on the train split, or FILE from specgym predictor train-runs)",
          _const("drafter-marginal"), needs=("drafters",), level="drafter"),
    Entry("drafter-online", "drafter", "predictor", _on_run_predictor(DrafterOnline),
          "drafter-online[:FILE] (drafter-marginal with each drafter's runs calibrated to the request as it is "
          "decoded, counterfactual runs included; stops drafting for a request where drafting lost against plain "
          "decoding, probing rarely)",
          _const("drafter-online"), needs=("drafters",), level="drafter"),
    Entry("drafter-oracle", "drafter", "oracle", None,
          "drafter-oracle (the clairvoyant drafter and K of every round, replay only)", _const("drafter-oracle"),
          needs=("drafters",), level="drafter", live=False),
    Entry("round-oracle", "drafter", "oracle", None,
          "round-oracle (the clairvoyant drafter and K of each round on its own, no planning: the limit of a "
          "per-round rate rule; replay only)", _const("round-oracle"), needs=("drafters",), level="drafter",
          live=False),
    # batch: the draft length of each serving step
    Entry("static", "batch", "fixed", _static, "static:K", lambda t, k: [f"static:{i}" for i in range(k + 1)],
          level="batch"),
    Entry("table", "batch", "rule", _table, "table:[[start,end,K],...]|FILE (a vLLM table)", level="batch"),
    Entry("goodput", "batch", "rule", _no_arg(GoodputRule), "goodput", _const("goodput"), level="batch"),
    Entry("per-seq", "batch", "rule", _per_seq, "per-seq:SPEC (a chain controller per sequence)",
          _const("per-seq:assc"), level="batch"),
    Entry("vllm-adaptive", "batch", "rule", lambda a, k: VLLMAdaptiveVerification(make_estimator(a, "ema")),
          "vllm-adaptive[:ema|pos-ema|logistic|predictor:NAME] (vLLM adaptive verification)",
          lambda t, k: ["vllm-adaptive:ema", "vllm-adaptive:logistic",
                        *(f"vllm-adaptive:predictor:{p}" for p in t.predictors)], level="batch"),
    Entry("sglang-adaptive", "batch", "rule", _no_arg(SGLangAdaptiveSpec), "sglang-adaptive (SGLang EMA tiers)",
          _const("sglang-adaptive"), level="batch"),
    Entry("trtllm-off", "batch", "rule", _trtllm_off, "trtllm-off[:K:MAX_CONCURRENCY]", _const("trtllm-off:3:32"),
          level="batch"),
    Entry("budget", "batch", "predictor", lambda a, k: BudgetAllocator(make_estimator(a, "logistic")),
          "budget[:logistic|ema|pos-ema|predictor:NAME] (specgym's allocator)",
          lambda t, k: ["budget:logistic", *(f"budget:predictor:{p}" for p in t.predictors)], level="batch"),
    Entry("ppo", "batch", "learned", _batch_policy, "ppo:NAME|DIR (exported batch policy)", level="batch"),
    Entry("alloc-ppo", "batch", "learned", _policy("alloc-ppo"),
          "alloc-ppo:NAME|DIR (exported learned allocator: the budget of budget:logistic per step)", level="batch"),
):
    TABLE[(_row.kind, _row.prefix)] = _row


"""Controller specs: the strings the CLI and the evaluation harness use to name a controller.

Grammar: ``NAME`` or ``NAME:ARG`` (split at the first ``:``). Built in:
``fixed:K`` (0..k_max), ``assc``, ``speclane[:ratio]``, ``hf-heuristic``, ``confidence[:TAU|:adaptive]``,
``cumulative[:H]``, ``entropy[:LAM[:GAMMA]]``, ``ucb``, ``marginal[:THRESHOLD]``, ``ppo:NAME_OR_DIR`` (an
exported policy: a shipped policy's name or a folder; a bare policy folder works too) and ``predicted:NAME_OR_FILE``
(the marginal rule on a learned acceptance predictor). ``all`` (in
:func:`expand_specs`) = every baseline with its defaults plus ``fixed:1..fixed:k_max``. ``assc`` gets the range
[2, k_max] (the write-up's [2, 8] is its example for k_max = 8); the other adaptive baselines cap at the request's
``ctx.k_max``. Users add their own prefixes with :func:`register_prefix`. Every bad spec raises
:class:`SpecgymError` with one line listing the valid forms.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specgym.agents.artifact import load_policy
from specgym.agents.planned_stop import make_planned
from specgym.agents.policy_controller import PolicyController
from specgym.agents.predicted_marginal import make_predicted
from specgym.baselines.assc import ASSC
from specgym.baselines.confidence import ConfidenceStop
from specgym.baselines.cumulative import CumulativeStop
from specgym.baselines.entropy import EntropyStop
from specgym.baselines.fixed import FixedK
from specgym.baselines.hf_heuristic import HFHeuristic
from specgym.baselines.marginal import MarginalStop
from specgym.baselines.speclane import SpecLane
from specgym.baselines.ucb import UCBBandit
import specgym.catalogue as catalogue
from specgym.envs.core.controller import Controller
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.errors import SpecgymError

Factory = Callable[[str | None, int], Controller]
"""``factory(arg, k_max)``: ``arg`` is the text after the first ``:`` (None if absent)."""


@dataclass(frozen=True)
class _Entry:
    factory: Factory
    usage: str
    builtin: bool


_REGISTRY: dict[str, _Entry] = {}

ALL_BASELINES = (
    "marginal",
    "assc",
    "speclane",
    "hf-heuristic",
    "confidence:0.4",
    "confidence:adaptive",
    "cumulative:0.3",
    "entropy",
    "ucb",
)


def register_prefix(prefix: str, factory: Factory, usage: str | None = None, *, replace: bool = False) -> None:
    """Make ``prefix`` / ``prefix:ARG`` a valid spec.

    Args:
        prefix: The name before ``:`` (lower case, no ``:`` or ``,``).
        factory: ``factory(arg, k_max) -> Controller``; raise :class:`SpecgymError` on a bad ``arg``.
        usage: How the spec is written, shown in error messages (default ``prefix:ARG``).
        replace: Allow re-registering an existing prefix.
    """
    if not prefix or any(ch in prefix for ch in ":, ") or prefix != prefix.lower() or prefix == "all":
        raise SpecgymError(f"invalid controller prefix {prefix!r}")
    if prefix in _REGISTRY and not replace:
        raise SpecgymError(f"controller prefix {prefix!r} is already registered")
    _REGISTRY[prefix] = _Entry(factory, usage or f"{prefix}:ARG", builtin=False)


def valid_specs_line(k_max: int = DEFAULT_K_MAX) -> str:
    """One line naming every valid spec form."""
    forms = [e.usage.replace("K_MAX", str(k_max)) for e in _REGISTRY.values()]
    return "valid: " + ", ".join(forms) + ", all"


def _bad(spec: str, why: str, k_max: int) -> SpecgymError:
    return SpecgymError(f"bad controller spec {spec!r} ({why}); {valid_specs_line(k_max)}")


def _split(spec: str) -> tuple[str, str | None]:
    name, sep, arg = spec.strip().partition(":")
    return name.strip().lower(), (arg.strip() if sep else None)


def _is_policy_dir(spec: str) -> bool:
    return (Path(spec) / "policy.json").is_file()


def _lookup(spec: str, k_max: int) -> tuple[str, str | None, _Entry]:
    """``(spec, arg, entry)``: a bare policy folder becomes ``ppo:DIR``; an unknown name is a one-line error."""
    if _is_policy_dir(spec):
        spec = f"ppo:{spec}"
    name, arg = _split(spec)
    entry = _REGISTRY.get(name)
    if entry is None:
        raise _bad(spec, f"unknown controller {name!r}", k_max)
    return spec, arg, entry


def make_controller(spec: str, k_max: int = DEFAULT_K_MAX) -> Controller:
    """Build the controller a spec names (see the module docstring for the grammar).

    Raises:
        SpecgymError: Unknown name or bad argument; the message lists the valid forms on one line.
    """
    if not isinstance(spec, str):
        raise SpecgymError(f"controller spec: expected a string such as 'fixed:4' or 'ppo:NAME', got {spec!r}")
    spec, arg, entry = _lookup(spec, k_max)
    try:
        return entry.factory(arg, k_max)
    except SpecgymError as exc:
        raise _bad(spec, str(exc), k_max) from None


def expand_specs(specs: str, k_max: int = DEFAULT_K_MAX, extra_all: tuple[str, ...] = ()) -> list[str]:
    """Expand a comma-separated list of specs (``all`` included) into validated specs, in order, deduplicated.

    Built-in specs are validated by building them (cheap); registered prefixes are only checked to exist, so
    expanding does not load e.g. a PPO policy. ``extra_all`` joins ``all`` (e.g. ``predicted:midpair`` where a
    predictor for the workload's pair is shipped).
    """
    out: list[str] = []
    for item in specs.split(","):
        item = item.strip()
        if not item:
            continue
        if item.lower() == "all":
            expanded = [*ALL_BASELINES, *extra_all, *(f"fixed:{k}" for k in range(1, k_max + 1))]
        else:
            item, _, entry = _lookup(item, k_max)
            if entry.builtin:
                make_controller(item, k_max)
            expanded = [item]
        out.extend(s for s in expanded if s not in out)
    if not out:
        raise SpecgymError(f"no controller spec given; {valid_specs_line(k_max)}")
    return out


def _float(arg: str, what: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    try:
        value = float(arg)
    except ValueError:
        raise SpecgymError(f"{what} must be a number, got {arg!r}") from None
    if not (lo <= value <= hi):
        raise SpecgymError(f"{what} must be in [{lo:g}, {hi:g}], got {arg!r}")
    return value


def _no_arg(cls: type[Controller]) -> Factory:
    def factory(arg: str | None, k_max: int) -> Controller:
        if arg is not None:
            raise SpecgymError("takes no argument")
        return cls()

    return factory


def _fixed(arg: str | None, k_max: int) -> Controller:
    if arg is None or not arg.isdigit() or int(arg) > k_max:
        raise SpecgymError(f"fixed needs an integer K in 0..{k_max}, got {arg!r}")
    return FixedK(int(arg))


def _assc(arg: str | None, k_max: int) -> Controller:
    if arg is not None:
        raise SpecgymError("takes no argument")
    return ASSC(k_max=max(2, k_max))


def _speclane(arg: str | None, k_max: int) -> Controller:
    if arg is None:
        return SpecLane()
    if arg == "ratio":
        ctrl = SpecLane(estimator="ratio")
        ctrl.name = "speclane:ratio"
        return ctrl
    raise SpecgymError(f"speclane takes no argument or 'ratio', got {arg!r}")


def _confidence(arg: str | None, k_max: int) -> Controller:
    if arg is not None and arg.lower() == "adaptive":
        return ConfidenceStop(adaptive=True)
    return ConfidenceStop(tau=0.4 if arg is None else _float(arg, "confidence TAU", 0.0, 1.0))


def _cumulative(arg: str | None, k_max: int) -> Controller:
    return CumulativeStop(h=0.3 if arg is None else _float(arg, "cumulative H", 0.0, 1.0))


def _entropy(arg: str | None, k_max: int) -> Controller:
    if arg is None:
        return EntropyStop()
    lam, _, gamma = arg.partition(":")
    return EntropyStop(lam=_float(lam, "entropy LAM", 0.0, 1.0),
                       gamma=_float(gamma, "entropy GAMMA", 0.0) if gamma else 0.2)


def _marginal(arg: str | None, k_max: int) -> Controller:
    return MarginalStop(1.0 if arg is None else _float(arg, "marginal THRESHOLD", 0.0, 10.0))


def _ppo(arg: str | None, k_max: int) -> Controller:
    """``ppo:NAME`` (a shipped policy) or ``ppo:DIR`` (an exported policy folder), named as the user typed it."""
    if not arg:
        raise SpecgymError("ppo needs a shipped policy name or an exported policy folder, e.g. ppo:runs/NAME/policy")
    ctrl = PolicyController(load_policy(catalogue.resolve("policy", arg)), name=f"ppo:{arg}")
    ctrl.check_engine_k_max(k_max)
    return ctrl


def _predicted(arg: str | None, k_max: int) -> Controller:
    """``predicted:NAME`` (a shipped acceptance predictor) or ``predicted:FILE`` (a predictor JSON)."""
    return make_predicted(arg, k_max)


def _planned(arg: str | None, k_max: int) -> Controller:
    """``planned:NAME|FILE``: optimal stopping on a predictor's probabilities (it needs a continuation model)."""
    return make_planned(arg, k_max)


for _prefix, _factory, _usage in (
    ("fixed", _fixed, "fixed:K (K=0..K_MAX)"),
    ("assc", _assc, "assc"),
    ("speclane", _speclane, "speclane[:ratio]"),
    ("hf-heuristic", _no_arg(HFHeuristic), "hf-heuristic"),
    ("confidence", _confidence, "confidence[:TAU|:adaptive]"),
    ("cumulative", _cumulative, "cumulative[:H]"),
    ("entropy", _entropy, "entropy[:LAM[:GAMMA]]"),
    ("ucb", _no_arg(UCBBandit), "ucb"),
    ("marginal", _marginal, "marginal[:THRESHOLD]"),
    ("ppo", _ppo, "ppo:NAME|DIR (exported policy)"),
    ("predicted", _predicted, "predicted:NAME|FILE (acceptance predictor)"),
    ("planned", _planned, "planned:NAME|FILE (optimal stopping on an acceptance predictor)"),
):
    _REGISTRY[_prefix] = _Entry(_factory, _usage, builtin=True)

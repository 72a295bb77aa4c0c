"""The drafter-choice decision: each round, which drafter proposes and how many tokens (the ``drafter`` kind).

A serving engine with two drafters (vLLM with an EAGLE head and its n-gram proposer; the live midpair with its draft
model and prompt lookup) can pick, before every round, the drafter ``d`` and the draft cap ``K`` (``d = none`` or
``K = 0``: a plain target step). The round then follows the chain semantics of :mod:`specgym.envs.core.rounds` with
``d``'s acceptance and ``d``'s cost: on a per-start trace, a round at ``g`` produces ``min(run_d[g], K) + 1`` tokens
and costs ``d``'s round time of ``K`` drafts at the request's KV cache.

What a controller sees before the round is a :class:`RoundStart` (the position and the context lookup, the one
signal both replay and live engines compute from token ids alone); after it, the verified
:class:`~specgym.envs.core.rounds.RoundOutcome`, whose ``drafter`` names who proposed. :func:`drive_drafters` is the
one loop (replay harness, gym env, live engine). Nothing here knows of Gymnasium or of a particular controller.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specgym.envs.core.controller import Prepared
from specgym.envs.core.request import Request, Totals, check_needs
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome, RoundStart
from specgym.errors import SpecgymError

#: The drafter of a plain target step (no draft phase); ``K = 0`` with any drafter is the same round.
NO_DRAFTER = "none"


@dataclass(frozen=True, slots=True)
class DrafterDecision:
    """A round's decision: the drafter and its draft cap (``K = 0`` or ``drafter = none``: a plain step)."""

    drafter: str
    k: int

    @property
    def plain(self) -> bool:
        """True for a plain target step."""
        return self.k == 0 or self.drafter == NO_DRAFTER


class DrafterController(Prepared, ABC):
    """Chooses the drafter and draft cap of each round.

    Lifecycle per request: ``reset(ctx, drafters)``, then repeatedly ``propose(start)`` -> (``keep_drafting(step)``
    after the drafter's tokens j = 1..K-1, when :attr:`token_level` after ``reset``) -> ``observe(outcome)``.

    Attributes:
        name: Display name used in reports.
        needs: Per-position trace columns it reads (see :class:`~specgym.envs.core.controller.Controller`).
    """

    name: str = "drafter-controller"
    token_level: bool = False
    needs: frozenset[str] = frozenset()
    ctx: RequestContext
    drafters: tuple[str, ...] = ()

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request served by ``drafters`` (the engine's, its default first)."""
        self.ctx = ctx
        self.drafters = tuple(drafters)

    @abstractmethod
    def propose(self, start: RoundStart) -> DrafterDecision:
        """The drafter and draft cap of the next round."""

    def keep_drafting(self, step: DraftStep) -> bool:
        """After the drafter's token ``step.index``: False stops drafting (asked only when :attr:`token_level`)."""
        return True

    def observe(self, outcome: RoundOutcome) -> None:
        """Update state from a verified round (``outcome.drafter`` proposed it). Default: nothing to learn."""
        return None

    def check_drafters(self, wanted: Sequence[str]) -> None:
        """Refuse, in one line, an engine that lacks a drafter this controller proposes with."""
        missing = [d for d in wanted if d != NO_DRAFTER and d not in self.drafters]
        if missing:
            where = f"workload {self.ctx.workload}" if self.ctx.workload else "the engine"
            raise SpecgymError(f"controller {self.name} proposes with drafter(s) {', '.join(missing)}, which "
                               f"{where} does not hold (it holds {', '.join(self.drafters)})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def parse_drafter_k(text: str, k_max: int) -> tuple[int, str]:
    """``K@DRAFTER`` -> ``(K, DRAFTER)`` (K in 0..k_max); a bad one is a one-line error."""
    k, sep, drafter = text.partition("@")
    if not sep or not drafter.strip() or not k.strip().isdigit() or int(k) > k_max:
        raise SpecgymError(f"expected K@DRAFTER with K in 0..{k_max} (e.g. {min(4, k_max)}@ngram), got {text!r}")
    return int(k), drafter.strip().lower()


def check_decision(dec: object, name: str) -> DrafterDecision:
    """A controller's decision, checked: a :class:`DrafterDecision` with a whole ``K >= 0``."""
    if not isinstance(dec, DrafterDecision) or isinstance(dec.k, bool) or not isinstance(dec.k, int) or dec.k < 0:
        raise SpecgymError(f"controller {name} proposed {dec!r}; expected DrafterDecision(drafter, K >= 0)")
    return dec


def drive_drafters(controller: DrafterController, request: Request, drafters: Sequence[str],
                   on_round: Callable[[RoundOutcome], None] | None = None) -> Totals:
    """Decode ``request`` to the end with ``controller`` choosing the drafter and cap of every round.

    Args:
        controller: Any :class:`DrafterController`.
        request: A fresh request whose ``play`` takes ``drafter=`` and which gives :meth:`Request.round_start`.
        drafters: The drafters the engine serves.
        on_round: Called with every verified outcome after the controller observed it.
    """
    check_needs(controller, request.context)  # type: ignore[arg-type]
    controller.reset(request.context, drafters)
    tot = Totals()
    name = controller.name
    keep = controller.keep_drafting if controller.token_level else None  # a stop as the drafter drafts
    while not request.done:
        dec = check_decision(controller.propose(request.round_start()), name)
        o = request.play(0) if dec.plain else request.play(dec.k, keep, drafter=dec.drafter)  # type: ignore[call-arg]
        controller.observe(o)
        tot.tokens += o.produced
        tot.time_ms += o.time_ms
        tot.rounds += 1
        tot.drafted += o.drafted
        tot.accepted += o.accepted
        if on_round is not None:
            on_round(o)
    return tot

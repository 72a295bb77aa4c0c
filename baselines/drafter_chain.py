"""A chain rule on any drafter (``SPEC@DRAFTER``: ``marginal@head``, ``assc@ngram``): adaptive K on one drafter.

The chain rules decide the K of the engine's default drafter. Wrapped here, one decides the K of another drafter
every round, from that drafter's own outcomes and priced by that drafter's round costs (the profile led by it,
:meth:`~specgym.envs.core.cost.CostProfile.led_by`); a K of 0 is a plain step. A whole-proposal drafter (prompt
lookup, the draft head) carries no per-token draft signals, so the rule sees NaN confidence, as on a per-start trace,
and a token-level rule's stops (``marginal``: keep drafting while one more token raises the round's expected rate
on the request's running acceptance) are decided before the round: with no signals they depend on nothing the round
reveals. A rule that reads the default drafter's confidence or signals (``needs``) is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from specgym.envs.core.controller import Controller
from specgym.envs.core.drafter_choice import NO_DRAFTER, DrafterController, DrafterDecision
from specgym.envs.core.kinds import NGRAM_DRAFTER
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome, RoundStart
from specgym.errors import SpecgymError

#: The per-token draft features another drafter's rounds do not carry (the inner rule runs as on a per-start trace).
UNSIGNALLED = frozenset({"draft_conf", "draft_entropy"})


class ChainOnDrafter(DrafterController):
    """``inner`` decides the K of ``drafter`` every round.

    Args:
        inner: A chain controller whose ``needs`` are empty.
        drafter: The drafter whose K it decides.
        kind: The drafter's kind (``lookup`` or ``model``; default: ``lookup`` for the n-gram drafter).
    """

    def __init__(self, inner: Controller, drafter: str, kind: str | None = None) -> None:
        if inner.needs:
            raise SpecgymError(f"{inner.name}@{drafter}: {inner.name} reads {', '.join(sorted(inner.needs))} of the "
                               f"default drafter's tokens, which another drafter's rounds do not carry")
        self.inner, self.drafter = inner, drafter
        self.kind = kind or ("lookup" if drafter == NGRAM_DRAFTER else None)
        self.name = f"{inner.name}@{drafter}"
        self.family = getattr(inner, "family", "rule")

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request: the inner rule sees it priced by the drafter's round costs."""
        super().reset(ctx, drafters)
        self.check_drafters([self.drafter])
        self.inner.reset(replace(ctx, profile=ctx.profile.led_by(self.drafter, self.kind),
                                 lacks=ctx.lacks | UNSIGNALLED))

    def propose(self, start: RoundStart) -> DrafterDecision:
        """The inner rule's K (a token-level rule's stop decided up front), for the drafter."""
        k = int(self.inner.propose())
        if self.inner.token_level:
            for j in range(1, k):
                if not self.inner.keep_drafting(DraftStep(j, k, start.position + j - 1, math.nan, math.nan)):
                    k = j
                    break
        return DrafterDecision(self.drafter if k else NO_DRAFTER, k)

    def observe(self, outcome: RoundOutcome) -> None:
        """The inner rule learns the round as its own, without the default drafter's per-token signals."""
        nan = np.full(outcome.drafted, np.nan)
        self.inner.observe(replace(outcome, draft_conf=nan, draft_entropy=nan, signals=None, drafter=None))

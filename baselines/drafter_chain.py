"""A chain rule on any drafter (``SPEC@DRAFTER``: ``marginal@head``, ``confidence:0.4@head``, ``assc@ngram``): adaptive
K on one drafter.

The chain rules decide the K of the engine's default drafter. Wrapped here, one decides the K of another drafter
every round, from that drafter's own outcomes and priced by that drafter's round costs (the profile led by it,
:meth:`~specgym.envs.core.cost.CostProfile.led_by`); a K of 0 is a plain step.

**Draft confidence.** The draft head drafts greedily, so its confidence in a drafted token is its softmax maximum
there: the live engine computes it as it drafts, and a recording with ``topk_head`` holds it for every depth from every
start (``topk_head[g, j, 0]`` along the completion: exact up to the first rejected token, past it the correct-prefix
approximation the draft model's ``draft_conf`` uses in replay). Where the request carries it
(:attr:`~specgym.envs.core.rounds.RequestContext.drafter_conf`: the head on a greedy request) the inner rule sees the
head's confidence in its ``DraftStep`` and ``RoundOutcome``, and a token-level rule stops as the head drafts: the
engine asks :meth:`ChainOnDrafter.keep_drafting` after each draft token. So ``confidence:TAU@head`` and
``cumulative:H@head`` run there; the head has no recorded entropy, so its context still ``lacks`` ``draft_entropy`` (and
the feature tracker, which reads confidence and entropy together, keeps its no-feature path: ``marginal@head`` is the
same rule with or without the head's confidence), and a rule that reads entropy (``entropy@head``) or the default
drafter's signals is refused in one line. Each head ``DraftStep`` also carries the head's top-8 probabilities there
(``drafter_topk``), what ``predicted:NAME@head`` reads: a predictor trained on the head's tokens
(:mod:`specgym.baselines.predicted_marginal`); an inner rule with ``serve_drafter`` is told the drafter it serves
first, and refuses one it cannot (a draft-model predictor ``@head``) in its own words.

**Without it** (prompt lookup, whose proposal carries no confidence; the head on a sampled request or on a recording
without ``topk_head``) the rule sees NaN confidence, as on a per-start trace, and a token-level rule's stops
(``marginal``: keep drafting while one more token raises the round's expected rate on the request's running acceptance)
are decided before the round: with no confidence they depend on nothing the round reveals (this is also what the vLLM
proposer, which never asks a stop, serves). A rule that reads the confidence is refused there, at its first round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from specgym.envs.core.controller import Controller
from specgym.envs.core.drafter_choice import NO_DRAFTER, DrafterController, DrafterDecision
from specgym.envs.core.kinds import HEAD_DRAFTER, NGRAM_DRAFTER
from specgym.envs.core.rounds import TOKEN_FEATURES, DraftStep, RequestContext, RoundOutcome, RoundStart
from specgym.errors import SpecgymError

#: The drafters whose rounds can carry their own draft confidence (``RequestContext.drafter_conf``), never an entropy.
CONFIDENT_DRAFTERS = frozenset({HEAD_DRAFTER})
#: What a rule on a confident drafter may read of its tokens.
CONFIDENCE = frozenset({"draft_conf"})


class ChainOnDrafter(DrafterController):
    """``inner`` decides the K of ``drafter`` every round.

    Args:
        inner: A chain controller whose ``needs`` are empty, or only ``draft_conf`` for a drafter of
            :data:`CONFIDENT_DRAFTERS` (the head).
        drafter: The drafter whose K it decides.
        kind: The drafter's kind (``lookup`` or ``model``; default: ``lookup`` for the n-gram drafter).

    Attributes:
        token_level: True for a request whose drafter carries its confidence when the inner rule stops token by
            token: the engine then asks :meth:`keep_drafting` as the drafter drafts (set at :meth:`reset`).
    """

    def __init__(self, inner: Controller, drafter: str, kind: str | None = None) -> None:
        name = f"{inner.name}@{drafter}"
        serve = getattr(inner, "serve_drafter", None)
        if serve is not None:  # a predictor of one drafter's tokens: refused on another's, naming its file
            serve(drafter)
        if drafter in CONFIDENT_DRAFTERS and inner.needs - CONFIDENCE == {"draft_entropy"}:
            raise SpecgymError(f"{name}: {inner.name} reads draft_entropy, which the draft head's rounds do not carry "
                               f"(a recording stores its top-8 probabilities, not its entropy; rules reading its "
                               f"confidence run: confidence:0.4@{drafter})")
        if inner.needs - CONFIDENCE:
            raise SpecgymError(f"{name}: {inner.name} reads {', '.join(sorted(inner.needs))} of the default drafter's "
                               f"tokens, which another drafter's rounds do not carry")
        if inner.needs and drafter not in CONFIDENT_DRAFTERS:
            raise SpecgymError(f"{name}: {inner.name} reads draft_conf, which {drafter}'s proposals do not carry "
                               f"(only the draft head's rounds carry their confidence: {inner.name}@{HEAD_DRAFTER})")
        self.inner, self.drafter = inner, drafter
        self.kind = kind or ("lookup" if drafter == NGRAM_DRAFTER else None)
        self.name = name
        self.family = getattr(inner, "family", "rule")
        self.token_level = False
        self._confident = False

    def bind_signals(self, src: Any) -> str | None:
        """Fit an inner rule that reads an acceptance predictor to the workload or engine ``src`` it is about to serve
        (its ``bind_signals``: another pair's predictor is refused); returns its note, if any."""
        bind = getattr(self.inner, "bind_signals", None)
        return bind(src) if bind is not None else None

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request: the inner rule sees it priced by the drafter's round costs, lacking the draft features the
        drafter's rounds do not carry (entropy always; confidence unless the request carries the drafter's)."""
        super().reset(ctx, drafters)
        self.check_drafters([self.drafter])
        self._confident = self.drafter in ctx.drafter_conf
        self.token_level = self._confident and self.inner.token_level
        lacks = (ctx.lacks - CONFIDENCE) | {"draft_entropy"} if self._confident else ctx.lacks | TOKEN_FEATURES
        self.inner.reset(replace(ctx, profile=ctx.profile.led_by(self.drafter, self.kind), lacks=lacks))

    def propose(self, start: RoundStart) -> DrafterDecision:
        """The inner rule's K for the drafter (without the drafter's confidence, a token-level rule's stop decided up
        front); a rule that reads a confidence the request does not carry is refused in one line."""
        if self.inner.needs and not self._confident:
            where = f"workload {self.ctx.workload}" if self.ctx.workload else "this engine"
            raise SpecgymError(
                f"controller {self.name} reads the {self.drafter}'s draft confidence, which {where} does not carry "
                f"for request {self.ctx.request_id} at temperature {self.ctx.temperature:g} (given on greedy requests "
                f"of a live engine with a head or of a recording with 'topk_head'); leave it out of --controllers")
        k = int(self.inner.propose())
        if self.inner.token_level and not self._confident:
            for j in range(1, k):
                if not self.inner.keep_drafting(DraftStep(j, k, start.position + j - 1, math.nan, math.nan)):
                    k = j
                    break
        return DrafterDecision(self.drafter if k else NO_DRAFTER, k)

    def keep_drafting(self, step: DraftStep) -> bool:
        """After the drafter's token ``step.index`` (with its confidence): the inner rule's decision."""
        return bool(self.inner.keep_drafting(step)) if self._confident else True

    def observe(self, outcome: RoundOutcome) -> None:
        """The inner rule learns the round as its own: the drafter's confidences where the request carries them,
        never an entropy or the default drafter's signals."""
        nan = np.full(outcome.drafted, np.nan, dtype=np.float32)
        conf = outcome.draft_conf if self._confident and outcome.drafter is not None else nan
        self.inner.observe(replace(outcome, draft_conf=conf, draft_entropy=nan, signals=None, drafter=None))

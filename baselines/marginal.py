"""MarginalStop (``marginal``): keep drafting while one more draft token raises the round's expected rate.

The strongest analytic rule specgym ships, and the bar a learned policy has to clear. No training; it reads the
hardware's cost profile and calibrates the draft's confidence online:

1. **Calibration.** The draft's confidence ``c`` of each token is mapped to an acceptance probability
   ``a(c) = sigmoid(w * logit(c) + b)`` (online Platt scaling, fitted by gradient steps on the request's judged
   tokens, starting from ``a(c) = c``), so an over- or under-confident draft is corrected as the request goes.
2. **Expected tokens.** After ``j`` draft tokens, ``P_j = a(c_1) ... a(c_j)`` is the probability that they are all
   accepted and ``E_j = 1 + P_1 + ... + P_j`` the tokens the round produces if it verifies now.
3. **Marginal rule.** One more draft token adds ``P_j * a_next`` expected tokens (``a_next`` = the calibrated
   acceptance of the token just drafted, or the request's running per-token acceptance before the first) for
   ``cost(j + 1) - cost(j)`` more time, where ``cost`` is the full cost model: ``draft_ms`` per token, the verify
   slope, and the round overhead when the round is opened (``j = 0``). Draft on iff that marginal rate exceeds the
   round's current rate ``E_j / cost(j)``; ``propose`` returns 0 (a plain step) when even the first draft token does
   not pay, else the cap.

**Without draft confidence** (a per-start trace, e.g. the published SpecDecode-Bench traces) the calibration is a
single bin: every draft token's acceptance is the request's running per-token acceptance estimate (the ratio of
EMAs of accepted to judged tokens), so ``P_j = a^j`` and the rule drafts to the model-optimal length under the full
cost model. With a context term in the profile, ``cost`` is priced at the request's current KV cache.

The arithmetic is :mod:`specgym.envs.core.economics`, through the same :class:`FeatureTracker` /
:class:`TokenDecisionState` the learned policies observe (their ``tok_marginal`` feature is this rule's ratio).
"""

from __future__ import annotations

from typing import Any

from specgym.envs.core.controller import Controller
from specgym.envs.core.features import FeatureTracker
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.envs.core.token_protocol import TokenProtocol


class MarginalStop(Controller):
    """Draft while the marginal expected tokens per unit of extra cost exceed the round's rate.

    Args:
        threshold: Draft on while the marginal ratio exceeds this (1 = raise the round's rate).
    """

    token_level = True

    def __init__(self, threshold: float = 1.0) -> None:
        self.threshold = float(threshold)
        self.name = "marginal" if self.threshold == 1.0 else f"marginal:{self.threshold:g}"
        self.predictor: Any = None  # the acceptance predictor of the protocol's draft tokens (subclasses)
        self._use(FeatureTracker(8))
        self._cap = 8

    def _use(self, tracker: FeatureTracker) -> None:
        self.tracker = tracker
        self.protocol = TokenProtocol(tracker, tracker.k_max, self.predictor)
        self.decisions = self.protocol.decisions

    def reset(self, ctx: RequestContext) -> None:
        """New request: fresh calibration and acceptance estimate, the request's costs."""
        self.ctx = ctx
        if ctx.k_max != self.tracker.k_max:
            self._use(FeatureTracker(ctx.k_max))
        self.tracker.reset(ctx)
        self.protocol.temperature = float(ctx.temperature)
        self._cap = ctx.k_max

    def propose(self) -> int:
        """0 (plain step) if even the first draft token does not pay, else the cap."""
        self.decisions.begin_round()
        return self._cap if self.decisions.marginal_ratio() > self.threshold else 0

    def keep_drafting(self, step: DraftStep) -> bool:
        """Draft on iff one more token raises the round's expected rate."""
        self.decisions.add(step)
        return self.decisions.marginal_ratio() > self.threshold

    def observe(self, outcome: RoundOutcome) -> None:
        """Calibrate on the judged tokens, update the acceptance estimate."""
        self.tracker.update(outcome)

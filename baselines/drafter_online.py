"""Drafter choice that adapts to the request in front of it (``drafter-online[:FILE]``).

Rule: :mod:`~specgym.baselines.drafter_marginal`'s (the (drafter, K) of most expected tokens per ms, ``K = 0``: a
plain step), with each drafter's predicted runs calibrated to the request as it is decoded. The offline fit predicts,
from the context lookup, the position and the last round, how many tokens a drafter's proposal would have accepted;
on a request unlike its fit data (prompts nobody here wrote) it is wrong in one direction for the whole request.
So every drafter ``d`` keeps, per request, the tokens it was seen to accept ``O_d`` and the tokens the fit predicted
for the same rounds ``P_d``, and the rule plays with ``E_d(K) = 1 + r_d (E_fit,d(K) - 1)``, where
``r_d = (O_d + w) / (P_d + w)`` (the prior weight ``w``, in tokens, is the fit's: ``r_d = 1`` before any evidence).

What is seen: the drafter that played, its accepted tokens (predicted: its expected accepted tokens at the cap it
drafted); and, for free in greedy decoding, every drafter whose proposal the verified tokens judge
(:attr:`~specgym.envs.core.rounds.RoundOutcome.counterfactual`: prompt lookup's proposal is a function of the token
ids, so after each round the engine knows how many of its tokens would have been accepted; censored at the tokens the
round produced, and predicted censored the same way). This is the full-information view of HedgeSpec ("Not-a-Bandit",
arXiv 2510.20064) for the drafter whose counterfactual is free. At T > 0 a drafter's acceptance is a draw the round
did not make, so only the drafter that played is seen (the engines report no counterfactual there).

Toward a floor at plain: where every drafter's calibrated rate is below a plain step's, the rule decodes plainly; a
model drafter that no counterfactual covers would then never be seen again, so after ``probe_every`` plain rounds in a
row the rule plays the best drafter at ``K = 1`` once (a probe costs one draft token). Measured, not yet a floor: on
a workload where every proposal is rejected the calibration falls too slowly at the shipped prior weight (0.82x
plain, against the uncalibrated rule's 0.79x; docs/kinds/drafter.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specgym.baselines.drafter_marginal import DrafterMarginal
from specgym.envs.core.drafter_choice import DrafterDecision
from specgym.envs.core.rounds import RequestContext, RoundOutcome, RoundStart
from specgym.envs.core.run_predictor import MAX_RUN, RunPredictor

#: The weight of the offline fit, in predicted accepted tokens, chosen on validation splits (1-64 tried,
#: docs/results/scripts/drafter_online.py): a compromise between the fit being right (64 ties it, 16 costs up to 0.8%)
#: and wrong (16 recovers 3.8% where 64 recovers 2.0%); docs/kinds/drafter.md.
PRIOR_TOKENS = 16.0
#: Plain rounds in a row after which the best drafter is probed at K = 1.
PROBE_EVERY = 16


class DrafterOnline(DrafterMarginal):
    """Most expected tokens per ms over every (drafter, K), each drafter's runs calibrated to the request.

    Args:
        predictor: A fitted run predictor (``None``: fitted in :meth:`prepare` on the workload's fit split).
        prior_tokens: The fit's weight ``w`` in the calibration (module docstring).
        probe_every: Plain rounds in a row before a probe.
    """

    family = "predictor"

    def __init__(self, predictor: RunPredictor | None = None, prior_tokens: float = PRIOR_TOKENS,
                 probe_every: int = PROBE_EVERY) -> None:
        super().__init__(predictor)
        self.name = "drafter-online"
        self.prior_tokens, self.probe_every = float(prior_tokens), int(probe_every)
        self._seen: dict[str, list[float]] = {}
        self._predicted: dict[str, np.ndarray] = {}
        self._last_rates: dict[str, np.ndarray] = {}
        self._plain = 0

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request: every drafter at the fit's prediction (no evidence yet)."""
        super().reset(ctx, drafters)
        self._seen = {d: [0.0, 0.0] for d in self._use}
        self._predicted = {}
        self._plain = 0

    def calibration(self, drafter: str) -> float:
        """``r_d``: the request's seen accepted tokens over the fit's prediction for them, with the prior."""
        seen, predicted = self._seen[drafter]
        return (seen + self.prior_tokens) / (predicted + self.prior_tokens)

    def expected(self, drafter: str, start: RoundStart) -> np.ndarray:
        """The fit's expected tokens (kept: what the round's outcome is compared with), calibrated to the request."""
        fit = super().expected(drafter, start)
        self._predicted[drafter] = fit
        return 1.0 + self.calibration(drafter) * (fit - 1.0)

    def propose(self, start: RoundStart) -> DrafterDecision:
        """The (drafter, K) of the largest calibrated rate; a probe after ``probe_every`` plain rounds."""
        dec = super().propose(start)
        self._plain = self._plain + 1 if dec.plain else 0
        if self._plain >= self.probe_every and self.ctx.k_max >= 1 and self._last_rates:
            self._plain = 0
            return DrafterDecision(max(self._last_rates, key=lambda d: float(self._last_rates[d][1])), 1)
        return dec

    def rates(self, start: RoundStart) -> dict[str, np.ndarray]:
        """The calibrated rates (kept for a probe's choice)."""
        self._last_rates = super().rates(start)
        return self._last_rates

    def observe(self, outcome: RoundOutcome) -> None:
        """Count what the round showed: the played drafter's accepted tokens, and each counterfactual run."""
        super().observe(outcome)
        played = outcome.drafter or (self.drafters[0] if outcome.drafted else None)
        if outcome.drafted and played in self._seen and played in self._predicted:
            self._count(played, outcome.accepted, min(outcome.drafted, MAX_RUN))
        for d, run in outcome.counterfactual:
            if d != played and d in self._seen and d in self._predicted:
                self._count(d, run, min(outcome.produced, MAX_RUN))

    def _count(self, drafter: str, accepted: int, upto: int) -> None:
        """Add a seen run and the fit's prediction of it, both censored at ``upto`` tokens."""
        self._seen[drafter][0] += accepted
        self._seen[drafter][1] += float(self._predicted[drafter][upto]) - 1.0

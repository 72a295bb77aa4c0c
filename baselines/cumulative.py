"""CumulativeStop: SpecDec++-style stop on the probability that the round already contains a rejection.

Source: Huang, Guo, Wang, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate Lengths" (2024). SpecDec++
trains an acceptance-prediction head on the draft model and stops drafting as soon as the predicted probability
that at least one drafted token of the current round is rejected, ``1 - prod_j p_accept_j``, exceeds a threshold
``h``. Here the draft's own confidence of each drafted token stands in for the trained
acceptance head: after drafted token j, stop iff ``1 - prod_{m<=j} draft_conf_m > h`` (h = 0.3), with the
draft length bounded to [k_min, k_max] = [1, k_max] (never stop before k_min tokens; the cap is k_max).
"""

from __future__ import annotations

from specgym.baselines.token_stop import TokenStopController
from specgym.envs.core.rounds import DraftStep


class CumulativeStop(TokenStopController):
    """Stop when the estimated probability of a rejection within the round exceeds ``h``.

    Args:
        h: Threshold on ``1 - prod(conf)`` (0.3).
        k_min: Never stop before this many drafted tokens (1).
        k_max: Draft cap; ``None`` = ``ctx.k_max``.
    """

    needs = frozenset({"draft_conf"})

    def __init__(self, h: float = 0.3, k_min: int = 1, k_max: int | None = None) -> None:
        self.h, self.k_min, self.k_max = float(h), k_min, k_max
        self.name = f"cumulative:{self.h:g}"
        super().__init__(k_max)
        self._prod = 1.0

    def keep_drafting(self, step: DraftStep) -> bool:
        """Accumulate the product of confidences of this round; continue while ``1 - prod <= h``."""
        prod = step.conf if step.index == 1 else self._prod * step.conf
        self._prod = prod
        return step.index < self.k_min or 1.0 - prod <= self.h


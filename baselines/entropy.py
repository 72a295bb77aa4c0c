"""EntropyStop: AdaEDL-style early draft stopping from the draft's entropy.

Source: Agrawal et al., "AdaEDL: Early Draft Stopping for Speculative Decoding of Large Language Models via an
Entropy-based Lower Bound on Token Acceptance Probability" (2024). AdaEDL lower-bounds the acceptance probability
of a draft token by ``1 - sqrt(gamma * H)``, H the entropy of the draft distribution, and stops drafting as soon as
this bound falls below a threshold lambda. Rule here: after drafted token j, stop iff
``1 - sqrt(gamma * draft_entropy_j) < lam`` with gamma = 0.2, lam = 0.5, never before k_min = 1 token, cap k_max.
The paper additionally adapts lambda online from the observed acceptance; this baseline keeps lambda fixed (the
non-adaptive variant), so it stays a pure function of the draft's entropy.
"""

from __future__ import annotations

import math

from specgym.baselines.token_stop import TokenStopController
from specgym.envs.core.rounds import DraftStep


class EntropyStop(TokenStopController):
    """Stop when the entropy-based acceptance lower bound drops below ``lam``.

    Args:
        gamma: Scale inside the square root (0.2).
        lam: Threshold on the bound (0.5).
        k_min: Never stop before this many drafted tokens (1).
        k_max: Draft cap; ``None`` = ``ctx.k_max``.
    """

    needs = frozenset({"draft_entropy"})

    def __init__(self, gamma: float = 0.2, lam: float = 0.5, k_min: int = 1, k_max: int | None = None) -> None:
        self.gamma, self.lam, self.k_min, self.k_max = float(gamma), float(lam), k_min, k_max
        if self.gamma == 0.2 and self.lam == 0.5:
            self.name = "entropy"
        elif self.gamma == 0.2:
            self.name = f"entropy:{self.lam:g}"
        else:
            self.name = f"entropy:{self.lam:g}:{self.gamma:g}"
        super().__init__(k_max)

    def keep_drafting(self, step: DraftStep) -> bool:
        """Continue iff ``1 - sqrt(gamma * entropy) >= lam`` (or fewer than k_min tokens drafted)."""
        g = self.gamma * step.entropy
        return step.index < self.k_min or 1.0 - (math.sqrt(g) if g > 0.0 else 0.0) >= self.lam


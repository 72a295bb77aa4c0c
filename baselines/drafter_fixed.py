"""One drafter at a fixed draft cap (``fixed:K@DRAFTER``): what a serving engine configured with that drafter does.

Rule: every round, drafter ``d`` with cap ``K`` (vLLM's ``num_speculative_tokens`` for that method). ``K = 0`` is
plain decoding. The reference rows of drafter choice: the best single drafter at its best fixed K.
"""

from __future__ import annotations

from collections.abc import Sequence

from specgym.envs.core.drafter_choice import DrafterController, DrafterDecision
from specgym.envs.core.rounds import RequestContext, RoundStart
from specgym.errors import SpecgymError


class FixedDrafter(DrafterController):
    """Always ``(drafter, k)`` (the cap clipped to the engine's ``k_max``).

    Args:
        drafter: The drafter's name (``eagle``, ``ngram``, ...).
        k: The draft cap, ``>= 0``.
    """

    family = "fixed"

    def __init__(self, drafter: str, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise SpecgymError(f"FixedDrafter: k must be an integer >= 0, got {k!r}")
        self.drafter, self.k = drafter, k
        self.name = f"fixed:{k}@{drafter}"
        self._dec = DrafterDecision(drafter, k)

    def reset(self, ctx: RequestContext, drafters: Sequence[str]) -> None:
        """Start a request; refuse an engine without the drafter."""
        super().reset(ctx, drafters)
        self.check_drafters([self.drafter])
        self._dec = DrafterDecision(self.drafter, min(self.k, ctx.k_max))

    def propose(self, start: RoundStart) -> DrafterDecision:
        """The fixed decision."""
        return self._dec

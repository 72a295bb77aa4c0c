"""FixedK: the static speculation length every serving engine ships with.

Rule: propose the same draft cap ``k`` every round. ``k = 0`` is plain autoregressive decoding. This is the
reference point of every comparison (speedup vs fixed K=4, vs the best fixed K).
"""

from __future__ import annotations

from specgym.envs.core.controller import Controller
from specgym.envs.core.rounds import RequestContext, RoundOutcome
from specgym.errors import SpecgymError


class FixedK(Controller):
    """Always propose ``k`` (clipped to the request's ``k_max``).

    Args:
        k: The draft cap, ``>= 0``.
    """

    token_level = False

    def __init__(self, k: int = 4) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise SpecgymError(f"FixedK: k must be an integer >= 0, got {k!r}")
        self.k = k
        self.name = f"fixed:{k}"
        self._k = k

    def reset(self, ctx: RequestContext) -> None:
        """Start a request; the cap is clipped to ``ctx.k_max`` once here."""
        self.ctx = ctx
        self._k = min(self.k, ctx.k_max)

    def propose(self) -> int:
        """Return the fixed cap."""
        return self._k

    def observe(self, outcome: RoundOutcome) -> None:
        """Nothing to learn."""

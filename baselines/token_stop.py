"""The common shape of token-level stop rules: propose the cap every round, decide token by token."""

from __future__ import annotations

from specgym.envs.core.controller import Controller
from specgym.envs.core.rounds import RequestContext, RoundOutcome


class TokenStopController(Controller):
    """Base of token-level stops: propose the cap every round, decide in ``keep_drafting``.

    Args:
        k_max: Draft cap; ``None`` = the request's ``ctx.k_max``.
    """

    token_level = True

    def __init__(self, k_max: int | None = None) -> None:
        self.k_max = k_max
        self._cap = k_max or 0

    def reset(self, ctx: RequestContext) -> None:
        """New request: the cap is the smaller of ``k_max`` and ``ctx.k_max``."""
        self.ctx = ctx
        self._cap = ctx.k_max if self.k_max is None else min(self.k_max, ctx.k_max)

    def propose(self) -> int:
        """Always the cap; the stop happens token by token."""
        return self._cap

    def observe(self, outcome: RoundOutcome) -> None:
        """Nothing to learn by default."""

"""ASSC, the Adaptive Speculative Step Controller of seed write-up 000.

Source: a Chinese-language blog post describing an "AdaptiveSpeculativeController". Its rule, as its code
states it, after each verification with planned K and accepted a:

    ema = beta * ema + (1 - beta) * a / K                    (beta = 0.7, ema starts at 0.75)
    if a == 0:                      K = max(k_min, K // 2); streak = 0        # "hard rejection at step 1"
    elif ema >= 0.85 and a == K:    streak += 1; if streak >= 2: K = min(k_max, K + 1); streak = 0
    elif ema < 0.50:                K = max(k_min, K - 1); streak = 0
    else:                           streak = 0

with K in [k_min, k_max] = [2, 8] and K = 4 at the start.

Choices where the seed is ambiguous (documented and tested):

* Demotion threshold: the seed's diagram says ``EMA < 0.45``, its code says ``0.50``; we use the code's 0.50
  (``demote_ema``, configurable).
* ``a / K`` and ``a == K`` use the outcome's ``planned_k``, i.e. the cap *after* the engine clipped it near the
  end of a request (the seed's ``update_after_verification(accepted_count, planned_k)`` receives what was
  actually planned). The K state that is halved / stepped is ASSC's own ``current_k``, which ``propose`` returns
  unclipped except to ``ctx.k_max``. A round with ``planned_k == 0`` (engine clipped to the last token) carries
  no information and is skipped (the seed's code would divide by zero).
* State (K, ema, streak) is per request: ``reset`` restores K = 4, ema = 0.75, streak = 0, as the seed builds
  one controller per generation loop.
* ``k_max`` is additionally clipped to the request's ``ctx.k_max``.
"""

from __future__ import annotations

from specgym.envs.core.controller import Controller
from specgym.envs.core.rounds import RequestContext, RoundOutcome


class ASSC(Controller):
    """EMA-of-acceptance state machine: slow promotion, fast (halving) demotion.

    Args:
        k_min: Lower bound of K (seed: 2).
        k_max: Upper bound of K (seed: 8); also clipped to ``ctx.k_max``.
        init_k: K at the start of each request (seed: 4).
        ema0: Initial acceptance EMA (seed: 0.75).
        beta: EMA smoothing factor (seed: 0.7).
        promote_ema: EMA needed (with full acceptance) to count towards promotion (seed: 0.85).
        demote_ema: EMA below which K steps down (seed code: 0.50; its diagram: 0.45).
        promote_streak: Consecutive qualifying rounds needed for promotion (seed: 2).
    """

    name = "assc"
    token_level = False

    def __init__(
        self,
        k_min: int = 2,
        k_max: int = 8,
        init_k: int = 4,
        ema0: float = 0.75,
        beta: float = 0.7,
        promote_ema: float = 0.85,
        demote_ema: float = 0.50,
        promote_streak: int = 2,
    ) -> None:
        self.k_min, self.k_max, self.init_k = k_min, k_max, init_k
        self.ema0, self.beta = ema0, beta
        self.promote_ema, self.demote_ema, self.promote_streak = promote_ema, demote_ema, promote_streak
        self._lo, self._hi = k_min, k_max
        self.current_k = init_k
        self.alpha_ema = ema0
        self.streak = 0

    def reset(self, ctx: RequestContext) -> None:
        """Restore the initial state for a new request."""
        self.ctx = ctx
        self._hi = min(self.k_max, ctx.k_max)
        self._lo = min(self.k_min, self._hi)
        self.current_k = max(self._lo, min(self._hi, self.init_k))
        self.alpha_ema = self.ema0
        self.streak = 0

    def propose(self) -> int:
        """Return ASSC's current K (the engine clips it near the end of the request)."""
        return self.current_k

    def observe(self, outcome: RoundOutcome) -> None:
        """Apply the seed's update with ``accepted`` and the (clipped) ``planned_k``."""
        k_planned = outcome.planned_k
        if k_planned <= 0:
            return
        a = outcome.accepted
        self.alpha_ema = self.beta * self.alpha_ema + (1.0 - self.beta) * a / k_planned
        if a == 0:
            self.current_k = max(self._lo, self.current_k // 2)
            self.streak = 0
        elif self.alpha_ema >= self.promote_ema and a == k_planned:
            self.streak += 1
            if self.streak >= self.promote_streak:
                self.current_k = min(self._hi, self.current_k + 1)
                self.streak = 0
        elif self.alpha_ema < self.demote_ema:
            self.current_k = max(self._lo, self.current_k - 1)
            self.streak = 0
        else:
            self.streak = 0

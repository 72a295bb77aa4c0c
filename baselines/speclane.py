"""SpecLane: EMA acceptance estimate, UCB1 warm-up, closed-form optimal K.

Source: the SpecLane write-up (github.com/aryanputta/speclane; a Chinese-language description of it). Its rule:

1. Estimate the acceptance rate alpha online with an EMA (beta = 0.8, start 0.6) of
   ``accepted / positions_reached``, ``positions_reached = min(accepted + 1, drafted)`` (the number of drafted
   positions the target actually judged: all accepted ones plus the first rejected one, if any).
2. For the first 32 generated tokens of a request, when the EMA is not yet reliable, play UCB1
   (:class:`~specgym.baselines.bandit.UCB1`) over the arms K in {2, 4, 6, 8}: each arm once, then
   ``argmax_k mean_reward_k + sqrt(2 ln t / n_k)``, with the round reward ``produced / (time / t_AR)``.
3. Afterwards K = the integer maximiser on [1, k_max] of the geometric-acceptance throughput model
   ``G(K) = (1 - alpha^(K+1)) / ((1 - alpha) (c_d K + c_v))``.

Closed form (flat verify cost). With r = c_v / c_d and L = -ln(alpha), dG/dK = 0 reduces to
``alpha^(K+1) (1 + L (K + r)) = 1``; with ``y = 1 + L (K + r)`` this is ``y e^{-y} = alpha^(r-1) / e``, so
``y = -W_{-1}(-alpha^(r-1) / e)`` (the root with y >= 1 lies on the lower branch) and ``K* = (y - 1) / L - r``.
G is quasi-concave in K (dG/dK changes sign once), so the integer maximiser is floor(K*) or ceil(K*) after
clamping to [1, k_max]; they are compared by G. W_{-1} is computed here, without scipy, in log form: with
``s = -ln(-z)``, ``y = -W_{-1}(z)`` is the root ``y >= 1`` of ``y - ln y = s`` (no underflow of alpha^(r-1) when
alpha -> 0), found by Halley's method from a branch-point series (s near 1) or an asymptotic guess (s large).
If r < 1 there is no stationary point (z < -1/e): G decreases on K >= 1 and K* = 1.

Choices where the write-up is ambiguous (documented and tested):

* Costs come from the request's cost profile: ``c_d = draft_ms``, ``c_v(K) = verify(K + 1) + round_overhead_ms``
  (the per-round overhead is part of the fixed verify cost). The closed form is used when ``c_v(K)`` is the same
  for K = 1..k_max (``verify(2..k_max+1)``, the entries that enter G on [1, k_max]; ``verify(1) = t_AR`` is never
  used since K = 0 is outside SpecLane's range); otherwise G is enumerated.
* Edge cases: alpha >= 1 -> G is increasing iff c_v >= c_d, so k_max (or 1); alpha <= 0 -> 1;
  draft_ms == 0 -> k_max (longer drafts are free).
* EMA, bandit statistics and the token counter are per request (reset in ``reset``), as in the write-up ("for the
  first 32 tokens of a request"). The EMA is updated on every round, warm-up included; a round with
  ``drafted == 0`` does not update it.
* An arm is credited only when the engine played it unclipped (``planned_k == arm``); a clipped round near the
  end of a request is not a sample of that arm. Arms above ``ctx.k_max`` are clipped to it (duplicates merged).
* ``estimator="ema"`` (default, the write-up's rule) averages per-round ratios ``a / reached``. That mean of
  ratios is biased low: a round that accepts everything counts 1, but a round stopped at the first rejection
  counts ``a / (a + 1)``, so at alpha = 0.9 with K = 8 it settles near 0.77 and SpecLane drafts too little.
  ``estimator="ratio"`` keeps EMAs of ``a`` and ``reached`` separately and divides them (a ratio of sums, the
  maximum-likelihood estimate of a geometric acceptance), which removes most of the bias.
* The warm-up lasts while fewer than ``warmup_tokens`` tokens have been produced in the request; the round that
  crosses 32 is the last UCB round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specgym.baselines.bandit import UCB1
from specgym.envs.core.controller import Controller
from specgym.envs.core.economics import expected_tokens
from specgym.envs.core.rounds import RequestContext, RoundOutcome

_INV_E = math.exp(-1.0)


def _solve_y(s: float) -> float:
    """Root ``y >= 1`` of ``y - ln(y) = s`` for ``s >= 1`` (i.e. ``y = -W_{-1}(-e^{-s})``)."""
    d = s - 1.0
    if d <= 0.0:
        return 1.0
    if d < 1.5:
        p = math.sqrt(2.0 * d)  # branch-point series of y - 1 - ln y = d
        y = 1.0 + p + p * p / 3.0 + p * p * p / 36.0
    else:
        y = s + math.log(s)  # asymptotic for large s
    for _ in range(8):
        h = y - math.log(y) - s
        h1 = 1.0 - 1.0 / y
        h2 = 1.0 / (y * y)
        den = 2.0 * h1 * h1 - h * h2
        if den == 0.0:
            break
        step = 2.0 * h * h1 / den
        y_new = y - step
        if y_new < 1.0:
            y_new = 0.5 * (y + 1.0)
        if abs(y_new - y) <= 1e-15 * y:
            return y_new
        y = y_new
    return y


def lambert_wm1(z: float) -> float:
    """Lower branch W_{-1}(z) of the Lambert W function for ``-1/e <= z < 0`` (values <= -1).

    Raises:
        ValueError: If ``z`` is outside ``[-1/e, 0)``.
    """
    if not (-_INV_E - 1e-15 <= z < 0.0):
        raise ValueError(f"W_-1 is real only on [-1/e, 0), got {z!r}")
    return -_solve_y(-math.log(-z))


def gain(k: int, alpha: float, draft_ms: float, cv: float) -> float:
    """Throughput model ``G(K) = E[tokens per round] / round time`` of the geometric-acceptance model."""
    return expected_tokens(k, alpha) / (k * draft_ms + cv)


def optimal_k_enumerate(alpha: float, draft_ms: float, cv: Sequence[float], k_min: int, k_max: int) -> int:
    """Integer maximiser of G on [k_min, k_max] by enumeration; ``cv[K]`` is the fixed cost of a K-round.

    Ties go to the smaller K.
    """
    best_k, best_g = k_min, -1.0
    for k in range(k_min, k_max + 1):
        g = gain(k, alpha, draft_ms, cv[k])
        if g > best_g:
            best_k, best_g = k, g
    return best_k


def optimal_k_real(alpha: float, r: float) -> float:
    """Real maximiser ``K*`` of G for flat cost ratio ``r = c_v / c_d``, ``0 < alpha < 1`` (may be < 1)."""
    if r <= 1.0:
        return -math.inf if r < 1.0 else -1.0
    big_l = -math.log(alpha)
    y = _solve_y(1.0 + (r - 1.0) * big_l)  # y - ln y = 1 - ln(alpha^(r-1)), i.e. y = -W_{-1}(-alpha^(r-1)/e)
    return (y - 1.0) / big_l - r


def optimal_k_closed_form(alpha: float, draft_ms: float, cv: float, k_min: int, k_max: int) -> int:
    """Integer maximiser of G on [k_min, k_max] for a flat fixed cost ``cv`` (closed form + floor/ceil)."""
    if k_max <= k_min:
        return k_max
    if draft_ms <= 0.0:
        return k_max if alpha > 0.0 else k_min
    if alpha <= 0.0:
        return k_min
    if alpha >= 1.0:
        return k_max if cv >= draft_ms else k_min
    k_star = optimal_k_real(alpha, cv / draft_ms)
    if not k_star < k_max:  # also catches inf / nan from alpha -> 1
        return k_max
    if k_star <= k_min:
        return k_min
    lo = math.floor(k_star)
    hi = lo + 1
    lo = max(k_min, lo)
    return lo if gain(lo, alpha, draft_ms, cv) >= gain(hi, alpha, draft_ms, cv) else hi


class SpecLane(Controller):
    """EMA acceptance estimate + UCB1 warm-up + closed-form optimal K.

    Args:
        alpha0: Initial acceptance estimate (0.6).
        beta: EMA factor: ``alpha = beta * alpha + (1 - beta) * observed`` (0.8).
        warmup_tokens: Generated tokens of a request during which UCB1 chooses K (32).
        arms: UCB1 arms ({2, 4, 6, 8}).
        ucb_c: Exploration constant inside the square root: ``sqrt(ucb_c * ln t / n)`` (2, UCB1).
        k_min: Smallest K of the model phase (1).
        k_max: Largest K of the model phase; ``None`` = ``ctx.k_max``.
        estimator: ``"ema"`` (EMA of per-round ``a / reached``, the write-up's rule) or ``"ratio"`` (EMA of
            ``a`` over EMA of ``reached``, nearly unbiased); see the module docstring.
    """

    name = "speclane"
    token_level = False

    def __init__(
        self,
        alpha0: float = 0.6,
        beta: float = 0.8,
        warmup_tokens: int = 32,
        arms: Sequence[int] = (2, 4, 6, 8),
        ucb_c: float = 2.0,
        k_min: int = 1,
        k_max: int | None = None,
        estimator: str = "ema",
    ) -> None:
        if estimator not in ("ema", "ratio"):
            raise ValueError(f"SpecLane estimator must be 'ema' or 'ratio', got {estimator!r}")
        self.estimator = estimator
        self.alpha0, self.beta, self.warmup_tokens = alpha0, beta, warmup_tokens
        self.arms, self.ucb_c, self.k_min, self.k_max = tuple(arms), ucb_c, k_min, k_max
        self.alpha = alpha0

    def reset(self, ctx: RequestContext) -> None:
        """Per-request state: EMA, bandit statistics, token counter; precompute the cost model."""
        self.ctx = ctx
        hi = ctx.k_max if self.k_max is None else min(self.k_max, ctx.k_max)
        self._hi, self._lo = hi, min(self.k_min, hi)
        self._arms = tuple(sorted({min(a, hi) for a in self.arms}))
        self.bandit = UCB1(len(self._arms), self.ucb_c)
        self._arm: int | None = None
        self.alpha = self.alpha0
        self._ema_acc, self._ema_reached = self.alpha0, 1.0
        self._generated = 0
        prof = ctx.profile
        self._t_ar = prof.t_ar_ms
        self._d = prof.draft_ms
        self._cv = [0.0] + [prof.verify(k + 1) + prof.round_overhead_ms for k in range(1, hi + 1)]
        self._flat = all(c == self._cv[1] for c in self._cv[1:]) if hi >= 1 else True

    @property
    def in_warmup(self) -> bool:
        """True while UCB1 chooses K."""
        return self._generated < self.warmup_tokens

    def propose(self) -> int:
        """UCB1 arm during warm-up, else the model-optimal K for the current alpha."""
        if self._generated < self.warmup_tokens:
            i = self.bandit.select()
            self._arm = i
            return self._arms[i]
        self._arm = None
        return self.best_k(self.alpha)

    def best_k(self, alpha: float) -> int:
        """Integer maximiser of G for this request's costs (closed form when flat, else enumeration)."""
        if self._flat:
            return optimal_k_closed_form(alpha, self._d, self._cv[1] if self._hi else 0.0, self._lo, self._hi)
        return optimal_k_enumerate(alpha, self._d, self._cv, self._lo, self._hi)

    def observe(self, outcome: RoundOutcome) -> None:
        """Update the EMA, credit the UCB arm (if it was played unclipped) and count produced tokens."""
        drafted = outcome.drafted
        if drafted > 0:
            a = outcome.accepted
            reached = a + 1 if a < drafted else drafted
            if self.estimator == "ema":
                self.alpha = self.beta * self.alpha + (1.0 - self.beta) * (a / reached)
            else:
                self._ema_acc = self.beta * self._ema_acc + (1.0 - self.beta) * a
                self._ema_reached = self.beta * self._ema_reached + (1.0 - self.beta) * reached
                self.alpha = self._ema_acc / self._ema_reached
        i = self._arm
        if i is not None and outcome.planned_k == self._arms[i] and outcome.time_ms > 0.0:
            self.bandit.update(i, outcome.produced * self._t_ar / outcome.time_ms)
        self._generated += outcome.produced

"""UCBBandit: BanditSpec-style UCB1 over the draft length, learning across requests.

Source: Hou et al., "BanditSpec: Adaptive Speculative Decoding via Bandit Algorithms" (2025), which casts the
choice of a speculative-decoding hyperparameter (here the draft length K) as a multi-armed bandit solved with
UCB (``UCBSpec``) while generation runs. Rule here: arms K = 1..k_max; after a round with arm K the reward is
``produced / (time / t_AR)`` (tokens per AR-step-equivalent of time); the choice is
:class:`~specgym.baselines.bandit.UCB1` over those rewards. The public reference code divides the exploration term
by the *total* count, which makes it (nearly) greedy; this implementation uses the per-arm counts of textbook UCB1.

Choices (documented and tested):

* Statistics persist across requests within one run: ``reset`` does not clear them (``clear()`` does); they are
  rebuilt only if a request comes with a different arm set (another ``ctx.k_max``).
* An arm is credited only when the engine played it unclipped (``planned_k == K``); a round clipped near the end
  of a request is not a sample of that arm. Ties go to the smaller K.
"""

from __future__ import annotations

from specgym.baselines.bandit import UCB1
from specgym.envs.core.controller import Controller
from specgym.envs.core.rounds import RequestContext, RoundOutcome


class UCBBandit(Controller):
    """UCB1 over K = k_min..k_max with reward = speed relative to plain decoding.

    Args:
        k_min: Smallest arm (1).
        k_max: Largest arm; ``None`` = ``ctx.k_max``.
        c: Exploration constant inside the square root, ``sqrt(c ln t / n_K)`` (2, UCB1).
    """

    name = "ucb"
    token_level = False

    def __init__(self, k_min: int = 1, k_max: int | None = None, c: float = 2.0) -> None:
        self.k_min, self.k_max, self.c = k_min, k_max, c
        self.arms: tuple[int, ...] = ()
        self.bandit = UCB1(0, c)
        self._arm: int | None = None

    def clear(self) -> None:
        """Forget all bandit statistics (a new run)."""
        self.bandit.clear()
        self._arm = None

    def reset(self, ctx: RequestContext) -> None:
        """New request; the bandit statistics are kept."""
        self.ctx = ctx
        hi = ctx.k_max if self.k_max is None else min(self.k_max, ctx.k_max)
        arms = tuple(range(min(self.k_min, hi), hi + 1))
        if arms != self.arms:
            self.arms = arms
            self.bandit = UCB1(len(arms), self.c)
        self._t_ar = ctx.profile.t_ar_ms
        self._arm = None

    def propose(self) -> int:
        """Play an untried arm, else the arm with the highest upper confidence bound."""
        self._arm = self.bandit.select()
        return self.arms[self._arm]

    def observe(self, outcome: RoundOutcome) -> None:
        """Credit the played arm with ``produced * t_AR / time``."""
        i = self._arm
        if i is None or outcome.planned_k != self.arms[i] or outcome.time_ms <= 0.0:
            return
        self.bandit.update(i, outcome.produced * self._t_ar / outcome.time_ms)

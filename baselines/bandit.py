"""UCB1 (Auer, Cesa-Bianchi and Fischer, 2002): the bandit rule SpecLane's warm-up and the UCB baseline share.

Play every arm once; then play ``argmax_a mean_a + sqrt(c * ln t / n_a)`` (``n_a`` = pulls of arm ``a``, ``t`` =
total pulls, ``c = 2`` in UCB1). Ties go to the lowest arm index.
"""

from __future__ import annotations

import math


class UCB1:
    """Upper-confidence-bound arm selection over ``n_arms`` arms with rewards averaged per arm.

    Args:
        n_arms: Number of arms.
        c: Exploration constant inside the square root.
    """

    __slots__ = ("n_arms", "c", "counts", "sums", "total")

    def __init__(self, n_arms: int, c: float = 2.0) -> None:
        self.n_arms, self.c = int(n_arms), float(c)
        self.clear()

    def clear(self) -> None:
        """Forget every reward."""
        self.counts = [0] * self.n_arms
        self.sums = [0.0] * self.n_arms
        self.total = 0

    def select(self) -> int:
        """Index of the arm to play next."""
        counts, sums = self.counts, self.sums
        for i, n in enumerate(counts):
            if n == 0:
                return i
        scale = self.c * math.log(self.total)
        best_i, best_v = 0, -math.inf
        for i, n in enumerate(counts):
            v = sums[i] / n + math.sqrt(scale / n)
            if v > best_v:
                best_i, best_v = i, v
        return best_i

    def update(self, arm: int, reward: float) -> None:
        """Credit ``arm`` with one pull of ``reward``."""
        self.counts[arm] += 1
        self.sums[arm] += reward
        self.total += 1

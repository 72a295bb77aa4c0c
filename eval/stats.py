"""Paired bootstrap confidence intervals for ratios of total times over requests, and the geometric mean of ratios.

Every controller of an evaluation ran the same requests with the same random draws, so the ratio of two controllers'
total times is a paired statistic: resampling requests (with replacement) and recomputing the ratio of sums on each
resample gives its sampling distribution. One set of resamples (a weight matrix, fixed seed) serves every ratio of a
report, so all intervals are paired with each other too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def geomean(values: Sequence[float] | np.ndarray, axis: int | None = None) -> Any:
    """The geometric mean of positive ratios (NaN for none): how speedups over cells, seeds or concurrencies are
    averaged. With ``axis``, the means along that axis of an array."""
    if axis is not None:
        return np.exp(np.log(np.asarray(values, dtype=float)).mean(axis))
    return math.exp(sum(math.log(v) for v in values) / len(values)) if len(values) else math.nan


class PairedBootstrap:
    """Resamples of ``n`` requests: ``weights[b, r]`` = how often request ``r`` is drawn in resample ``b``.

    Args:
        n: Number of requests.
        resamples: Number of bootstrap resamples (0 disables the intervals).
        seed: Seed of the resampling.
        level: Confidence level of :meth:`ratio_ci`.
    """

    def __init__(self, n: int, resamples: int = 2000, seed: int = 0, level: float = 0.95):
        self.n, self.resamples, self.level = int(n), int(resamples), float(level)
        rng = np.random.default_rng(seed)
        self.weights = np.zeros((self.resamples, self.n), dtype=np.float32)
        for b in range(self.resamples):
            self.weights[b] = np.bincount(rng.integers(0, self.n, self.n), minlength=self.n)

    def totals(self, per_request: np.ndarray) -> np.ndarray:
        """Resampled totals of a per-request quantity, shape ``(resamples,)``."""
        return self.weights @ np.asarray(per_request, dtype=np.float32)

    def ratio_ci(self, numerator: np.ndarray, denominator: np.ndarray) -> tuple[float, float] | None:
        """Percentile interval of ``sum(numerator) / sum(denominator)`` (per-request arrays); None if disabled."""
        if self.resamples == 0:
            return None
        r = self.totals(numerator) / self.totals(denominator)
        a = (1.0 - self.level) / 2.0
        lo, hi = np.quantile(r, [a, 1.0 - a])
        return float(lo), float(hi)

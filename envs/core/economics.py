"""The economics of a round, shared by the cost-aware features and the ``marginal`` baseline.

* :class:`Calibration`: the draft's confidence is not its acceptance probability (a draft can be over- or
  under-confident). Online Platt scaling, ``a(c) = sigmoid(w * logit(c) + b)``, fitted per request by stochastic
  gradient steps on the judged tokens (the accepted prefix and the first rejected token of each round), starting
  from the identity (``w = 1, b = 0``: confidence taken at face value).
* :class:`RoundCosts`: the cost model of one request's profile as a table, ``cost(j)`` for a round that drafts ``j``
  tokens, and the two decisions built on it:

  - the **marginal ratio** of drafting one more token after ``j``: with ``E_j`` the expected tokens the round
    produces if it verifies now (``1 + sum_m P_m``, ``P_m`` the probability that the first ``m`` drafts are all
    accepted) and ``a`` the expected acceptance of the next draft, one more draft adds ``P_j * a`` expected tokens
    for ``cost(j + 1) - cost(j)`` more time. Drafting on raises the round's rate ``E / cost`` iff
    ``(P_j * a / (cost(j + 1) - cost(j))) / (E_j / cost(j)) > 1``;
  - the **model-optimal K** for a per-token acceptance ``alpha``: ``argmax_K E(K) / cost(K)`` with the geometric
    ``E(K) = (1 - alpha^(K+1)) / (1 - alpha)``, every cost term included (draft, verify slope, overhead).
* :func:`expected_tokens` / :func:`expected_tokens_upto` (``E(K)``) and :func:`best_k_for_costs` (the model-optimal
  K for any cost table): the one definition every user of the geometric model reads (``RoundCosts``, SpecLane's
  gain, the batch features' and SmartSpec's goodput K).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specgym.envs.core.cost import CostProfile

_LO, _HI = 1e-4, 1.0 - 1e-4


def logit(p: float) -> float:
    """``log(p / (1 - p))`` with ``p`` clipped to ``[1e-4, 1 - 1e-4]``."""
    p = _LO if p < _LO else (_HI if p > _HI else p)
    return math.log(p / (1.0 - p))


def expected_tokens(k: int, alpha: float) -> float:
    """``E(K)``: expected tokens of a round drafting ``k`` under geometric acceptance ``alpha`` (the accepted prefix
    plus the target's own token), ``(1 - alpha^(K+1)) / (1 - alpha)``; ``K + 1`` for ``alpha >= 1``."""
    return k + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_tokens_upto(k_max: int, alpha: float) -> np.ndarray:
    """``E(0), ..., E(k_max)`` of :func:`expected_tokens`, vectorised."""
    ks = np.arange(k_max + 1)
    if alpha >= 1.0:
        return ks + 1.0
    return (1.0 - alpha ** (ks + 1)) / (1.0 - alpha)


def best_k_for_costs(alpha: float, costs: np.ndarray) -> int:
    """The model-optimal K: ``argmax_K E(K) / costs[K]`` over ``K = 0..len(costs) - 1`` (ties to the smaller K)."""
    return int(np.argmax(expected_tokens_upto(len(costs) - 1, alpha) / costs))


class Calibration:
    """Online Platt scaling of draft confidence into acceptance probability (per request).

    Args:
        lr: Step size of the stochastic gradient steps (log-loss).
    """

    __slots__ = ("w", "b", "lr")

    def __init__(self, lr: float = 0.05):
        self.lr = lr
        self.reset()

    def reset(self) -> None:
        """Back to the identity: confidence taken at face value."""
        self.w, self.b = 1.0, 0.0

    def accept_prob(self, conf: float) -> float:
        """Calibrated acceptance probability of a draft token with confidence ``conf``."""
        z = self.w * logit(conf) + self.b
        return 1.0 / (1.0 + math.exp(-z)) if z > -30.0 else 0.0

    def update_round(self, confs: Sequence[float], accepted: int) -> None:
        """One gradient step per judged token of a round, in order: the first ``accepted`` were accepted."""
        w, b, lr = self.w, self.b, self.lr
        for m, c in enumerate(confs):
            c = _LO if c < _LO else (_HI if c > _HI else c)
            x = math.log(c / (1.0 - c))
            z = w * x + b
            err = (1.0 if m < accepted else 0.0) - (1.0 / (1.0 + math.exp(-z)) if z > -30.0 else 0.0)
            w += lr * err * x
            b += lr * err
        self.w, self.b = w, b


class RoundCosts:
    """A request's round costs: ``cost[j]`` = time of a round drafting ``j`` tokens (``cost[0] = t_AR``).

    With a context term in the profile the costs depend on the KV cache: :meth:`at_context` moves them to the
    cache of the next round (the feature tracker calls it with ``prompt_len + tokens generated``); without one the
    table never changes.

    Args:
        profile: The request's cost profile.
        k_max: Largest draft cap.
        drafter: The drafter whose costs these are (``None``: the profile's default).
    """

    __slots__ = ("cost", "k_max", "t_ar", "_best", "_base", "_per_kv")

    #: ``best_k`` resolves ``alpha`` to this grid (and memoises per grid point): exact but at breakpoints.
    ALPHA_GRID = 4096

    def __init__(self, profile: CostProfile, k_max: int, drafter: str | None = None):
        self.k_max = int(k_max)
        table = profile.round_table(self.k_max, drafter)
        self._base = table.base.tolist()
        self._per_kv = table.per_kv.tolist() if table.has_context else None
        self.cost = list(self._base)
        self.t_ar = self.cost[0]
        self._best: dict[int, int] = {}

    @property
    def has_context(self) -> bool:
        """True when the costs depend on the KV cache."""
        return self._per_kv is not None

    def at_context(self, kv: float) -> None:
        """Price the next rounds at ``kv`` cached tokens (no-op without a context term)."""
        per_kv = self._per_kv
        if per_kv is None:
            return
        self.cost = [b + s * kv for b, s in zip(self._base, per_kv)]
        self.t_ar = self.cost[0]
        self._best.clear()

    def marginal_ratio(self, j: int, expected: float, prefix_prob: float, next_accept: float) -> float:
        """``(gain / extra cost) / (E_j / cost(j))`` of drafting token ``j + 1`` (> 1: drafting on pays).

        Args:
            j: Tokens drafted so far in the round (``< k_max``).
            expected: ``E_j``, expected tokens produced if the round verifies now.
            prefix_prob: ``P_j``, probability that all ``j`` drafts are accepted (1 for ``j = 0``).
            next_accept: Expected acceptance of the next draft token.
        """
        extra = self.cost[j + 1] - self.cost[j]
        rate = expected / self.cost[j]
        gain = prefix_prob * next_accept
        if extra <= 0.0:
            return math.inf if gain > 0.0 else 1.0
        return gain / extra / rate

    def rate(self, k: int, alpha: float) -> float:
        """Expected tokens per ms of rounds drafting ``k`` tokens under geometric acceptance ``alpha``."""
        return expected_tokens(k, alpha) / self.cost[k]

    def best_k(self, alpha: float) -> int:
        """Integer K in ``0..k_max`` maximising ``E(K) / cost(K)`` under geometric acceptance ``alpha``.

        ``alpha`` is rounded to a multiple of ``1 / ALPHA_GRID`` (the answer is memoised per grid point: the
        features ask every round).
        """
        key = int(alpha * self.ALPHA_GRID + 0.5)
        k = self._best.get(key)
        if k is None:
            k = self._best[key] = self._best_k(key / self.ALPHA_GRID)
        return k

    def _best_k(self, alpha: float) -> int:
        """:func:`best_k_for_costs` as an early-stopping scan (the features ask every round): for K >= 1 the rate
        is quasi-concave in K (costs are affine in K beyond the first draft), so it stops at the first decrease;
        K = 0 (no round overhead) is compared separately."""
        cost = self.cost
        best_k, best_rate = 1, (1.0 + alpha) / cost[1]
        tokens, power = 1.0 + alpha, alpha
        for k in range(2, self.k_max + 1):
            power *= alpha
            tokens += power  # 1 + alpha + ... + alpha^k
            rate = tokens / cost[k]
            if rate <= best_rate:
                break
            best_k, best_rate = k, rate
        return best_k if best_rate > 1.0 / cost[0] else 0

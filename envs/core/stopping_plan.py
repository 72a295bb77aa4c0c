"""Optimal stopping on predicted acceptance: when to stop drafting, planned over the tokens still to come.

The marginal rule (:mod:`specgym.envs.core.economics`) is myopic: it drafts one more token iff that token alone
raises the round's rate, and assumes the next token is as likely to be accepted as the current one. With a sharp
acceptance predictor the predictions are persistent — inside a repeated span the context lookup agrees token after
token — so a token with a middling prediction is often worth drafting for the run it may open. This module plans
for that, sequentially and without looking ahead at the draft:

* **Continuation model** (:class:`ContinuationModel`, fitted on a train split): the predictions are binned
  (quantile edges); ``T[b, b']`` is the probability that the next draft token's prediction falls in bin ``b'``
  given that the current one's fell in ``b`` *and the current token was accepted* (only then does the next one
  count); ``initial`` is the distribution of the first draft token's prediction.
* **Renewal-reward objective.** Long-run throughput ``tokens / time`` is maximised by the policy that maximises
  ``E[tokens] - lambda * E[time]`` per round at ``lambda`` = the optimal rate (Dinkelbach). :class:`StoppingPlan`
  solves the per-round problem by backward induction over (drafted ``j``, prefix probability ``P_j``, prediction
  bin), with ``P`` on a log grid, and finds ``lambda`` as the fixed point of the rate the model predicts for its own
  policy.
* **Decision.** After ``j`` draft tokens with prefix probability ``P_j`` and current prediction ``p_j``: draft on iff
  ``C_j(P_j, bin(p_j)) > 0``, the expected gain of continuing (and then stopping optimally) over verifying now. A
  round is opened iff its expected ``tokens - lambda * time`` under the plan beats a plain step's ``1 - lambda *
  t_AR``.

The decision is a table look-up (``O(1)`` per draft token); tables are built once per cost profile.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specgym.envs.core.economics import RoundCosts
from specgym.errors import SpecgymError

_LOG_P_MIN = math.log(1e-4)  # prefix probabilities below this are worth nothing more
_GRID = 96
_LAMBDA_ITERS = 30


@dataclass(frozen=True)
class ContinuationModel:
    """How the predicted acceptance of the next draft token follows the current one's (see the module docstring).

    Attributes:
        edges: ``(B - 1,)`` inner bin edges of the predictions, increasing.
        centers: ``(B,)`` mean prediction of each bin (the acceptance probability a token of that bin is priced at).
        transition: ``(B, B)`` row-stochastic ``P(bin of p_{i+1} | bin of p_i, token i accepted)``.
        initial: ``(B,)`` distribution of a round's first prediction.
    """

    edges: np.ndarray
    centers: np.ndarray
    transition: np.ndarray
    initial: np.ndarray
    _edge_list: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_edge_list", self.edges.tolist())  # the per-token look-up stays in plain Python

    def bin(self, p: float) -> int:
        """The bin of prediction ``p``."""
        return bisect.bisect_right(self._edge_list, p)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"edges": self.edges.tolist(), "centers": self.centers.tolist(),
                "transition": self.transition.tolist(), "initial": self.initial.tolist()}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ContinuationModel:
        """Build and validate; a defect raises one line naming ``where``."""
        try:
            m = cls(*(np.asarray(d[k], dtype=np.float64) for k in ("edges", "centers", "transition", "initial")))
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecgymError(f"{where}: malformed continuation model ({exc})") from None
        b = m.centers.shape[0] if m.centers.ndim == 1 else 0
        ok = (b >= 1 and m.edges.shape == (b - 1,) and m.transition.shape == (b, b) and m.initial.shape == (b,)
              and bool(np.all(np.diff(m.edges) > 0)) and bool(np.all((m.centers >= 0) & (m.centers <= 1)))
              and bool(np.all(m.transition >= 0)) and np.allclose(m.transition.sum(axis=1), 1.0, atol=1e-6)
              and bool(np.all(m.initial >= 0)) and abs(float(m.initial.sum()) - 1.0) < 1e-6)
        if not ok:
            raise SpecgymError(f"{where}: continuation model is inconsistent (shapes, increasing edges, "
                               f"probabilities in [0, 1], rows summing to 1)")
        return m


def fit_continuation(p: np.ndarray, accepted: np.ndarray, request: np.ndarray, bins: int = 16,
                     prior: float = 1.0) -> ContinuationModel:
    """Fit a :class:`ContinuationModel` on the predictions of consecutive completion positions.

    Args:
        p: ``(n,)`` predicted acceptance per position, positions of a request consecutive and in order.
        accepted: ``(n,)`` acceptance per position (greedy: the 0/1 accept bit; sampled: ``p_accept``): the weight
            of the transition to the next position.
        request: ``(n,)`` request index per position (a transition never crosses two requests).
        bins: Number of quantile bins.
        prior: Pseudo-count per row spread by the overall next-bin distribution (rows seen rarely stay sane).
    """
    p = np.asarray(p, dtype=np.float64)
    if p.size < 2:
        raise SpecgymError("fit_continuation: need at least two positions")
    edges = np.unique(np.quantile(p, np.linspace(0.0, 1.0, bins + 1)[1:-1]))
    b = np.searchsorted(edges, p, side="right")
    nb = len(edges) + 1
    centers = np.array([p[b == i].mean() if np.any(b == i) else 0.5 for i in range(nb)])
    same = np.asarray(request)[1:] == np.asarray(request)[:-1]
    w = np.asarray(accepted, dtype=np.float64)[:-1] * same
    counts = np.zeros((nb, nb))
    np.add.at(counts, (b[:-1], b[1:]), w)
    overall = counts.sum(axis=0) + 1e-9
    counts += prior * overall / overall.sum()
    transition = counts / counts.sum(axis=1, keepdims=True)
    # a round's first token follows a rejection or a full round: the positions after a judged token
    first = np.concatenate([[True], ~same])
    initial = np.bincount(b, minlength=nb).astype(np.float64) + np.bincount(b[first], minlength=nb)
    return ContinuationModel(edges, centers, transition, initial / initial.sum())


class StoppingPlan:
    """The optimal stopping tables of one cost profile (see the module docstring).

    Args:
        model: The continuation model of the predictions.
        costs: The request's round costs.
        rate: The ``lambda`` of the objective (tokens per ms); default: the fixed point of the model's own rate.
    """

    def __init__(self, model: ContinuationModel, costs: RoundCosts, rate: float | None = None):
        self.model = model
        self.k_max = costs.k_max
        self._cost = np.asarray(costs.cost, dtype=np.float64)
        self._log_grid = np.linspace(_LOG_P_MIN, 0.0, _GRID)
        self._step = self._log_grid[1] - self._log_grid[0]
        self.rate = self._fixed_point() if rate is None else float(rate)
        gains, tokens, time = self._solve(self.rate)
        #: expected gain of opening a round (then following the plan) over a plain target step, at ``rate``
        self.open_gain = (tokens - self.rate * time) - (1.0 - self.rate * float(self._cost[0]))
        # per j (1-based; index 0 unused): the gain table as Python lists, rows = grid point, columns = bin
        self._gain = [g.tolist() for g in gains]

    def keep_drafting(self, drafted: int, prefix_prob: float, p: float) -> bool:
        """Draft token ``drafted + 1`` given prefix probability ``prefix_prob`` and the current prediction ``p``."""
        if drafted >= self.k_max or drafted < 1 or prefix_prob <= 0.0:
            return False
        x = (math.log(prefix_prob) - _LOG_P_MIN) / self._step
        if x <= 0.0:
            return False
        b = self.model.bin(p)
        table = self._gain[drafted]
        i = min(int(x), _GRID - 2)
        f = min(x - i, 1.0)
        return (1.0 - f) * table[i][b] + f * table[i + 1][b] > 0.0

    def _interp(self, values: np.ndarray, log_p: np.ndarray) -> np.ndarray:
        """``values`` (grid x bins) at ``log_p`` (grid x bins), column by column; 0 below the grid."""
        out = np.empty_like(log_p)
        for j in range(values.shape[1]):
            out[:, j] = np.interp(log_p[:, j], self._log_grid, values[:, j], left=0.0)
        return out

    def _solve(self, lam: float) -> tuple[list[np.ndarray], float, float]:
        """Backward induction at ``lam``: the gain tables and the model's tokens and time per opened round."""
        c = self.model.centers
        t = self.model.transition
        grid_p = np.exp(self._log_grid)[:, None] * c[None, :]  # next prefix prob per (grid point, next bin)
        log_next = np.log(np.maximum(grid_p, 1e-300))
        nb = len(c)
        zero = np.zeros((_GRID, nb))
        gains: list[np.ndarray] = [zero] * (self.k_max + 1)
        g_next = zero  # value of an optimal continuation at j + 1
        tok_next, time_next = zero, zero  # expected extra tokens / time under the policy from j + 1 on
        for j in range(self.k_max - 1, 0, -1):
            delta = self._cost[j + 1] - self._cost[j]
            cont = (grid_p + self._interp(g_next, log_next)) @ t.T - lam * delta
            gains[j] = cont
            go = cont > 0.0
            tok = np.where(go, (grid_p + self._interp(tok_next, log_next)) @ t.T, 0.0)
            tim = np.where(go, delta + self._interp(time_next, log_next) @ t.T, 0.0)
            g_next, tok_next, time_next = np.maximum(cont, 0.0), tok, tim
        # an opened round drafts its first token (prediction from ``initial``), then follows the policy
        first = np.log(np.maximum(c, 1e-300))
        idx = np.arange(nb)
        tok1 = np.array([np.interp(first[b], self._log_grid, tok_next[:, b], left=0.0) for b in idx])
        time1 = np.array([np.interp(first[b], self._log_grid, time_next[:, b], left=0.0) for b in idx])
        w = self.model.initial
        tokens = 1.0 + float(w @ (c + tok1))
        time = float(self._cost[1] + w @ time1)
        return gains, tokens, time

    def _fixed_point(self) -> float:
        """Dinkelbach's iteration: ``lambda <- tokens / time`` of the policy optimal at ``lambda``."""
        lam = 1.0 / self._cost[0]
        for _ in range(_LAMBDA_ITERS):
            _, tokens, time = self._solve(lam)
            new = tokens / time
            if abs(new - lam) <= 1e-9 * lam:
                return new
            lam = new
        return lam

"""Per-position acceptance estimators of a serving batch: what the budget rules read.

Each estimator gives, for every request in flight, ``c[r, j]``: the probability that draft position ``j`` (0-based) is
accepted given positions ``< j`` were, so that ``prod_{i <= j} c[r, i]`` is the survival of position ``j``. All learn
from the same labels of each verified step, vLLM's (#52228): the accepted positions (label 1) and the first rejected
one (label 0; none when every verified position was accepted); positions past the first rejection are unobserved.
The traces behind the rules (published per-start runs) carry no draft-token confidence, so every input here is built
from those labels.

* ``ema`` -- vLLM's EMA-of-confidence input, per request and position: ``c <- 0.8 c + 0.2 label`` (alpha 0.8 on the
  history), a new request starting at 1.0 (vLLM's value for a request without a previous step).
* ``pos-ema`` -- one EMA per position pooled over the batch (``c_j <- 0.9 c_j + 0.1 * mean label at j``), the same
  for every request.
* ``logistic`` -- vLLM's online estimator: a logistic model per position refitted every 100 steps on the labels
  seen so far (the last 50,000). vLLM's input, the top-2 logit margin, is not in these traces; the inputs here
  (a documented substitution) are what a scheduler knows of the request: the EMA (0.8 on the history) of its
  labels' mean per step and its last step's labels' mean. Before the first fit the pooled ``pos-ema`` answers.

Labels only come from verified drafts, so an estimator that predicts rejection could keep a rule at plain steps
for ever (vLLM's confidences come from drafts it always makes). ``pos-ema`` after a step without labels, and
``logistic``'s inputs for a request that verified nothing, drift back toward their prior (0.7) at their EMA rate:
a rule stuck at plain decoding retries.
* ``predictor:NAME`` -- specgym's acceptance predictor on the drafter's own signals of the tokens it drafts this
  step (:attr:`~specgym.envs.core.batch.BatchState.draft_view`; the engine is given the predictor's probabilities
  over the trace, :meth:`DraftView.workload_signal`): what a token-level stop sees while drafting. It needs a trace
  with draft signals (the recorded midpair; the published EAGLE traces have none).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from specgym.catalogue import resolve as resolve_shipped
from specgym.envs.core.acceptance_predictor import AcceptancePredictor, load_predictor, workload_predictions
from specgym.envs.core.batch import BatchState, BatchStep
from specgym.errors import SpecgymError
from specgym.paths import MODEL_ROOTS


def step_labels(step: BatchStep, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(label, observed)``, each ``(batch, width)``: accepted positions are 1, the first rejection 0, observed
    marks both (vLLM's labels)."""
    j = np.arange(width)[None, :]
    a = step.accepted[:, None]
    acc = j < a
    rej = (j == a) & (step.accepted < step.planned_k)[:, None]
    return acc, acc | rej


class AcceptanceEstimator(ABC):
    """Per-slot, per-position conditional acceptance (module docstring).

    Lifecycle: ``reset(slots, width)``, ``admit(new_slots)`` when requests enter, ``confidences(slots)`` before a
    step, ``update(step)`` after it.
    """

    name = "estimator"

    def reset(self, slots: int, width: int) -> None:
        """A new run with ``slots`` slots and ``width`` draft positions."""
        self.slots, self.width = int(slots), int(width)

    def admit(self, new_slots: np.ndarray) -> None:  # noqa: B027  (optional hook)
        """Requests entered these slots (default: nothing)."""

    def see(self, state: BatchState) -> None:  # noqa: B027  (optional hook)
        """The state before the step (default: nothing)."""

    @abstractmethod
    def confidences(self, slots: np.ndarray) -> np.ndarray:
        """``(len(slots), width)`` conditional acceptances."""

    @abstractmethod
    def update(self, step: BatchStep) -> None:
        """Learn from a verified step."""


class EmaPerRequest(AcceptanceEstimator):
    """vLLM's EMA-of-confidence input: per request and position, new requests at 1.0."""

    name = "ema"

    def __init__(self, alpha: float = 0.8):
        self.alpha = float(alpha)

    def reset(self, slots: int, width: int) -> None:
        super().reset(slots, width)
        self.c = np.ones((slots, width))

    def admit(self, new_slots: np.ndarray) -> None:
        self.c[new_slots] = 1.0

    def confidences(self, slots: np.ndarray) -> np.ndarray:
        return self.c[slots]

    def update(self, step: BatchStep) -> None:
        label, seen = step_labels(step, self.width)
        c = self.c[step.slots]
        self.c[step.slots] = np.where(seen, self.alpha * c + (1.0 - self.alpha) * label, c)


class EmaPerPosition(AcceptanceEstimator):
    """One EMA per position, pooled over the batch."""

    name = "pos-ema"

    def __init__(self, beta: float = 0.9, prior: float = 0.7):
        self.beta, self.prior = float(beta), float(prior)

    def reset(self, slots: int, width: int) -> None:
        super().reset(slots, width)
        self.rate = np.full(width, self.prior)

    def confidences(self, slots: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self.rate, (len(slots), self.width))

    def update(self, step: BatchStep) -> None:
        label, seen = step_labels(step, self.width)
        n = seen.sum(axis=0)
        has = n > 0
        if not has.any():  # nothing verified: drift back to the prior, so that a rule stuck at plain steps retries
            self.rate = self.beta * self.rate + (1.0 - self.beta) * self.prior
            return
        mean = label.sum(axis=0)[has] / n[has]
        self.rate[has] = self.beta * self.rate[has] + (1.0 - self.beta) * mean


_NF = 3  # inputs of the online logistic model (the intercept included)
_PRIOR = 0.7  # a request's label mean before any evidence


class OnlineLogistic(AcceptanceEstimator):
    """vLLM's online per-position logistic estimator, refitted every ``refit_every`` steps (module docstring)."""

    name = "logistic"

    def __init__(self, refit_every: int = 100, window: int = 50_000, alpha: float = 0.8, l2: float = 1e-2):
        self.refit_every, self.window, self.alpha, self.l2 = int(refit_every), int(window), float(alpha), float(l2)

    def reset(self, slots: int, width: int) -> None:
        super().reset(slots, width)
        self.pooled = EmaPerPosition()
        self.pooled.reset(slots, width)
        self.ema = np.full(slots, _PRIOR)  # the request's own EMA of its labels' mean
        self.last = np.full(slots, _PRIOR)  # its last step's labels' mean (accepted share of the observed positions)
        self.w: np.ndarray | None = None  # (_NF, width) once fitted
        self._x: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self._j: list[np.ndarray] = []
        self._n = 0
        self.steps = 0

    def admit(self, new_slots: np.ndarray) -> None:
        self.ema[new_slots] = self.last[new_slots] = _PRIOR

    def _features(self, slots: np.ndarray) -> np.ndarray:
        return np.stack([np.ones(len(slots)), self.ema[slots], self.last[slots]], axis=1)

    def confidences(self, slots: np.ndarray) -> np.ndarray:
        if self.w is None:
            return self.pooled.confidences(slots)
        return 1.0 / (1.0 + np.exp(-np.clip(self._features(slots) @ self.w, -30.0, 30.0)))

    def update(self, step: BatchStep) -> None:
        self.pooled.update(step)
        label, seen = step_labels(step, self.width)
        rows, cols = np.nonzero(seen)
        if len(rows):
            self._x.append(self._features(step.slots)[rows])
            self._y.append(label[rows, cols].astype(np.float64))
            self._j.append(cols)
            self._n += len(rows)
        n_seen = seen.sum(axis=1)
        has = n_seen > 0
        share = label.sum(axis=1)[has] / n_seen[has]
        s = step.slots[has]
        self.ema[s] = self.alpha * self.ema[s] + (1.0 - self.alpha) * share
        self.last[s] = share
        idle = step.slots[~has]  # verified nothing: drift back to the prior (a request stuck at plain steps retries)
        self.ema[idle] = self.alpha * self.ema[idle] + (1.0 - self.alpha) * _PRIOR
        self.last[idle] = self.alpha * self.last[idle] + (1.0 - self.alpha) * _PRIOR
        self.steps += 1
        if self.steps % self.refit_every == 0 and self._n:
            self._refit()

    def _refit(self) -> None:
        x, y, j = np.concatenate(self._x), np.concatenate(self._y), np.concatenate(self._j)
        x, y, j = x[-self.window:], y[-self.window:], j[-self.window:]
        self._x, self._y, self._j, self._n = [x], [y], [j], len(y)
        w = np.zeros((_NF, self.width)) if self.w is None else self.w.copy()
        for pos in range(self.width):
            m = j == pos
            if m.sum() < 20:  # too few labels: the pooled rate as an intercept
                r = float(np.clip(self.pooled.rate[pos], 1e-3, 1 - 1e-3))
                w[:, pos] = 0.0
                w[0, pos] = np.log(r / (1 - r))
                continue
            xs, ys, wp = x[m], y[m], w[:, pos]
            for _ in range(6):  # Newton steps on the L2-regularised log loss
                p = 1.0 / (1.0 + np.exp(-np.clip(xs @ wp, -30.0, 30.0)))
                g = xs.T @ (p - ys) + self.l2 * wp
                h = (xs * (p * (1 - p))[:, None]).T @ xs + self.l2 * np.eye(_NF)
                wp = wp - np.linalg.solve(h, g)
            w[:, pos] = wp
        self.w = w


class DraftView(AcceptanceEstimator):
    """specgym's acceptance predictor on this step's drafts (module docstring)."""

    def __init__(self, predictor: AcceptancePredictor, label: str):
        self.predictor = predictor
        self.name = f"predictor:{label}"
        self._view: np.ndarray | None = None

    def workload_signal(self, workload: object) -> np.ndarray:
        """The signal the engine must be given: the predictor's probability at every position of ``workload``."""
        return workload_predictions(self.predictor, workload, MODEL_ROOTS)

    def see(self, state: BatchState) -> None:
        if state.draft_view is None:
            raise SpecgymError(f"{self.name}: the engine reports no draft view (give BatchReplay draft_signal="
                               f"estimator.workload_signal(workload); specgym tune sweep does)")
        self._view = state.draft_view

    def confidences(self, slots: np.ndarray) -> np.ndarray:
        assert self._view is not None
        return self._view[:, :self.width]

    def update(self, step: BatchStep) -> None:
        pass


ESTIMATORS = {"ema": EmaPerRequest, "pos-ema": EmaPerPosition, "logistic": OnlineLogistic}


def make_estimator(name: str | None, default: str = "ema") -> AcceptanceEstimator:
    """An estimator by name (``ema``, ``pos-ema``, ``logistic``, ``predictor:NAME|FILE``)."""
    key = (name or default).strip()
    if key.lower().startswith("predictor:"):
        arg = key.split(":", 1)[1]
        return DraftView(load_predictor(resolve_shipped("predictor", arg)), arg)
    if key.lower() not in ESTIMATORS:
        raise SpecgymError(f"unknown acceptance estimator {key!r}; valid: {', '.join(ESTIMATORS)}, "
                           f"predictor:NAME|FILE")
    return ESTIMATORS[key.lower()]()

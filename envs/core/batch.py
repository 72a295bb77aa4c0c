"""Records and the controller interface of batched serving (many sequences in flight, one decision per step).

Data flows one way, as for single requests: batched engine -> :class:`BatchStep` -> :class:`BatchController` ->
decision. A batch controller sees the step's :class:`BatchState` (batch size, queue, target concurrency, the slots in
flight) and returns one K for the whole batch (as vLLM's speculative config applies it), one K per sequence, or a
:class:`BatchDecision`: per sequence, the tokens drafted and the prefix of them verified (vLLM's adaptive
verification drafts the full K and verifies a budget split across the requests; specgym's allocator cuts both).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.controller import Prepared


@dataclass(slots=True)
class BatchState:
    """What a batch controller knows before a step.

    Attributes:
        batch: Sequences in flight.
        queue: Requests waiting for a slot.
        concurrency: The current concurrency target (closed loop) or batch limit (open loop).
        slots: The slots in flight, in the order a per-sequence K array must follow.
        new_slots: Slots whose request entered since the last step (per-sequence controllers reset them).
        kv_tokens: Tokens in the KV cache over the whole batch (what a scheduler knows; 0 when not reported).
        draft_view: ``(batch, k_max)`` a per-position signal of the tokens each sequence would draft next (e.g. an
            acceptance predictor's probability from the drafter's own signals, as a token-level stop sees them
            while drafting), when the engine was given one; ``None`` otherwise.
    """

    batch: int
    queue: int
    concurrency: int
    slots: np.ndarray
    new_slots: np.ndarray
    kv_tokens: int = 0
    draft_view: np.ndarray | None = None


@dataclass(slots=True)
class BatchDecision:
    """One serving step's ragged decision.

    Attributes:
        verify: Draft tokens verified per sequence (a prefix of its draft), ``(batch,)`` in ``state.slots`` order,
            or one int for every sequence.
        draft: Draft tokens proposed per sequence (``None``: as many as verified); a sequence drafts at least what it
            verifies. An autoregressive drafter runs as many draft steps as the longest draft.
    """

    verify: np.ndarray | int
    draft: np.ndarray | int | None = None


@dataclass(slots=True)
class BatchStep:
    """One verified step of the whole batch.

    Attributes:
        batch: Sequences in the step.
        queue: Requests waiting (open loop) when the step started.
        slots: Slot index of each sequence in the step, ``(batch,)``.
        planned_k: Draft cap of each sequence after clipping, ``(batch,)``.
        accepted: Accepted draft tokens of each sequence, ``(batch,)``.
        produced: Tokens the step produced (``sum(accepted + 1)``).
        time_ms: The step's time.
        finished: Requests that finished in this step.
        drafted: Draft tokens proposed per sequence, ``(batch,)`` (``None``: ``planned_k``, nothing drafted beyond
            the verified prefix).
        tier: The step's K tier (the longest draft asked for, after any cooldown; with switch costs off, the longest
            draft run) and ``switched``: whether it changed tier.
    """

    batch: int
    queue: int
    slots: np.ndarray
    planned_k: np.ndarray
    accepted: np.ndarray
    produced: int
    time_ms: float
    finished: int
    drafted: np.ndarray | None = None
    tier: int = 0
    switched: bool = False


class BatchController(Prepared, ABC):
    """Chooses the draft length of each serving step.

    Lifecycle per run: ``reset(profile, k_max)``, then per step ``propose(state)`` -> ``observe(step)``.

    Attributes:
        name: Display name.
    """

    name: str = "batch-controller"

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        """Start a run on hardware priced by ``profile``."""
        self.profile, self.k_max = profile, k_max

    @abstractmethod
    def propose(self, state: BatchState) -> int | np.ndarray | BatchDecision:
        """The step's K (an int), one K per slot of ``state.slots``, or a :class:`BatchDecision`."""

    def observe(self, step: BatchStep) -> None:  # noqa: B027  (optional hook, like Controller.keep_drafting)
        """Learn from the verified step (default: nothing)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


BATCH_FEATURE_NAMES = (
    "log_batch", "log_queue", "log_concurrency", "alpha_fast", "alpha_slow", "last_k", "last_accepted",
    "draft_ratio", "verify_slope", "overhead_ratio", "k_goodput",
)
BATCH_FEATURE_DOCS = (
    "log2(batch) / log2(512) (clipped)", "log1p(queue) / log1p(512) (clipped)",
    "log2(concurrency target) / log2(512) (clipped)",
    "EMA (beta 0.5) of accepted / judged draft tokens across the batch",
    "EMA (beta 0.9) of accepted / judged draft tokens across the batch", "last step's mean cap / k_max",
    "last step's mean accepted / k_max", "draft(b) / verify(b, 1) at the current batch size (clipped to 2)",
    "(verify(b, k_max + 1) / verify(b, 1) - 1) / 8 at the current batch size (clipped to 1)",
    "overhead(b) / verify(b, 1) (clipped to 1)",
    "K maximising b * E(K) / step_time(b, K) under the slow acceptance estimate, / k_max (the goodput rule's K)",
)
_LOG512 = 9.0
_LOG1P512 = math.log1p(512.0)


class BatchFeatureTracker:
    """Observation of a batch controller (the batched env and the exported batch policy both use it)."""

    def __init__(self, k_max: int):
        self.k_max = int(k_max)
        self._ks1 = np.arange(1, self.k_max + 2)
        self.profile: BatchCostProfile | None = None
        self.reset(None)

    def reset(self, profile: BatchCostProfile | None) -> None:
        """A new run (on hardware priced by ``profile``)."""
        if profile is not None:
            self.profile = profile
        self.acc_f = self.acc_s = 0.6
        self.jud_f = self.jud_s = 1.0
        self.last_k = self.last_acc = 0.0
        self._cost: dict[int, tuple[float, float, float, np.ndarray]] = {}

    def _costs(self, b: int) -> tuple[float, float, float, np.ndarray]:
        c = self._cost.get(b)
        if c is None:
            prof = self.profile
            assert prof is not None
            t1 = prof.verify(b, 1)
            c = self._cost[b] = (min(prof.draft(b) / t1, 2.0),
                                 min((prof.verify(b, self.k_max + 1) / t1 - 1.0) / 8.0, 1.0),
                                 min(prof.overhead(b) / t1, 1.0), prof.step_times(b, self.k_max))
        return c

    def goodput_k(self, b: int) -> int:
        """The goodput rule's K at batch size ``b`` under the slow acceptance estimate."""
        alpha = min(self.acc_s / self.jud_s, 0.999)  # best_k_for_costs inlined: the env's hot path
        return int(np.argmax((1.0 - alpha ** self._ks1) / (1.0 - alpha) / self._costs(b)[3]))

    def update(self, step: BatchStep) -> None:
        """Fold one verified step in."""
        k, b = self.k_max, step.batch
        planned = int(step.planned_k.sum())
        accepted = int(step.accepted.sum())
        self.last_k = planned / b / k
        self.last_acc = accepted / b / k
        if planned == 0:
            return
        a = accepted / b
        j = float(np.minimum(step.accepted + 1, step.planned_k).sum()) / b
        self.acc_f, self.jud_f = 0.5 * self.acc_f + 0.5 * a, 0.5 * self.jud_f + 0.5 * j
        self.acc_s, self.jud_s = 0.9 * self.acc_s + 0.1 * a, 0.9 * self.jud_s + 0.1 * j

    def observation(self, state: BatchState) -> np.ndarray:
        """The observation before a step."""
        draft, slope, over, _ = self._costs(state.batch)
        return np.array([
            min(math.log2(state.batch) / _LOG512, 1.0), min(math.log1p(state.queue) / _LOG1P512, 1.0),
            min(math.log2(max(state.concurrency, 1)) / _LOG512, 1.0), self.acc_f / self.jud_f, self.acc_s / self.jud_s,
            self.last_k, self.last_acc, draft, slope, over, self.goodput_k(state.batch) / self.k_max,
        ], dtype=np.float32)

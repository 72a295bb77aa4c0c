"""SGLang's adaptive speculative steps (``adaptive_spec_params.py``; the pluggable ``AdaptiveSpecPolicy`` of
sgl-project/sglang#37274), with its shipped defaults.

The draft steps of a batch come from a tier list chosen by the batch size (candidates ``bs >= 1: [1, 3, 5, 7]``,
``bs >= 8: [0, 1, 3]``, ``bs >= 32: [0, 1]``, ``bs >= 64: [0]``), each a captured CUDA-graph tier. The policy keeps
an EMA of the accepted length (accepted drafts per request per step, alpha 0.2 on the new value); after 10 warm-up
batches, every 5 batches, its target is ``round(EMA) + 1`` clamped into the tier list: it steps up to the smallest
candidate at or above the target, and steps down (to the largest candidate at or below it) only when ``EMA + 1`` is
below the current steps by more than the hysteresis (-0.25). Until then it runs the tier list's largest candidate.
The protocol (``adaptive_runtime_state.py``): ``get_steps_for_batch(batch_size)`` before a step,
``on_verify_complete(num_correct_drafts_per_req, batch_size, num_steps)`` after it. Spec ``sglang-adaptive``.
"""

from __future__ import annotations

import numpy as np

from specgym.envs.core.batch import BatchController, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile

#: SGLang's shipped candidate steps by the smallest batch size of each tier.
CANDIDATE_STEPS = ((1, (1, 3, 5, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))


class SGLangAdaptiveSpec(BatchController):
    """The policy above.

    Args:
        ema_alpha: Weight of the new accepted length in the EMA.
        update_interval: Batches between two updates of the steps.
        warmup_batches: Batches before the first update.
        down_hysteresis: How far below the current steps ``EMA + 1`` must fall to step down.
        candidates: ``((min_batch, steps), ...)`` increasing in ``min_batch``.
    """

    name = "sglang-adaptive"

    def __init__(self, ema_alpha: float = 0.2, update_interval: int = 5, warmup_batches: int = 10,
                 down_hysteresis: float = -0.25, candidates: tuple[tuple[int, tuple[int, ...]], ...] =
                 CANDIDATE_STEPS):
        self.ema_alpha, self.update_interval, self.warmup_batches = ema_alpha, update_interval, warmup_batches
        self.down_hysteresis, self.candidates = down_hysteresis, candidates

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        super().reset(profile, k_max)
        self.ema: float | None = None
        self.batches = 0
        self.steps: int | None = None

    def tier(self, batch_size: int) -> tuple[int, ...]:
        """The candidate steps at ``batch_size`` (clipped to ``k_max``)."""
        steps = self.candidates[0][1]
        for lo, cands in self.candidates:
            if batch_size >= lo:
                steps = cands
        return tuple(sorted({min(s, self.k_max) for s in steps}))

    def get_steps_for_batch(self, batch_size: int) -> int:
        """The draft steps of the next batch."""
        cands = self.tier(batch_size)
        if self.steps is None or self.ema is None or self.batches < self.warmup_batches:
            return cands[-1] if self.steps is None else _clamp(self.steps, cands)
        cur = _clamp(self.steps, cands)
        if self.batches % self.update_interval == 0:
            target = min(max(round(self.ema) + 1, cands[0]), cands[-1])
            if target > cur:
                cur = min(c for c in cands if c >= target)
            elif target < cur and self.ema + 1.0 < cur + self.down_hysteresis:
                cur = max(c for c in cands if c <= target)
        return cur

    def on_verify_complete(self, num_correct_drafts_per_req: np.ndarray, batch_size: int, num_steps: int) -> None:
        """Fold one verified batch in."""
        self.batches += 1
        self.steps = num_steps
        if num_steps == 0 or batch_size == 0:
            return
        accept = float(np.mean(num_correct_drafts_per_req))
        self.ema = accept if self.ema is None else (1 - self.ema_alpha) * self.ema + self.ema_alpha * accept

    def propose(self, state: BatchState) -> int:
        self.steps = self.get_steps_for_batch(state.batch)
        return self.steps

    def observe(self, step: BatchStep) -> None:
        self.on_verify_complete(step.accepted, step.batch, int(self.steps or 0))


def _clamp(steps: int, cands: tuple[int, ...]) -> int:
    """``steps`` as a candidate of the tier list: the largest at or below it (or the smallest)."""
    below = [c for c in cands if c <= steps]
    return max(below) if below else cands[0]

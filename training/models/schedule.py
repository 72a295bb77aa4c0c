"""The learning-rate schedules of specgym's model builders, in one place: a warm-up then cosine decay driven by the
share of a budget used (``train-lm-pair`` and ``train-draft``, :func:`warmup_cosine`), and torch's one-cycle schedule
over a number of steps (``train-head``, :func:`one_cycle`)."""

from __future__ import annotations

import math
from typing import Any


def warmup_cosine(frac: float, peak: float, warm: float = 0.03, floor: float = 0.1) -> float:
    """Linear warm-up over the first ``warm`` of the budget, then cosine decay to ``floor * peak``.

    Args:
        frac: The share of the budget used (wall-clock seconds or steps), clipped to 1 at the end.
        peak: The peak learning rate.
        warm: The share of the budget spent warming up (the rate starts at 2% of the peak).
        floor: The final rate, as a share of the peak.

    Returns:
        The learning rate at ``frac``.
    """
    if frac < warm:
        return peak * max(frac / warm, 0.02)
    p = min(1.0, (frac - warm) / (1 - warm))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def one_cycle(opt: Any, peak: float, steps: int, pct_start: float = 0.05) -> Any:
    """Torch's ``OneCycleLR`` over ``steps`` optimiser steps, for any ``steps >= 1``.

    Torch divides by the warm-up's length in steps minus one (``pct_start * steps - 1``), which is zero when the
    warm-up is exactly one step (20 steps at 5%: a ``ZeroDivisionError`` on the first step). Such a warm-up is
    lengthened by a millionth of a step, which gives the learning rates torch means: the starting rate at step 0,
    the annealing from the peak after it. Every other ``steps`` gets torch's schedule unchanged.

    Args:
        opt: The optimiser.
        peak: The peak learning rate.
        steps: Optimiser steps (at least 1).
        pct_start: The share of the steps spent warming up.

    Returns:
        The scheduler (step it once per optimiser step).
    """
    import torch

    if steps < 1:
        raise ValueError(f"one_cycle: steps must be at least 1, got {steps}")
    if float(pct_start * steps) - 1 == 0:
        pct_start = (1 + 1e-6) / steps
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=peak, total_steps=steps, pct_start=pct_start)

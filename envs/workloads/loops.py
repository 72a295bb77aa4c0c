"""Repetition loops of recorded completions: what a recording's summary (``extra.loop_share``) counts.

A small greedy pair falls into loops far more often than a large model, and loops are where a context lookup makes
drafting nearly free, so every recorded workload says how much of it loops (overall and per category); a merge of
recordings recomputes it over the merged requests (:func:`loop_summary`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def is_looped(tokens: Sequence[int], tail: int = 64, max_period: int = 32) -> bool:
    """True if the last ``tail`` tokens are periodic with some period <= ``max_period``."""
    t = list(tokens)[-tail:]
    if len(t) < tail:
        return False
    return any(all(t[j] == t[j - per] for j in range(per, len(t))) for per in range(1, max_period + 1))


def loop_share(completions: Sequence[Sequence[int]], tail: int = 64, max_period: int = 32) -> float:
    """Share of completions whose last ``tail`` tokens repeat with a period <= ``max_period`` (greedy loops)."""
    if not completions:
        return float("nan")
    return float(np.mean([is_looped(c, tail, max_period) for c in completions]))


def loop_summary(completions: Sequence[Sequence[int]], categories: Sequence[str]) -> dict[str, object]:
    """``{"loop_share", "loop_share_by_category"}`` of a recording (categories in first-seen order)."""
    return {"loop_share": loop_share(completions),
            "loop_share_by_category": {c: loop_share([x for x, k in zip(completions, categories) if k == c])
                                       for c in dict.fromkeys(categories)}}

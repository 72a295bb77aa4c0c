"""A run predictor: how many tokens each drafter's round will produce, from what is known before the round.

The drafter-choice rules need, per drafter ``d`` and cap ``K``, the expected tokens of a round:
``E[min(run_d, K)] + 1 = 1 + sum_{j=1..K} P(run_d >= j)``. This model estimates the survival ``P(run_d >= j)`` per
**context bucket**: the context lookup's match length (0..4, or unknown) times a log2 bucket of the completion
position (what a per-start trace and a live engine both know before a round, from token ids alone). It is fitted by
counting on a trace's runs (a workload's train split), each bucket's survival shrunk towards its drafter's pooled
survival with a prior weight of :data:`PRIOR` positions, so a rare bucket falls back to the drafter's average.

Draft confidence and the draft's hidden state are not inputs: SpecDecode-Bench's published traces carry neither.
The recent acceptance of each drafter is read by the rule that uses the predictor (online, per request:
:mod:`specgym.baselines.drafter_marginal`), not by this model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specgym.errors import SpecgymError

#: Lookup buckets: match lengths 0..4, then "unknown" (an engine without token ids).
LOOKUP_BUCKETS = 6
#: Position buckets: ``min(floor(log2(i + 1)), POSITION_BUCKETS - 1)``.
POSITION_BUCKETS = 12
#: Prior weight (positions) of the drafter's pooled survival in each bucket's estimate.
PRIOR = 20.0
#: Longest run the survival tables hold (caps beyond it read the last column).
MAX_RUN = 16


def bucket(lookup_len: int, position: int) -> int:
    """The context bucket of a round at ``position`` with lookup match ``lookup_len`` (-1: unknown)."""
    lk = LOOKUP_BUCKETS - 1 if lookup_len < 0 else min(int(lookup_len), LOOKUP_BUCKETS - 2)
    pos = min(int(math.log2(position + 1)), POSITION_BUCKETS - 1)
    return lk * POSITION_BUCKETS + pos


def buckets(lookup_len: np.ndarray | None, position: np.ndarray) -> np.ndarray:
    """:func:`bucket` of every position (``lookup_len`` None: unknown), vectorised."""
    pos = np.minimum(np.floor(np.log2(np.asarray(position, np.float64) + 1)).astype(np.int64), POSITION_BUCKETS - 1)
    if lookup_len is None:
        lk = np.full(len(pos), LOOKUP_BUCKETS - 1, np.int64)
    else:
        lk = np.asarray(lookup_len, np.int64)
        lk = np.where(lk < 0, LOOKUP_BUCKETS - 1, np.minimum(lk, LOOKUP_BUCKETS - 2))
    return lk * POSITION_BUCKETS + pos


@dataclass
class RunPredictor:
    """Per drafter, the expected tokens of a round at each cap in each context bucket.

    Attributes:
        drafters: The drafters it predicts, in order.
        expected: ``{drafter: (n_buckets, MAX_RUN + 1)}``: ``expected[b, K]`` = predicted tokens of a round with cap
            ``K`` in bucket ``b`` (``1 + sum_{j<=K} P(run >= j)``; ``K = 0``: 1).
        meta: Provenance (workload, split, positions).
    """

    drafters: tuple[str, ...]
    expected: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fit(cls, runs: dict[str, np.ndarray], lookup_len: np.ndarray | None, position: np.ndarray,
            meta: dict[str, Any] | None = None) -> RunPredictor:
        """Count survivals per bucket over flat positions.

        Args:
            runs: ``{drafter: flat runs}`` (one value per position).
            lookup_len: Flat context lookup per position (None: unknown everywhere).
            position: Flat completion position of each value.
            meta: Provenance to keep.
        """
        if not runs:
            raise SpecgymError("run predictor: no drafter to fit")
        b = buckets(lookup_len, position)
        n_b = LOOKUP_BUCKETS * POSITION_BUCKETS
        total = np.bincount(b, minlength=n_b).astype(np.float64)
        expected = {}
        for name, run in runs.items():
            run = np.minimum(np.asarray(run, np.int64), MAX_RUN)
            if len(run) != len(b):
                raise SpecgymError(f"run predictor: drafter {name!r} has {len(run)} runs for {len(b)} positions")
            # at_least[b, j] = #positions of bucket b whose run >= j, j = 1..MAX_RUN
            hist = np.zeros((n_b, MAX_RUN + 1))
            np.add.at(hist, (b, run), 1.0)
            at_least = hist[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]
            pooled = at_least.sum(axis=0) / max(total.sum(), 1.0)
            surv = (at_least + PRIOR * pooled[None, :]) / (total[:, None] + PRIOR)
            expected[name] = np.concatenate([np.ones((n_b, 1)), 1.0 + surv.cumsum(axis=1)], axis=1)
        return cls(tuple(runs), expected, dict(meta or {}, positions=int(len(b))))

    def expected_tokens(self, drafter: str, lookup_len: int, position: int) -> np.ndarray:
        """``(MAX_RUN + 1,)`` predicted tokens of a round with ``drafter`` at caps 0..MAX_RUN."""
        table = self.expected.get(drafter)
        if table is None:
            raise SpecgymError(f"run predictor predicts drafters {', '.join(self.drafters)}, not {drafter!r}")
        return table[bucket(lookup_len, position)]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"format": "specgym-run-predictor", "version": 1, "drafters": list(self.drafters),
                "lookup_buckets": LOOKUP_BUCKETS, "position_buckets": POSITION_BUCKETS, "max_run": MAX_RUN,
                "expected": {d: self.expected[d].round(6).tolist() for d in self.drafters}, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: Any, where: str = "<run predictor>") -> RunPredictor:
        """Read :meth:`to_dict`'s form; a defect is one line naming ``where`` and the field."""
        if not isinstance(d, dict) or d.get("format") != "specgym-run-predictor":
            raise SpecgymError(f"{where}: not a specgym run predictor (field 'format')")
        shape = (LOOKUP_BUCKETS * POSITION_BUCKETS, MAX_RUN + 1)
        if (d.get("lookup_buckets"), d.get("position_buckets"), d.get("max_run")) != (
                LOOKUP_BUCKETS, POSITION_BUCKETS, MAX_RUN):
            raise SpecgymError(f"{where}: buckets differ from this specgym's (fields lookup_buckets, "
                               f"position_buckets, max_run)")
        drafters = tuple(str(x) for x in d.get("drafters") or [])
        expected = {}
        for name in drafters:
            arr = np.asarray((d.get("expected") or {}).get(name), dtype=np.float64)
            if arr.shape != shape or not np.isfinite(arr).all():
                raise SpecgymError(f"{where}: field 'expected.{name}' must be a finite {shape} table")
            expected[name] = arr
        if not drafters:
            raise SpecgymError(f"{where}: field 'drafters' is empty")
        return cls(drafters, expected, dict(d.get("meta") or {}))

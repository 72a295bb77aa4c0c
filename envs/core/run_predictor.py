"""A run predictor: how many tokens each drafter's round will produce, from what is known before the round.

The drafter-choice rules need, per drafter ``d`` and cap ``K``, the expected tokens of a round:
``E[min(run_d, K)] + 1 = 1 + sum_{j=1..K} P(run_d >= j)``. This model estimates the survival ``P(run_d >= j)`` per
**bucket**: the context lookup's match length (0..4, or unknown), a log2 bucket of the completion position, and the
outcome of the previous round (which drafter, and whether it accepted none, some or all of its drafts: the recent
acceptance of each drafter, :func:`recent_code`): what a per-start trace and a live engine both know before a
round, from token ids and verified rounds alone. It is fitted by counting on a trace's runs (a workload's train
split): the lookup x position survival over every position, shrunk towards the drafter's pooled survival; the
recent-round survival over the round starts of a rollout (the rounds a policy actually plays, where the previous
round is defined), shrunk towards its lookup x position estimate, each with a prior weight of :data:`PRIOR`, so a
rare bucket falls back to the coarser estimate.

Draft confidence and the draft's hidden state are not inputs: SpecDecode-Bench's published traces carry neither.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.errors import SpecgymError
from specgym.io import atomic_write_text

#: Lookup buckets: match lengths 0..4, then "unknown" (an engine without token ids).
LOOKUP_BUCKETS = 6
#: Position buckets: ``min(floor(log2(i + 1)), POSITION_BUCKETS - 1)``.
POSITION_BUCKETS = 12
#: Drafters whose rounds have their own recent-round codes (an engine's first three: a draft model, prompt lookup, a
#: draft head); a later drafter's rounds count as plain steps there.
RECENT_DRAFTERS = 3
#: Recent-round codes: 0 = the request's first round or a plain step; then, for each of the first
#: :data:`RECENT_DRAFTERS` drafters (index ``i``), ``1 + 3 i + c`` with ``c`` = 0 (the round accepted nothing),
#: 1 (some but not all), 2 (all drafts).
RECENT_BUCKETS = 1 + 3 * RECENT_DRAFTERS
#: Prior weight (positions) of the coarser estimate in each bucket's estimate (a hierarchy: pooled -> lookup x
#: position -> lookup x position x recent round).
PRIOR = 20.0
#: Longest run the survival tables hold (caps beyond it read the last column).
MAX_RUN = 16
#: Lookup x position buckets.
N_CONTEXT = LOOKUP_BUCKETS * POSITION_BUCKETS


def recent_code(drafter_index: int, drafted: int, accepted: int) -> int:
    """The recent-round code of a verified round (``drafter_index`` -1 or ``drafted == 0``: a plain step)."""
    if drafter_index < 0 or drafted == 0 or drafter_index >= RECENT_DRAFTERS:
        return 0
    return 1 + 3 * drafter_index + (0 if accepted == 0 else 2 if accepted >= drafted else 1)


def bucket(lookup_len: int, position: int, recent: int = 0) -> int:
    """The bucket of a round at ``position`` with lookup match ``lookup_len`` (-1: unknown) after a round of code
    ``recent``."""
    lk = LOOKUP_BUCKETS - 1 if lookup_len < 0 else min(int(lookup_len), LOOKUP_BUCKETS - 2)
    pos = min(int(math.log2(position + 1)), POSITION_BUCKETS - 1)
    return (lk * POSITION_BUCKETS + pos) * RECENT_BUCKETS + int(recent)


def context_buckets(lookup_len: np.ndarray | None, position: np.ndarray) -> np.ndarray:
    """The lookup x position bucket (``0..N_CONTEXT-1``) of every position (``lookup_len`` None: unknown)."""
    pos = np.minimum(np.floor(np.log2(np.asarray(position, np.float64) + 1)).astype(np.int64), POSITION_BUCKETS - 1)
    if lookup_len is None:
        lk = np.full(len(pos), LOOKUP_BUCKETS - 1, np.int64)
    else:
        lk = np.asarray(lookup_len, np.int64)
        lk = np.where(lk < 0, LOOKUP_BUCKETS - 1, np.minimum(lk, LOOKUP_BUCKETS - 2))
    return lk * POSITION_BUCKETS + pos


def _at_least(b: np.ndarray, run: np.ndarray, n_b: int) -> tuple[np.ndarray, np.ndarray]:
    """``(count[b], at_least[b, j-1])``: positions per bucket and how many of them have ``run >= j``, j = 1..MAX_RUN."""
    hist = np.zeros((n_b, MAX_RUN + 1))
    np.add.at(hist, (b, np.minimum(np.asarray(run, np.int64), MAX_RUN)), 1.0)
    return hist.sum(axis=1), hist[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]


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
            meta: dict[str, Any] | None = None,
            rounds: tuple[dict[str, np.ndarray], np.ndarray | None, np.ndarray, np.ndarray] | None = None,
            ) -> RunPredictor:
        """Count survivals per bucket.

        Args:
            runs: ``{drafter: flat runs}`` at every position (the lookup x position estimate).
            lookup_len: Flat context lookup per position (None: unknown everywhere).
            position: Flat completion position of each value.
            meta: Provenance to keep.
            rounds: Optional ``(runs, lookup_len, position, recent)`` at the round starts of a policy's rollout
                (every drafter's run there, and the code of the round before): the recent-round estimate. Without
                it every recent code reads the lookup x position estimate.
        """
        if not runs:
            raise SpecgymError("run predictor: no drafter to fit")
        b = context_buckets(lookup_len, position)
        expected = {}
        for name, run in runs.items():
            if len(run) != len(b):
                raise SpecgymError(f"run predictor: drafter {name!r} has {len(run)} runs for {len(b)} positions")
            total, at_least = _at_least(b, run, N_CONTEXT)
            pooled = at_least.sum(axis=0) / max(total.sum(), 1.0)
            ctx = (at_least + PRIOR * pooled[None, :]) / (total[:, None] + PRIOR)
            surv = np.repeat(ctx, RECENT_BUCKETS, axis=0)
            if rounds is not None:
                r_runs, r_lookup, r_pos, r_recent = rounds
                rb = context_buckets(r_lookup, r_pos) * RECENT_BUCKETS + np.asarray(r_recent, np.int64)
                n_r, al_r = _at_least(rb, r_runs[name], N_CONTEXT * RECENT_BUCKETS)
                surv = (al_r + PRIOR * surv) / (n_r[:, None] + PRIOR)
            expected[name] = np.concatenate([np.ones((len(surv), 1)), 1.0 + surv.cumsum(axis=1)], axis=1)
        return cls(tuple(runs), expected, dict(meta or {}, positions=int(len(b)),
                                                 rounds=0 if rounds is None else int(len(rounds[2]))))

    def expected_tokens(self, drafter: str, lookup_len: int, position: int, recent: int = 0) -> np.ndarray:
        """``(MAX_RUN + 1,)`` predicted tokens of a round with ``drafter`` at caps 0..MAX_RUN."""
        table = self.expected.get(drafter)
        if table is None:
            raise SpecgymError(f"run predictor predicts drafters {', '.join(self.drafters)}, not {drafter!r}")
        return table[bucket(lookup_len, position, recent)]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"format": "specgym-run-predictor", "version": 1, "drafters": list(self.drafters),
                "lookup_buckets": LOOKUP_BUCKETS, "position_buckets": POSITION_BUCKETS,
                "recent_buckets": RECENT_BUCKETS, "max_run": MAX_RUN,
                "expected": {d: self.expected[d].round(6).tolist() for d in self.drafters}, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: Any, where: str = "<run predictor>") -> RunPredictor:
        """Read :meth:`to_dict`'s form; a defect is one line naming ``where`` and the field."""
        if not isinstance(d, dict) or d.get("format") != "specgym-run-predictor":
            raise SpecgymError(f"{where}: not a specgym run predictor (field 'format')")
        shape = (N_CONTEXT * RECENT_BUCKETS, MAX_RUN + 1)
        if (d.get("lookup_buckets"), d.get("position_buckets"), d.get("recent_buckets"), d.get("max_run")) != (
                LOOKUP_BUCKETS, POSITION_BUCKETS, RECENT_BUCKETS, MAX_RUN):
            raise SpecgymError(f"{where}: buckets differ from this specgym's (fields lookup_buckets, "
                               f"position_buckets, recent_buckets, max_run)")
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


def save_run_predictor(pred: RunPredictor, path: str | Path, overwrite: bool = False) -> Path:
    """Write a run predictor as JSON (atomically; an existing file only with ``overwrite``)."""
    return atomic_write_text(Path(path), json.dumps(pred.to_dict()) + "\n", overwrite=overwrite)


def load_run_predictor(path: str | Path) -> RunPredictor:
    """Read a run predictor JSON file; a defect is one line naming the file and the field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecgymError(f"{path}: no such run predictor file") from None
    except (OSError, ValueError) as exc:
        raise SpecgymError(f"{path}: not a readable JSON run predictor ({exc})") from None
    return RunPredictor.from_dict(data, str(path))

"""Pre-verification signals of draft tokens: what a deployed controller can know before the target is called.

One record, :class:`DraftSignals`, carries them to controllers, in :class:`~specgym.envs.core.rounds.DraftStep`
(the round's draft tokens so far, this one last) and :class:`~specgym.envs.core.rounds.RoundOutcome` (every drafted
token of the round). The replay engine builds it from the trace columns of format v2
(:mod:`specgym.envs.workloads.trace_format`); the live engine and ``generate_with_controller`` compute it online
for each drafted token, with the recorder's definitions, so a controller sees the same thing in replay and live:

* ``topk``: the draft's ``TOPK = 8`` largest probabilities, sorted descending, at the decoding temperature
  (greedy: ``softmax(logits)``; sampling: ``softmax(logits / T)``); rows padded with 0 if the vocabulary is smaller;
* ``lookup_len``: the context-lookup match length (:mod:`specgym.envs.core.lookup`), 0..4;
* ``lookup_agree``: ``lookup_len > 0`` and the token that followed the match equals this draft token;
* ``hidden_sketch``: the draft's last hidden state times a fixed seeded random projection (``(d, D)``), or ``None``
  when not recorded / not enabled.

A field is ``None`` when its source lacks it (a trace without that column), never zeros. The record is a view: it
holds the flat per-position arrays (:class:`SignalColumns`) and a row range, and slices on access, so emitting one
per round costs one small object.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

import numpy as np

from specgym.errors import SpecgymError

#: Draft probabilities kept per position.
TOPK = 8


@dataclass(frozen=True, slots=True)
class SignalColumns:
    """Per-position signal arrays (rows = positions or draft tokens); ``None`` = absent.

    Attributes:
        topk: ``(n, TOPK)`` float32 draft top-k probabilities, sorted descending.
        lookup_len: ``(n,)`` int8 lookup match length, 0..4.
        lookup_agree: ``(n,)`` bool: the lookup's continuation equals the draft's token.
        hidden_sketch: ``(n, D)`` float32 projected draft hidden state.
    """

    topk: np.ndarray | None = None
    lookup_len: np.ndarray | None = None
    lookup_agree: np.ndarray | None = None
    hidden_sketch: np.ndarray | None = None

    @property
    def empty(self) -> bool:
        """True when no signal is present."""
        return self.topk is None and self.lookup_len is None and self.lookup_agree is None \
            and self.hidden_sketch is None


class DraftSignals:
    """Signals of consecutive draft tokens: rows ``start:stop`` of a :class:`SignalColumns` (row 0 = the round's
    first draft token).

    Args:
        columns: The arrays the rows come from.
        start, stop: The row range.
    """

    __slots__ = ("columns", "start", "stop")

    def __init__(self, columns: SignalColumns, start: int, stop: int):
        self.columns = columns
        self.start = start
        self.stop = stop

    def __len__(self) -> int:
        return self.stop - self.start

    def _rows(self, arr: np.ndarray | None) -> np.ndarray | None:
        return None if arr is None else arr[self.start:self.stop]

    @property
    def topk(self) -> np.ndarray | None:
        """``(d, TOPK)`` draft top-k probabilities, or ``None``."""
        return self._rows(self.columns.topk)

    @property
    def lookup_len(self) -> np.ndarray | None:
        """``(d,)`` lookup match lengths, or ``None``."""
        return self._rows(self.columns.lookup_len)

    @property
    def lookup_agree(self) -> np.ndarray | None:
        """``(d,)`` lookup agreement with the draft token, or ``None``."""
        return self._rows(self.columns.lookup_agree)

    @property
    def hidden_sketch(self) -> np.ndarray | None:
        """``(d, D)`` projected draft hidden states, or ``None``."""
        return self._rows(self.columns.hidden_sketch)

    def __repr__(self) -> str:
        present = [f for f in ("topk", "lookup_len", "lookup_agree", "hidden_sketch")
                   if getattr(self.columns, f) is not None]
        return f"DraftSignals(rows={len(self)}, fields={present})"


# ------------------------------------------------------------------------------------------------ hidden sketch
def sketch_projection(hidden_size: int, dim: int, seed: int = 0) -> np.ndarray:
    """The fixed random projection of the hidden sketch: ``(hidden_size, dim)`` float32 Gaussian / sqrt(dim)
    (Johnson-Lindenstrauss: inner products are kept in expectation), a function of ``(hidden_size, dim, seed)``."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(hidden_size), int(dim), 0x5CE7])
    return (rng.standard_normal((int(hidden_size), int(dim))) / np.sqrt(dim)).astype(np.float32)


def projection_to_meta(projection: np.ndarray, seed: int) -> dict:
    """JSON metadata of a sketch projection: its shape, seed and exact float32 values (base64, little endian)."""
    p = np.ascontiguousarray(projection, dtype="<f4")
    return {"hidden_size": int(p.shape[0]), "dim": int(p.shape[1]), "seed": int(seed),
            "projection_f32_b64": base64.b64encode(p.tobytes()).decode("ascii")}


def sketch_identity(projection: np.ndarray, seed: int | None = None) -> dict:
    """What identifies a hidden sketch: its shape, seed (None where unknown) and the SHA-256 of its exact float32
    values (little endian). Two sketches with the same identity are the same function of the hidden state; the
    acceptance predictor stores the identity of the sketch it was trained on and checks it wherever it is fed one."""
    p = np.ascontiguousarray(projection, dtype="<f4")
    return {"hidden_size": int(p.shape[0]), "dim": int(p.shape[1]), "seed": None if seed is None else int(seed),
            "sha256": hashlib.sha256(p.tobytes()).hexdigest()[:16]}


def sketch_identity_from_meta(meta: dict, where: str) -> dict:
    """:func:`sketch_identity` of a projection stored by :func:`projection_to_meta`."""
    return sketch_identity(projection_from_meta(meta, where), meta.get("seed"))


def projection_from_meta(meta: dict, where: str) -> np.ndarray:
    """The projection stored by :func:`projection_to_meta`; a defect raises one line naming ``where``."""
    try:
        h, d = int(meta["hidden_size"]), int(meta["dim"])
        raw = base64.b64decode(meta["projection_f32_b64"], validate=True)
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise SpecgymError(f"{where}: metadata field 'signals.hidden_sketch' needs hidden_size, dim and "
                           "projection_f32_b64") from None
    if h < 1 or d < 1 or len(raw) != 4 * h * d:
        raise SpecgymError(f"{where}: metadata field 'signals.hidden_sketch.projection_f32_b64' holds "
                           f"{len(raw) // 4} values, expected hidden_size * dim = {h * d}")
    return np.frombuffer(raw, dtype="<f4").reshape(h, d).astype(np.float32)

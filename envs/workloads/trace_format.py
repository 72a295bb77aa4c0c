"""The workload trace format: one self-describing Parquet file per workload.

Layout: one row per request. Request columns are scalars (``request_id``, ``category``, ``temperature``,
``prompt_len``, ``prompt_text``, ``split``); per-position columns (``p_accept``, ``draft_conf``, ``draft_entropy``,
``target_entropy``) are ``list<float32>``, which Arrow stores flat with per-request offsets, so loading is a
zero-copy view of one contiguous float array plus an offsets array. Workload metadata (name, source, generator
parameters or model names, format version, cost profile, split seed) is JSON under the schema metadata key
``specgym``.

Every value at position ``i`` is computed with the correct prefix (prompt + the target's first ``i`` tokens):

* ``p_accept[i]``: probability that a draft token proposed for position ``i`` is accepted. Greedy traces
  (temperature 0): 1 if the draft's argmax equals the target's token, else 0. Sampled traces: the speculative
  sampling acceptance ``sum_x min(p(x), q(x))`` of target distribution ``p`` and draft distribution ``q``.
* ``draft_conf[i]``: the draft's probability of the token it proposes (greedy: its max probability; sampled: the
  probability of a token drawn from ``q``).
* ``draft_entropy[i]``: entropy of the draft distribution (nats); ``target_entropy[i]``: the target's, NaN if
  unknown (synthetic traces).

**Format v2** adds optional per-position signal columns, for the acceptance predictor (what a controller can know
before verification) and exact greedy tree replay (the rank of the target's token). Each is present in every
request or absent; an absent column loads as ``None``, never as zeros (v1 files and synthetic workloads have none).
With ``d_i`` the draft's logits at position ``i`` (correct prefix), ``q_i`` its distribution at the recording
temperature (greedy: ``softmax(d_i)``; sampled: ``softmax(d_i / T)``) and ``t_i`` the target's token:

* ``token_id`` (``list<int32>``): ``t_i``, the completion itself (lookups and tree tests recompute from it);
* ``draft_token`` (``list<int32>``): the token the draft proposes (greedy: ``argmax d_i``, so
  ``p_accept = [draft_token == token_id]``; sampled: the recorder's seeded draw from ``q_i``);
* ``target_rank`` (``list<int32>``): the TRUE rank of ``t_i`` in the draft's order, 0 = the draft's top-1:
  ``#{v: d_i[v] > d_i[t_i]} + #{v < t_i: d_i[v] == d_i[t_i]}`` (ties broken by token id, as ``argmax`` does; raw
  logits, so the rank does not depend on the temperature). Not capped: a tree of width ``w`` at that depth holds
  the target's token iff ``target_rank < w``. Greedy: ``p_accept = [target_rank == 0]``;
* ``draft_topk`` (``list<fixed_size_list<float32>[8]>``): the 8 largest probabilities of ``q_i``, descending (0-padded
  when the vocabulary is smaller);
* ``lookup_len`` (``list<int8>``), ``lookup_token`` (``list<int32>``), ``lookup_agree`` (``list<bool>``): the
  context lookup on ``prompt + t_0..t_{i-1}`` (:mod:`specgym.envs.core.lookup`): the longest ``n <= 4`` whose
  suffix occurred earlier (0 if none), the token that followed its latest earlier occurrence (-1 if none), and
  whether that token equals ``draft_token``;
* ``hidden_sketch`` (``list<fixed_size_list<float32>[D]>``, optional even in recorded v2 traces): the draft's last
  hidden state (after the final layer norm) times a fixed seeded random projection ``(hidden, D)``, stored exactly
  in the metadata (``signals.hidden_sketch``, :func:`~specgym.envs.core.signals.projection_to_meta`).

The metadata block ``signals`` describes them (``topk``, ``lookup_max_n``, ``vocab_size``, ``rank``,
``hidden_sketch``). The loader checks every present column (list type, per-request lengths equal to ``p_accept``'s,
value type, ranges, and the identities above) and names the file and the field in a one-line error.

**Sharded workloads.** A workload too large for memory (millions of requests) is stored as a *dataset folder*
(written by :mod:`specgym.envs.workloads.dataset`):

* ``workload.json``: the metadata record: ``{"format": "specgym-sharded-workload", "version": 1, "metadata": {...},
  "shards": [{"file": "shard-00000.parquet", "requests": R, "positions": P}, ...], "requests": R_total,
  "positions": P_total}``, where ``metadata`` is the workload's metadata block
  (:meth:`Workload.metadata`: name, source, profile, split seed, extra, signals, format version);
* the shards, in order: each an ordinary single-file workload (the format above) whose embedded metadata is exactly
  the record's ``metadata`` (so every shard is self-describing and loadable alone).

The workload is the concatenation of the shards in the listed order: request order, splits and columns are the
shards' own. Request ids are unique over the whole dataset.

Reading is lazy: :func:`open_dataset` checks only the record; :meth:`ShardedWorkload.iter_shards` loads and
validates one shard at a time (its columns, its request count against the record, its metadata against the
record's), so replay, evaluation and the oracles (:mod:`specgym.eval.streaming`) hold one shard in memory.
:func:`load_dataset` concatenates every shard into one in-memory :class:`Workload` (what ``load_workload`` returns
for a folder, for the tools that need the whole workload at once).

Replay draws ``u[i]`` uniformly per position and accepts iff ``u[i] < p_accept[i]``
(:mod:`specgym.envs.engines.trace_engine`); the engine hands the signal columns to controllers as
:class:`~specgym.envs.core.signals.DraftSignals`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from collections.abc import Iterator, Sequence

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.lookup import LOOKUP_MAX_N
from specgym.envs.core.signals import TOPK, SignalColumns, projection_from_meta
from specgym.errors import SpecgymError
from specgym.io import atomic_path
import specgym.catalogue as catalogue

FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
META_KEY = b"specgym"
SPLITS = ("train", "val", "test")
POSITION_COLUMNS = ("p_accept", "draft_conf", "draft_entropy", "target_entropy")
#: Optional per-position signal columns of format v2 (numpy dtype, trailing width: None = scalar per position,
#: "topk" = TOPK, "sketch" = the metadata's hidden_sketch.dim).
SIGNAL_COLUMNS: dict[str, tuple[Any, str | None]] = {
    "token_id": (np.int32, None),
    "draft_token": (np.int32, None),
    "target_rank": (np.int32, None),
    "draft_topk": (np.float32, "topk"),
    "lookup_len": (np.int8, None),
    "lookup_token": (np.int32, None),
    "lookup_agree": (np.bool_, None),
    "hidden_sketch": (np.float32, "sketch"),
}
REQUEST_COLUMNS = ("request_id", "category", "temperature", "prompt_len", "prompt_text", "split")
SOURCE_KINDS = ("recorded", "synthetic")
#: A sharded workload's metadata record (the folder's ``workload.json``).
RECORD = "workload.json"
RECORD_FORMAT = "specgym-sharded-workload"
RECORD_VERSION = 1


@dataclass
class Workload:
    """A set of requests with per-position acceptance and draft features.

    Attributes:
        name: Workload name (``speclane-mix``, ``tinypair-greedy``...).
        source: ``{"kind": "synthetic", "generator": ..., "params": {...}}`` or
            ``{"kind": "recorded", "draft_model": ..., "target_model": ..., ...}``.
        profile: The cost profile the workload was recorded with (or generated for).
        request_id: ``(R,)`` request identifiers (str).
        category: ``(R,)`` category labels (str).
        temperature: ``(R,)`` sampling temperature, 0 = greedy.
        prompt_len: ``(R,)`` prompt lengths in tokens.
        split: ``(R,)`` one of ``train``/``val``/``test``.
        offsets: ``(R+1,)`` int64; request r owns positions ``offsets[r]:offsets[r+1]``.
        p_accept: flat float32 acceptance probability (greedy: 0/1) per position.
        draft_conf: flat float32 draft probability of its proposed token.
        draft_entropy: flat float32 draft entropy (nats).
        target_entropy: flat float32 target entropy (nats), NaN where absent.
        prompt_text: optional per-request prompt text.
        split_seed: seed the split assignment was drawn from.
        extra: free-form metadata kept through a save/load round trip.
        token_id, draft_token, target_rank, draft_topk, lookup_len, lookup_token, lookup_agree, hidden_sketch:
            the optional v2 signal columns (module docstring), flat over positions (``draft_topk`` ``(n, 8)``,
            ``hidden_sketch`` ``(n, D)``); ``None`` where absent.
        signal_meta: the ``signals`` metadata block (empty without signal columns).
    """

    name: str
    source: dict[str, Any]
    profile: CostProfile
    request_id: np.ndarray
    category: np.ndarray
    temperature: np.ndarray
    prompt_len: np.ndarray
    split: np.ndarray
    offsets: np.ndarray
    p_accept: np.ndarray
    draft_conf: np.ndarray
    draft_entropy: np.ndarray
    target_entropy: np.ndarray
    prompt_text: list[str] | None = None
    split_seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    token_id: np.ndarray | None = None
    draft_token: np.ndarray | None = None
    target_rank: np.ndarray | None = None
    draft_topk: np.ndarray | None = None
    lookup_len: np.ndarray | None = None
    lookup_token: np.ndarray | None = None
    lookup_agree: np.ndarray | None = None
    hidden_sketch: np.ndarray | None = None
    signal_meta: dict[str, Any] = field(default_factory=dict)

    # ----------------------------------------------------------------------------------------------- views
    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return len(self.request_id)

    @property
    def n_positions(self) -> int:
        """Total completion tokens over all requests."""
        return int(self.offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        """``(R,)`` completion lengths N."""
        return np.diff(self.offsets)

    @property
    def is_synthetic(self) -> bool:
        """True for generated (not recorded) workloads; shown as such everywhere."""
        return self.source.get("kind") == "synthetic"

    @property
    def label(self) -> str:
        """Name with a ``(synthetic)`` tag where it applies, for tables and plots."""
        return f"{self.name} (synthetic)" if self.is_synthetic else self.name

    @property
    def signal_names(self) -> list[str]:
        """The v2 signal columns this workload carries (empty for v1 and synthetic traces)."""
        return [c for c in SIGNAL_COLUMNS if getattr(self, c) is not None]

    def signal_columns(self) -> SignalColumns | None:
        """The controller-visible signals (:class:`SignalColumns` over the flat positions), or ``None`` if none."""
        cols = SignalColumns(self.draft_topk, self.lookup_len, self.lookup_agree, self.hidden_sketch)
        return None if cols.empty else cols

    def sketch_projection(self) -> np.ndarray | None:
        """The hidden sketch's projection ``(hidden, D)`` from the metadata, or ``None`` without a sketch."""
        meta = self.signal_meta.get("hidden_sketch")
        return None if meta is None else projection_from_meta(meta, f"workload {self.name!r}")

    def span(self, r: int) -> slice:
        """Slice of the flat position arrays owned by request ``r``."""
        return slice(int(self.offsets[r]), int(self.offsets[r + 1]))

    def categories(self) -> list[str]:
        """Distinct categories in first-seen order."""
        return list(dict.fromkeys(self.category.tolist()))

    def split_indices(self, split: str | None) -> np.ndarray:
        """Indices of the requests in ``split`` (``None`` or ``all`` = every request)."""
        if split in (None, "all"):
            return np.arange(self.n_requests)
        if split not in SPLITS:
            raise SpecgymError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)} or all")
        idx = np.flatnonzero(self.split == split)
        if len(idx) == 0:
            raise SpecgymError(f"workload {self.name!r} has no requests in split {split!r}")
        return idx

    def subset(self, indices: Sequence[int] | np.ndarray) -> Workload:
        """A new workload holding only ``indices`` (in that order)."""
        idx = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths[idx]
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        gather = _gather_index(self.offsets, idx, offsets)
        return replace(
            self,
            request_id=self.request_id[idx],
            category=self.category[idx],
            temperature=self.temperature[idx],
            prompt_len=self.prompt_len[idx],
            split=self.split[idx],
            offsets=offsets,
            p_accept=self.p_accept[gather],
            draft_conf=self.draft_conf[gather],
            draft_entropy=self.draft_entropy[gather],
            target_entropy=self.target_entropy[gather],
            prompt_text=None if self.prompt_text is None else [self.prompt_text[i] for i in idx],
            **{c: getattr(self, c)[gather] for c in self.signal_names},
        )

    def metadata(self) -> dict[str, Any]:
        """The JSON metadata block stored in the Parquet schema."""
        return {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "source": self.source,
            "profile": self.profile.to_dict(),
            "split_seed": int(self.split_seed),
            "extra": self.extra,
            **({"signals": self.signal_meta} if self.signal_meta else {}),
        }


def _gather_index(old_offsets: np.ndarray, idx: np.ndarray, new_offsets: np.ndarray) -> np.ndarray:
    """Flat positions of the selected requests, concatenated (vectorised)."""
    lengths = np.diff(new_offsets)
    starts = np.repeat(old_offsets[idx] - new_offsets[:-1], lengths)
    return np.arange(int(new_offsets[-1]), dtype=np.int64) + starts


def assign_splits(n_requests: int, seed: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                  exact: bool = False) -> np.ndarray:
    """Deterministic train/val/test assignment by request (a seeded permutation cut by ``fractions``).

    ``exact``: the counts are the fractions' largest-remainder rounding, nothing else (a fraction of 0 is an empty
    split: what a user's ``--splits`` asks for); otherwise (the default fractions) val and test get at least one
    request each from 3 requests on."""
    rng = np.random.default_rng([seed, 0x5B117])
    perm = rng.permutation(n_requests)
    if exact:
        _, n_val, n_test = split_counts(n_requests, fractions)
    else:
        n_val = int(round(n_requests * fractions[1]))
        n_test = int(round(n_requests * fractions[2]))
    if n_requests >= 3 and not exact:
        n_val, n_test = max(n_val, 1), max(n_test, 1)
    out = np.full(n_requests, "train", dtype=object)
    out[perm[:n_val]] = "val"
    out[perm[n_val : n_val + n_test]] = "test"
    return out


def split_counts(n_requests: int, fractions: tuple[float, float, float]) -> tuple[int, int, int]:
    """``(train, val, test)`` request counts of ``fractions`` (summing to 1): largest-remainder rounding, so they
    sum to ``n_requests`` and a fraction of 0 gets 0."""
    raw = [n_requests * float(f) for f in fractions]
    counts = [int(np.floor(v)) for v in raw]
    order = sorted(range(3), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n_requests - sum(counts)]:
        counts[i] += 1
    return counts[0], counts[1], counts[2]


def workload_from_requests(
    name: str,
    source: dict[str, Any],
    profile: CostProfile,
    requests: Sequence[dict[str, Any]],
    split_seed: int = 0,
    split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    extra: dict[str, Any] | None = None,
    signal_meta: dict[str, Any] | None = None,
) -> Workload:
    """Assemble a workload from per-request dicts.

    Each dict holds ``request_id``, ``category``, ``temperature``, ``prompt_len``, optional ``prompt_text``, the
    per-position arrays ``p_accept``, ``draft_conf``, ``draft_entropy``, optional ``target_entropy`` and the
    optional signal columns (:data:`SIGNAL_COLUMNS`; each in every request or in none). Splits are assigned from
    ``split_seed`` unless every request carries a ``split``.

    Args:
        signal_meta: The ``signals`` metadata block (recorded traces with signal columns).
    """
    if not requests:
        raise SpecgymError(f"workload {name!r}: no requests")
    lengths = np.array([len(r["p_accept"]) for r in requests], dtype=np.int64)
    offsets = np.zeros(len(requests) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])

    def flat(col: str) -> np.ndarray:
        parts = []
        for r, n in zip(requests, lengths):
            v = r.get(col)
            parts.append(np.full(n, np.nan, np.float32) if v is None else np.asarray(v, dtype=np.float32))
        return np.concatenate(parts).astype(np.float32, copy=False)

    signals: dict[str, np.ndarray] = {}
    for col, (dtype, _) in SIGNAL_COLUMNS.items():
        have = [r.get(col) is not None for r in requests]
        if not any(have):
            continue
        if not all(have):
            raise SpecgymError(f"workload {name!r}: field {col!r} present in some requests only (all or none)")
        parts = [np.asarray(r[col]) for r in requests]
        bad = next((k for k, (v, n) in enumerate(zip(parts, lengths)) if len(v) != n), None)
        if bad is not None:
            raise SpecgymError(f"workload {name!r}: field {col!r} has {len(parts[bad])} values, expected "
                               f"{lengths[bad]} (request {requests[bad]['request_id']!r})")
        signals[col] = np.concatenate(parts).astype(dtype, copy=False)

    if all("split" in r for r in requests):
        split = np.array([r["split"] for r in requests], dtype=object)
    else:
        split = assign_splits(len(requests), split_seed, split_fractions)
    texts = [r.get("prompt_text") for r in requests]
    wl = Workload(
        name=name,
        source=source,
        profile=profile,
        request_id=np.array([str(r["request_id"]) for r in requests], dtype=object),
        category=np.array([str(r["category"]) for r in requests], dtype=object),
        temperature=np.array([r["temperature"] for r in requests], dtype=np.float32),
        prompt_len=np.array([r["prompt_len"] for r in requests], dtype=np.int32),
        split=split,
        offsets=offsets,
        p_accept=flat("p_accept"),
        draft_conf=flat("draft_conf"),
        draft_entropy=flat("draft_entropy"),
        target_entropy=flat("target_entropy"),
        prompt_text=None if all(t is None for t in texts) else [t or "" for t in texts],
        split_seed=split_seed,
        extra=dict(extra or {}),
        signal_meta=dict(signal_meta or {}),
        **signals,
    )
    validate_workload(wl, where=f"workload {name!r}")
    return wl


# --------------------------------------------------------------------------------------------------- validation
def validate_workload(wl: Workload, where: str) -> None:
    """Check every invariant of the format; raise :class:`SpecgymError` naming ``where`` and the field."""
    r = wl.n_requests
    if r == 0:
        raise SpecgymError(f"{where}: workload is empty (no requests)")
    if wl.source.get("kind") not in SOURCE_KINDS:
        raise SpecgymError(f"{where}: metadata field 'source.kind' must be one of {SOURCE_KINDS}")
    off = wl.offsets
    if off.ndim != 1 or len(off) != r + 1 or off[0] != 0 or np.any(np.diff(off) < 1):
        raise SpecgymError(f"{where}: field 'offsets' inconsistent (every request needs >= 1 position)")
    n = int(off[-1])
    for col in POSITION_COLUMNS:
        arr = getattr(wl, col)
        if arr.dtype != np.float32 or arr.shape != (n,):
            raise SpecgymError(f"{where}: field {col!r} has {arr.shape[0]} values, expected {n} float32")
    for col in ("p_accept", "draft_conf", "draft_entropy"):
        arr = getattr(wl, col)
        if np.isnan(arr).any():
            bad = _first_request(off, np.flatnonzero(np.isnan(arr))[0])
            raise SpecgymError(f"{where}: field {col!r} contains NaN (request {wl.request_id[bad]!r})")
    for col, lo, hi in (("p_accept", 0.0, 1.0), ("draft_conf", 0.0, 1.0)):
        arr = getattr(wl, col)
        bad_mask = (arr < lo) | (arr > hi)
        if bad_mask.any():
            k = int(np.flatnonzero(bad_mask)[0])
            raise SpecgymError(
                f"{where}: field {col!r} value {float(arr[k])!r} out of range [{lo}, {hi}] "
                f"(request {wl.request_id[_first_request(off, k)]!r})"
            )
    for col in ("draft_entropy", "target_entropy"):
        arr = getattr(wl, col)
        if (arr < 0).any() or np.isinf(arr).any():
            raise SpecgymError(f"{where}: field {col!r} must be finite and >= 0")
    for col, arr in (("temperature", wl.temperature), ("prompt_len", wl.prompt_len)):
        if len(arr) != r:
            raise SpecgymError(f"{where}: field {col!r} has {len(arr)} values, expected {r}")
    if not np.all(np.isfinite(wl.temperature)) or (wl.temperature < 0).any():
        raise SpecgymError(f"{where}: field 'temperature' must be finite and >= 0")
    if (wl.prompt_len < 0).any():
        raise SpecgymError(f"{where}: field 'prompt_len' must be >= 0")
    bad_split = set(wl.split.tolist()) - set(SPLITS)
    if bad_split:
        raise SpecgymError(f"{where}: field 'split' has unknown value(s) {sorted(bad_split)}; allowed {SPLITS}")
    if len(set(wl.request_id.tolist())) != r:
        raise SpecgymError(f"{where}: field 'request_id' has duplicates")
    _validate_signals(wl, where)


def _validate_signals(wl: Workload, where: str) -> None:
    """Checks of the v2 signal columns: shape and dtype, ranges, and the identities between them."""
    n, off = wl.n_positions, wl.offsets
    sketch_meta = wl.signal_meta.get("hidden_sketch")
    if (sketch_meta is None) != (wl.hidden_sketch is None):
        raise SpecgymError(f"{where}: field 'hidden_sketch' and metadata field 'signals.hidden_sketch' must come "
                           "together")
    sketch_dim = None if sketch_meta is None else projection_from_meta(sketch_meta, where).shape[1]
    widths = {"topk": TOPK, "sketch": sketch_dim}
    for col, (dtype, width) in SIGNAL_COLUMNS.items():
        arr = getattr(wl, col)
        if arr is None:
            continue
        shape = (n,) if width is None else (n, widths[width])
        if arr.dtype != dtype or arr.shape != shape:
            raise SpecgymError(f"{where}: field {col!r} has shape {arr.shape} {arr.dtype}, expected {shape} "
                               f"{np.dtype(dtype).name}")

    def fail(col: str, mask: np.ndarray, what: str) -> None:
        rows = mask.reshape(len(mask), -1).any(axis=1)
        if rows.any():
            k = int(np.flatnonzero(rows)[0])
            raise SpecgymError(f"{where}: field {col!r} {what} (request {wl.request_id[_first_request(off, k)]!r}, "
                               f"position {k - int(off[_first_request(off, k)])})")

    vocab = wl.signal_meta.get("vocab_size")
    for col in ("token_id", "draft_token", "target_rank"):
        arr = getattr(wl, col)
        if arr is not None:
            fail(col, arr < 0, "has a negative value")
            if isinstance(vocab, int):
                fail(col, arr >= vocab, f"has a value >= the vocabulary size {vocab}")
    if wl.draft_topk is not None:
        t = wl.draft_topk
        fail("draft_topk", ~np.isfinite(t) | (t < 0) | (t > 1), "has a value outside [0, 1]")
        fail("draft_topk", np.diff(t, axis=1) > 0, "is not sorted in descending order")
        fail("draft_topk", t.sum(axis=1) > 1.0 + 1e-3, "sums to more than 1")
    max_n = int(wl.signal_meta.get("lookup_max_n", LOOKUP_MAX_N))
    if wl.lookup_len is not None:
        fail("lookup_len", (wl.lookup_len < 0) | (wl.lookup_len > max_n), f"has a value outside [0, {max_n}]")
        none = wl.lookup_len == 0
        if wl.lookup_token is not None:
            fail("lookup_token", (wl.lookup_token == -1) != none, "must be -1 exactly where lookup_len is 0")
        if wl.lookup_agree is not None:
            fail("lookup_agree", wl.lookup_agree & none, "is true where lookup_len is 0")
            if wl.lookup_token is not None and wl.draft_token is not None:
                fail("lookup_agree", wl.lookup_agree != (~none & (wl.lookup_token == wl.draft_token)),
                     "disagrees with lookup_token == draft_token")
    if wl.hidden_sketch is not None:
        fail("hidden_sketch", ~np.isfinite(wl.hidden_sketch), "has a non-finite value")
    greedy = np.repeat(wl.temperature == 0, np.diff(off))
    if greedy.any():
        if wl.draft_token is not None and wl.token_id is not None:
            fail("draft_token", greedy & ((wl.draft_token == wl.token_id) != (wl.p_accept == 1)),
                 "disagrees with p_accept (greedy: accepted iff draft_token == token_id)")
        if wl.target_rank is not None:
            fail("target_rank", greedy & ((wl.target_rank == 0) != (wl.p_accept == 1)),
                 "disagrees with p_accept (greedy: accepted iff target_rank == 0)")


def _first_request(offsets: np.ndarray, flat_index: int) -> int:
    return int(np.searchsorted(offsets, flat_index, side="right") - 1)


# ------------------------------------------------------------------------------------------------- read/write
def _arrow():
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


def workload_to_table(wl: Workload):
    """Arrow table of a workload (one row per request, list columns for positions)."""
    pa, _ = _arrow()
    offsets = pa.array(wl.offsets.astype(np.int32) if wl.n_positions < 2**31 else wl.offsets)
    list_type = pa.list_ if offsets.type == pa.int32() else pa.large_list
    cols = {
        "request_id": pa.array(wl.request_id.tolist(), pa.string()),
        "category": pa.array(wl.category.tolist(), pa.string()),
        "temperature": pa.array(wl.temperature, pa.float32()),
        "prompt_len": pa.array(wl.prompt_len, pa.int32()),
        "prompt_text": (pa.array(wl.prompt_text, pa.string()) if wl.prompt_text is not None
                        else pa.nulls(wl.n_requests, pa.string())),
        "split": pa.array(wl.split.tolist(), pa.string()),
    }
    list_cls = pa.ListArray if list_type is pa.list_ else pa.LargeListArray
    for col in POSITION_COLUMNS:
        cols[col] = list_cls.from_arrays(offsets, pa.array(getattr(wl, col), pa.float32()))
    for col in wl.signal_names:
        arr = getattr(wl, col)
        values = pa.array(arr.reshape(-1))
        if arr.ndim == 2:
            values = pa.FixedSizeListArray.from_arrays(values, arr.shape[1])
        cols[col] = list_cls.from_arrays(offsets, values)
    table = pa.table(cols)
    return table.replace_schema_metadata({META_KEY: json.dumps(wl.metadata()).encode()})


def save_workload(wl: Workload, path: str | Path, overwrite: bool = False) -> Path:
    """Validate and write ``wl`` to ``path`` atomically (zstd-compressed Parquet)."""
    _, pq = _arrow()
    path = Path(path)
    validate_workload(wl, where=f"workload {wl.name!r}")
    table = workload_to_table(wl)
    with atomic_path(path, overwrite=overwrite) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


_CACHE: dict[tuple[str, float], Workload] = {}


def cached_workload(name_or_path: str | Path) -> Workload:
    """:func:`load_workload` once per process (keyed by resolved path and modification time)."""
    path = catalogue.resolve("workload", name_or_path).resolve()
    key = (str(path), path.stat().st_mtime)
    wl = _CACHE.get(key)
    if wl is None:
        wl = _CACHE[key] = load_workload(path)
    return wl


def load_workload(name_or_path: str | Path) -> Workload:
    """Load and validate a workload; any defect raises a one-line :class:`SpecgymError` naming file and field.

    A folder is a sharded workload: every shard is read, validated and concatenated (to stream it shard by shard
    instead, :func:`open_dataset`)."""
    pa, pq = _arrow()
    path = catalogue.resolve("workload", name_or_path)
    if path.is_dir():
        return load_dataset(path)
    where = str(path)
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for corrupt/truncated files
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        raise SpecgymError(f"{where}: not a readable Parquet file ({why})") from None
    raw_meta = (table.schema.metadata or {}).get(META_KEY)
    if raw_meta is None:
        raise SpecgymError(f"{where}: missing specgym metadata (not a specgym workload)")
    try:
        meta = json.loads(raw_meta)
    except json.JSONDecodeError:
        raise SpecgymError(f"{where}: specgym metadata is not valid JSON") from None
    version = meta.get("format_version")
    if version not in SUPPORTED_VERSIONS:
        raise SpecgymError(f"{where}: unsupported format_version {version!r} (this specgym reads {SUPPORTED_VERSIONS})")
    for key in ("name", "source", "profile"):
        if key not in meta:
            raise SpecgymError(f"{where}: metadata field {key!r} missing")
    names = set(table.column_names)
    for col in REQUEST_COLUMNS + POSITION_COLUMNS:
        if col not in names:
            raise SpecgymError(f"{where}: missing column {col!r}")
    profile = CostProfile.from_dict(meta["profile"], where=f"{where}: metadata 'profile'")

    def scalar(col: str, dtype) -> np.ndarray:
        arr = table.column(col)
        if arr.null_count:
            raise SpecgymError(f"{where}: column {col!r} has null values")
        try:
            return arr.to_numpy().astype(dtype, copy=False)
        except (TypeError, ValueError, pa.ArrowInvalid) as exc:
            raise SpecgymError(f"{where}: column {col!r} has the wrong type ({exc})") from None

    offsets_ref = None
    flats: dict[str, np.ndarray] = {}
    for col in POSITION_COLUMNS:
        offs, values = _list_column(pa, table, col, where)
        if not pa.types.is_floating(values.type):
            raise SpecgymError(f"{where}: column {col!r} must hold floats, got {values.type}")
        flat = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        if offsets_ref is None:
            offsets_ref = offs
        elif not np.array_equal(offs, offsets_ref):
            raise SpecgymError(f"{where}: column {col!r} offsets differ from 'p_accept' (inconsistent lengths)")
        flats[col] = flat
    if offsets_ref is None:  # pragma: no cover - POSITION_COLUMNS is never empty
        raise SpecgymError(f"{where}: no position columns")
    signal_meta = meta.get("signals", {}) if version >= 2 else {}
    if not isinstance(signal_meta, dict):
        raise SpecgymError(f"{where}: metadata field 'signals' must be an object")
    sketch_dim = (signal_meta.get("hidden_sketch") or {}).get("dim")
    for col in SIGNAL_COLUMNS if version >= 2 else ():
        if col in names:
            offs, values = _list_column(pa, table, col, where)
            if not np.array_equal(offs, offsets_ref):
                raise SpecgymError(f"{where}: column {col!r} lengths differ from 'p_accept' (inconsistent lengths)")
            flats[col] = _signal_values(pa, values, col, TOPK if col == "draft_topk" else sketch_dim, where)
    prompt_col = table.column("prompt_text")
    prompt_text = None if prompt_col.null_count == len(prompt_col) else [t or "" for t in prompt_col.to_pylist()]
    wl = Workload(
        name=str(meta["name"]),
        source=dict(meta["source"]),
        profile=profile,
        request_id=scalar("request_id", object),
        category=scalar("category", object),
        temperature=scalar("temperature", np.float32),
        prompt_len=scalar("prompt_len", np.int32),
        split=scalar("split", object),
        offsets=offsets_ref,
        prompt_text=prompt_text,
        split_seed=int(meta.get("split_seed", 0)),
        extra=dict(meta.get("extra", {})),
        signal_meta=dict(signal_meta),
        **flats,
    )
    validate_workload(wl, where=where)
    return wl


def _list_column(pa: Any, table: Any, col: str, where: str) -> tuple[np.ndarray, Any]:
    """Rebased int64 offsets and the (sliced) values array of one list column."""
    chunked = table.column(col)
    if not (pa.types.is_list(chunked.type) or pa.types.is_large_list(chunked.type)):
        raise SpecgymError(f"{where}: column {col!r} must be a list column, got {chunked.type}")
    arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    if arr.null_count:
        raise SpecgymError(f"{where}: column {col!r} has null lists")
    offs = arr.offsets.to_numpy().astype(np.int64)
    base = offs[0]
    return offs - base, arr.values.slice(base, offs[-1] - base)


def _signal_values(pa: Any, values: Any, col: str, width: int | None, where: str) -> np.ndarray:
    """The numpy array of a signal column's values; the Arrow type must be exactly the format's."""
    dtype, kind = SIGNAL_COLUMNS[col]
    want = {np.int32: pa.int32(), np.int8: pa.int8(), np.bool_: pa.bool_(), np.float32: pa.float32()}[dtype]
    if kind is not None:
        if width is None:
            raise SpecgymError(f"{where}: column {col!r} needs metadata field 'signals.hidden_sketch'")
        if not pa.types.is_fixed_size_list(values.type) or values.type.list_size != width \
                or values.type.value_type != want:
            raise SpecgymError(f"{where}: column {col!r} must be a list of fixed_size_list<{want}>[{width}], "
                               f"got list<{values.type}>")
        values = values.flatten()
    elif values.type != want:
        raise SpecgymError(f"{where}: column {col!r} must be a list of {want}, got list<{values.type}>")
    if values.null_count:
        raise SpecgymError(f"{where}: column {col!r} has null values")
    out = values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return out if kind is None else out.reshape(-1, width)


# ---------------------------------------------------------------------------------- sharded workloads: the reader
@dataclass
class ShardInfo:
    """One shard as the metadata record lists it."""

    file: str
    requests: int
    positions: int


@dataclass
class ShardedWorkload:
    """A sharded workload opened lazily (the record only; shards are read on demand).

    Attributes:
        path: The dataset folder.
        metadata: The workload's metadata block (every shard carries it verbatim).
        shards: The shards in order.
    """

    path: Path
    metadata: dict[str, Any]
    shards: list[ShardInfo]

    @property
    def name(self) -> str:
        """Workload name."""
        return str(self.metadata.get("name"))

    @property
    def n_requests(self) -> int:
        """Requests over all shards."""
        return sum(s.requests for s in self.shards)

    @property
    def n_positions(self) -> int:
        """Positions (completion tokens) over all shards."""
        return sum(s.positions for s in self.shards)

    @property
    def is_synthetic(self) -> bool:
        """True for generated workloads (shown as such everywhere)."""
        return (self.metadata.get("source") or {}).get("kind") == "synthetic"

    @property
    def label(self) -> str:
        """Name with a ``(synthetic)`` tag where it applies."""
        return f"{self.name} (synthetic)" if self.is_synthetic else self.name

    def shard(self, index: int) -> Workload:
        """Load and validate shard ``index`` against the record (one-line errors name the shard file)."""
        info = self.shards[index]
        path = self.path / info.file
        if not path.is_file():
            raise SpecgymError(f"{path}: shard listed in {self.path / RECORD} is missing")
        wl = load_workload(path)
        if wl.metadata() != self.metadata:
            key = metadata_difference(wl.metadata(), self.metadata)
            raise SpecgymError(f"{path}: metadata field {key!r} differs from {self.path / RECORD} "
                               f"(mismatched metadata)")
        if (wl.n_requests, wl.n_positions) != (info.requests, info.positions):
            raise SpecgymError(f"{path}: holds {wl.n_requests} requests / {wl.n_positions} positions, "
                               f"{self.path / RECORD} lists {info.requests} / {info.positions}")
        return wl

    def iter_shards(self, check_ids: bool = True) -> Iterator[Workload]:
        """The shards one at a time, each validated as it is read; ``check_ids`` also refuses a request id that an
        earlier shard used (the ids seen so far are kept: strings only, never the columns)."""
        seen: set[str] = set()
        for i, info in enumerate(self.shards):
            wl = self.shard(i)
            if check_ids:
                ids = wl.request_id.tolist()
                dup = next((r for r in ids if r in seen), None)
                if dup is not None:
                    raise SpecgymError(f"{self.path / info.file}: request id {dup!r} already in an earlier shard")
                seen.update(ids)
            yield wl


def metadata_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The first field (in sorted order) where two workload metadata blocks differ (``?`` if none)."""
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return key
    return "?"


def open_dataset(path: str | Path) -> ShardedWorkload:
    """Read a dataset folder's metadata record (no shard is read); defects are one-line errors naming the field."""
    path = Path(path)
    rec_path = path / RECORD
    if not rec_path.is_file():
        raise SpecgymError(f"{path}: a folder workload needs its metadata record {RECORD} (not a sharded workload)")
    try:
        rec = json.loads(rec_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecgymError(f"{rec_path}: not valid JSON ({exc})") from None
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        raise SpecgymError(f"{rec_path}: field 'format' must be {RECORD_FORMAT!r}")
    if rec.get("version") != RECORD_VERSION:
        raise SpecgymError(f"{rec_path}: unsupported field 'version' {rec.get('version')!r} (reads {RECORD_VERSION})")
    meta = rec.get("metadata")
    if not isinstance(meta, dict) or not all(k in meta for k in ("name", "source", "profile")):
        raise SpecgymError(f"{rec_path}: field 'metadata' must be a workload metadata block (name, source, profile)")
    raw = rec.get("shards")
    if not isinstance(raw, list) or not raw:
        raise SpecgymError(f"{rec_path}: field 'shards' must be a non-empty list")
    shards = []
    for k, s in enumerate(raw):
        ok = (isinstance(s, dict) and isinstance(s.get("file"), str) and "/" not in s["file"]
              and s["file"] not in ("", ".", "..") and all(isinstance(s.get(f), int) and not isinstance(s.get(f), bool)
                                                           and s[f] >= 1 for f in ("requests", "positions")))
        if not ok:
            raise SpecgymError(f"{rec_path}: field 'shards[{k}]' must be {{file, requests >= 1, positions >= 1}}")
        shards.append(ShardInfo(s["file"], s["requests"], s["positions"]))
    if len({s.file for s in shards}) != len(shards):
        raise SpecgymError(f"{rec_path}: field 'shards' lists a file twice")
    ds = ShardedWorkload(path, meta, shards)
    for name, value in (("requests", ds.n_requests), ("positions", ds.n_positions)):
        if rec.get(name) != value:
            raise SpecgymError(f"{rec_path}: field {name!r} is {rec.get(name)!r}, the shards sum to {value}")
    return ds


def concat_workloads(parts: list[Workload], where: str = "workload") -> Workload:
    """One in-memory workload from shards that share their metadata (in order; splits kept as stored)."""
    if not parts:
        raise SpecgymError(f"{where}: no shards")
    first = parts[0]
    for wl in parts[1:]:
        if wl.metadata() != first.metadata():
            raise SpecgymError(f"{where}: metadata field {metadata_difference(wl.metadata(), first.metadata())!r} "
                               f"differs between shards (mismatched metadata)")
    lengths = np.concatenate([wl.lengths for wl in parts])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    texts = [wl.prompt_text for wl in parts]

    def cat(col: str) -> np.ndarray:
        return np.concatenate([getattr(wl, col) for wl in parts])

    signals: dict[str, Any] = {c: cat(c) for c in first.signal_names}
    if any(wl.signal_names != first.signal_names for wl in parts):
        raise SpecgymError(f"{where}: the shards carry different signal columns (mismatched shards)")
    out = replace(
        first,
        request_id=cat("request_id"), category=cat("category"), temperature=cat("temperature"),
        prompt_len=cat("prompt_len"), split=cat("split"), offsets=offsets,
        p_accept=cat("p_accept"), draft_conf=cat("draft_conf"), draft_entropy=cat("draft_entropy"),
        target_entropy=cat("target_entropy"),
        prompt_text=None if all(t is None for t in texts) else
        [s for wl, t in zip(parts, texts) for s in (t if t is not None else [""] * wl.n_requests)],
        **signals,
    )
    validate_workload(out, where=where)
    return out


def load_dataset(path: str | Path) -> Workload:
    """Every shard of a dataset folder concatenated into one in-memory workload (validated)."""
    ds = open_dataset(path)
    return concat_workloads(list(ds.iter_shards(check_ids=False)), where=str(path))

"""The in-memory workload: one record of a trace's requests and their flat per-position columns.

The format itself (columns, semantics, versions) is documented in :mod:`specgym.envs.workloads.trace_format`, the
public face of the workload modules; this module holds the record (:class:`Workload`) and the split assignment.
Assembly from per-request dicts is :mod:`specgym.envs.workloads.build`, validation
:mod:`specgym.envs.workloads.validation`, Parquet I/O :mod:`specgym.envs.workloads.parquet_io`, the sharded reader
:mod:`specgym.envs.workloads.sharded`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from specgym.envs.core.cost import DRAFTER_KINDS, TREE_NODE_LIMIT, CostProfile
from specgym.envs.core.kinds import IMPLICIT_DRAFTER
from specgym.envs.core.signals import TOPK, SignalColumns, projection_from_meta
from specgym.envs.workloads.loops import is_looped
from specgym.errors import SpecgymError

#: The newest format this specgym writes (v3 only where a v3 feature is used: a v2-only workload is written as v2).
FORMAT_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)
META_KEY = b"specgym"
SPLITS = ("train", "val", "test")
#: Per-position columns of formats v1/v2 (required there; optional in v3, where an absent one loads as ``None``).
POSITION_COLUMNS = ("p_accept", "draft_conf", "draft_entropy", "target_entropy")
#: Optional per-position signal columns of format v2 (numpy dtype, trailing width: None = scalar per position,
#: "topk" = TOPK, "sketch" = the metadata's hidden_sketch.dim, "head_depth" / "head_topk" = the metadata's
#: head_ranks.depth / depth * topk).
SIGNAL_COLUMNS: dict[str, tuple[Any, str | None]] = {
    "token_id": (np.int32, None),
    "draft_token": (np.int32, None),
    "target_rank": (np.int32, None),
    "draft_topk": (np.float32, "topk"),
    "lookup_len": (np.int8, None),
    "lookup_token": (np.int32, None),
    "lookup_agree": (np.bool_, None),
    "hidden_sketch": (np.float32, "sketch"),
    "ranks_head": (np.int8, "head_depth"),
    "topk_head": (np.uint16, "head_topk"),
}
#: The ``signals`` metadata block that describes ``ranks_head`` and ``topk_head`` (the draft head's per-start ranks
#: and top-k probabilities, for the tree replay of head trees): its ``version``, ``depth``, ``cap``, ``topk`` and
#: ``topk_scale`` (:func:`head_ranks_meta`).
HEAD_RANKS_META = "head_ranks"
#: The one version of the ``head_ranks`` block this specgym reads (another is refused in one line).
HEAD_RANKS_VERSION = 1
#: ``ranks_head`` stores ``min(rank, cap)``: a node has at most ``TREE_NODE_LIMIT = 64`` children, so no tree accepts
#: a token of rank 64 or more, and the cap (also written where the head cannot propose the token, or past the
#: completion) loses nothing a tree replay reads.
HEAD_RANK_CAP = TREE_NODE_LIMIT
#: ``topk_head`` stores each probability ``p`` as ``round(p * HEAD_TOPK_SCALE)`` (uint16).
HEAD_TOPK_SCALE = 65535
REQUEST_COLUMNS = ("request_id", "category", "temperature", "prompt_len", "prompt_text", "split")
SOURCE_KINDS = ("recorded", "synthetic", "published", "imported")
#: Format v3: the column of a drafter's per-start runs is ``RUNS_PREFIX + name`` (``list<int16>``).
RUNS_PREFIX = "runs_"
RUNS_DTYPE = np.int16
#: How a drafter's runs are stored: per start (a runs column) or per position (``p_accept``, draws from a seed).
RUNS_KINDS = ("per-start", "per-position")


@dataclass
class Workload:
    """A set of requests with per-position acceptance data and draft features.

    Attributes:
        name: Workload name (``speclane-mix``, ``tinypair-greedy``...).
        source: ``{"kind": "synthetic", "generator": ..., "params": {...}}``,
            ``{"kind": "recorded", "draft_model": ..., "target_model": ..., ...}`` or
            ``{"kind": "published", ...}`` (a published trace replayed: an importer's provenance) or
            ``{"kind": "imported", ...}`` (the user's own engine metrics, e.g. vLLM's per-request spec-decode
            metrics: :mod:`~specgym.envs.workloads.vllm_metrics`; never a specgym live run).
        profile: The cost profile the workload was recorded with (or generated for).
        request_id: ``(R,)`` request identifiers (str).
        category: ``(R,)`` category labels (str).
        temperature: ``(R,)`` sampling temperature, 0 = greedy.
        prompt_len: ``(R,)`` prompt lengths in tokens (the KV cache holds ``prompt_len + i`` tokens at position i).
        split: ``(R,)`` one of ``train``/``val``/``test``.
        offsets: ``(R+1,)`` int64; request r owns positions ``offsets[r]:offsets[r+1]``.
        p_accept: flat float32 acceptance probability (greedy: 0/1) per position; ``None`` in a per-start trace.
        draft_conf: flat float32 draft probability of its proposed token; ``None`` where the trace lacks it.
        draft_entropy: flat float32 draft entropy (nats); ``None`` where the trace lacks it.
        target_entropy: flat float32 target entropy (nats), NaN where unknown; ``None`` where the trace lacks it.
        prompt_text: optional per-request prompt text.
        split_seed: seed the split assignment was drawn from.
        extra: free-form metadata kept through a save/load round trip.
        token_id, draft_token, target_rank, draft_topk, lookup_len, lookup_token, lookup_agree, hidden_sketch:
            the optional v2 signal columns (module docstring), flat over positions (``draft_topk`` ``(n, 8)``,
            ``hidden_sketch`` ``(n, D)``); ``None`` where absent.
        ranks_head, topk_head: the draft head's per-start ranks ``(n, J)`` int8 and top-k probabilities
            ``(n, J * 8)`` uint16 (module :mod:`~specgym.envs.workloads.trace_format`); ``None`` where absent
            (``topk_head``, which only EAGLE-2's modelled replay reads, may be dropped from a trace that keeps
            ``ranks_head``).
        signal_meta: the ``signals`` metadata block (empty without signal columns).
        runs: format v3: ``{drafter: flat int16 runs}``, ``runs[g]`` = the draft tokens a round starting at ``g``
            accepts with a long enough draft (bonus excluded); empty in a per-position trace.
        drafters: format v3: the ``drafters`` metadata block, ``[{"name", "kind", "runs", ...provenance}]`` (the
            default drafter first); empty = one implicit per-position drafter ``draft``.
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
    p_accept: np.ndarray | None
    draft_conf: np.ndarray | None
    draft_entropy: np.ndarray | None
    target_entropy: np.ndarray | None
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
    ranks_head: np.ndarray | None = None
    topk_head: np.ndarray | None = None
    signal_meta: dict[str, Any] = field(default_factory=dict)
    runs: dict[str, np.ndarray] = field(default_factory=dict)
    drafters: list[dict[str, Any]] = field(default_factory=list)

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
    def is_published(self) -> bool:
        """True for an imported published trace (replayed, never a live run of specgym's)."""
        return self.source.get("kind") == "published"

    @property
    def label(self) -> str:
        """Name with a ``(synthetic)``, ``(published trace, replayed)`` or ``(imported engine metrics, replayed)`` tag
        where it applies, for tables and plots."""
        if self.is_synthetic:
            return f"{self.name} (synthetic)"
        if self.source.get("kind") == "imported":
            return f"{self.name} (imported engine metrics, replayed)"
        return f"{self.name} (published trace, replayed)" if self.is_published else self.name

    @property
    def signal_names(self) -> list[str]:
        """The v2 signal columns this workload carries (empty for v1 and synthetic traces)."""
        return [c for c in SIGNAL_COLUMNS if getattr(self, c) is not None]

    @property
    def position_names(self) -> list[str]:
        """The per-position columns of :data:`POSITION_COLUMNS` this workload carries (all four before v3)."""
        return [c for c in POSITION_COLUMNS if getattr(self, c) is not None]

    @property
    def lacks(self) -> frozenset[str]:
        """The per-position columns this workload does not carry (controllers that need one refuse)."""
        return frozenset(c for c in POSITION_COLUMNS if getattr(self, c) is None)

    def flat_columns(self) -> dict[str, np.ndarray]:
        """Every flat per-position array it carries, by column name (runs as ``runs_<drafter>``)."""
        out = {c: getattr(self, c) for c in (*self.position_names, *self.signal_names)}
        out.update({RUNS_PREFIX + d: r for d, r in self.runs.items()})
        return out

    def with_columns(self, cols: dict[str, np.ndarray], **fields: Any) -> Workload:
        """A copy with the flat columns of :meth:`flat_columns` replaced by ``cols`` (and other fields by
        ``fields``); a column absent from ``cols`` is absent from the copy."""
        runs = {c[len(RUNS_PREFIX):]: v for c, v in cols.items() if c.startswith(RUNS_PREFIX)}
        per: dict[str, Any] = {c: cols.get(c) for c in (*POSITION_COLUMNS, *SIGNAL_COLUMNS)}
        return replace(self, runs=runs, **per, **fields)

    def require(self, col: str, what: str) -> np.ndarray:
        """The per-position column ``col``, or a one-line error naming the workload, ``what`` needs it for and the
        missing column."""
        arr = getattr(self, col)
        if arr is None:
            raise SpecgymError(f"workload {self.name!r} has no {col!r} column, which {what} needs "
                               f"({self.trace_kind} trace)")
        return arr

    def mean_acceptance(self, drafter: str | None = None) -> float:
        """The trace's mean per-token acceptance: ``p_accept``'s mean for a per-position drafter; for a per-start one
        the geometric equivalent of its mean run ``m``, ``m / (1 + m)`` (the alpha whose expected run is ``m``)."""
        info = self.drafter_info(drafter)
        if info["runs"] == "per-position":
            return float(np.mean(self.require("p_accept", "the mean acceptance")))
        m = float(np.mean(self.runs[info["name"]]))
        return m / (1.0 + m)

    @property
    def trace_kind(self) -> str:
        """``per-start`` when some drafter's runs are stored per start, else ``per-position``."""
        return "per-start" if self.runs else "per-position"

    # --------------------------------------------------------------------------------------------- drafters
    @property
    def drafter_names(self) -> list[str]:
        """The drafters the trace holds runs of, the default first (``["draft"]`` for a per-position trace)."""
        return [d["name"] for d in self.drafters] or [IMPLICIT_DRAFTER]

    @property
    def default_drafter(self) -> str:
        """The first drafter: what an engine replays unless told otherwise."""
        return self.drafter_names[0]

    def drafter_info(self, name: str | None = None) -> dict[str, Any]:
        """The ``drafters`` entry of ``name`` (the default when ``None``); an unknown name is a one-line error."""
        name = self.default_drafter if name is None else name
        for d in self.drafters or [{"name": IMPLICIT_DRAFTER, "kind": "model", "runs": "per-position"}]:
            if d["name"] == name:
                return d
        raise SpecgymError(f"workload {self.name!r} has no drafter {name!r}; it holds "
                           f"{', '.join(self.drafter_names)}")

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

    def looped(self) -> np.ndarray | None:
        """``(R,)`` bool: the requests whose completion ends in a repetition loop
        (:func:`~specgym.envs.workloads.loops.is_looped`, the one definition), or ``None`` for a trace without token
        ids. A looping greedy answer is easy to draft, so tables report every figure also without these requests."""
        if self.token_id is None:
            return None
        return np.array([is_looped(self.token_id[self.span(r)].tolist()) for r in range(self.n_requests)], dtype=bool)

    @property
    def fit_split(self) -> str:
        """The split fitted rules, predictors and policies learn from: ``train``, or the recording's
        ``extra["fit_split"]``. A recording whose draft model was trained on its train prompts names ``val`` there:
        on those prompts the draft's acceptance is its training set's, not that of use (a drafter-choice rule
        fitted on them over-trusts the draft), so fitting moves to val and test stays held out."""
        split = self.extra.get("fit_split", "train")
        if split not in SPLITS[:2]:
            raise SpecgymError(f"workload {self.name!r}: metadata extra.fit_split must be 'train' or 'val', "
                               f"got {split!r}")
        return str(split)

    def learning_requests(self) -> tuple[np.ndarray, np.ndarray]:
        """``(fit, select)``: the requests a learner fits on and those it chooses a model kind or a setting on: the
        train and val splits; with :attr:`fit_split` ``val``, val's requests alternately (a choice is never made on
        the rows fitted)."""
        if self.fit_split == "train":
            return self.split_indices("train"), self.split_indices("val")
        val = self.split_indices("val")
        if len(val) < 2:
            raise SpecgymError(f"workload {self.name!r} fits on val but has {len(val)} val request(s): at least 2 "
                               f"(one to fit on, one to choose on)")
        return val[0::2], val[1::2]

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
        return self.with_columns(
            {c: a[gather] for c, a in self.flat_columns().items()},
            request_id=self.request_id[idx], category=self.category[idx], temperature=self.temperature[idx],
            prompt_len=self.prompt_len[idx], split=self.split[idx], offsets=offsets,
            prompt_text=None if self.prompt_text is None else [self.prompt_text[i] for i in idx])

    def slice(self, lo: int, hi: int) -> Workload:
        """Requests ``lo:hi`` (a contiguous slice: views of the flat columns, no gather)."""
        if lo == 0 and hi == self.n_requests:
            return self
        p0, p1 = int(self.offsets[lo]), int(self.offsets[hi])
        return self.with_columns(
            {c: a[p0:p1] for c, a in self.flat_columns().items()},
            request_id=self.request_id[lo:hi], category=self.category[lo:hi], temperature=self.temperature[lo:hi],
            prompt_len=self.prompt_len[lo:hi], split=self.split[lo:hi], offsets=self.offsets[lo : hi + 1] - p0,
            prompt_text=None if self.prompt_text is None else self.prompt_text[lo:hi])

    @property
    def format_version(self) -> int:
        """The format version it is written as: 3 where a v3 feature is used (runs, drafters, an absent position
        column), else 2."""
        return 3 if (self.runs or self.drafters or self.lacks) else 2

    def metadata(self) -> dict[str, Any]:
        """The JSON metadata block stored in the Parquet schema."""
        return {
            "format_version": self.format_version,
            "name": self.name,
            "source": self.source,
            "profile": self.profile.to_dict(),
            "split_seed": int(self.split_seed),
            "extra": self.extra,
            **({"signals": self.signal_meta} if self.signal_meta else {}),
            **({"drafters": self.drafters} if self.drafters else {}),
        }


def head_ranks_meta(depth: int) -> dict[str, Any]:
    """The ``signals.head_ranks`` metadata block of a recording with ``ranks_head`` / ``topk_head`` of ``depth``
    columns."""
    return {"version": HEAD_RANKS_VERSION, "depth": int(depth), "cap": HEAD_RANK_CAP, "topk": TOPK,
            "topk_scale": HEAD_TOPK_SCALE, "drafter": "head",
            "rank": "ranks_head[g, j]: rank of completion token g + j among the draft head's scores after j + 1 "
                    "steps from the round start at g along the completion (0 = top-1, ties by the head's column), "
                    "min(rank, cap); cap where the head cannot propose it or past the completion",
            "topk_head": "topk_head[g, 8 j : 8 j + 8]: the head's 8 largest probabilities there, descending, times "
                         "topk_scale (0 past the completion)"}


def head_ranks_depth(signal_meta: dict[str, Any], where: str) -> int | None:
    """The depth ``J`` of the ``head_ranks`` block, ``None`` without one; a block of another version or with a bad
    depth, cap or scale raises one line naming ``where``."""
    meta = signal_meta.get(HEAD_RANKS_META)
    if meta is None:
        return None
    if not isinstance(meta, dict) or meta.get("version") != HEAD_RANKS_VERSION:
        got = meta.get("version") if isinstance(meta, dict) else meta
        raise SpecgymError(f"{where}: metadata field 'signals.{HEAD_RANKS_META}.version' is {got!r}; this specgym "
                           f"reads version {HEAD_RANKS_VERSION} of the draft head's ranks")
    depth = meta.get("depth")
    if not isinstance(depth, int) or not 1 <= depth <= 127:
        raise SpecgymError(f"{where}: metadata field 'signals.{HEAD_RANKS_META}.depth' must be an int in [1, 127], "
                           f"got {depth!r}")
    want = {"cap": HEAD_RANK_CAP, "topk": TOPK, "topk_scale": HEAD_TOPK_SCALE}
    for key, value in want.items():
        if meta.get(key) != value:
            raise SpecgymError(f"{where}: metadata field 'signals.{HEAD_RANKS_META}.{key}' must be {value}, got "
                               f"{meta.get(key)!r}")
    return depth


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


def drafter_entry(name: str, kind: str, runs: str = "per-start", **provenance: Any) -> dict[str, Any]:
    """One ``drafters`` metadata entry (checked: a word for a name, a known kind and runs kind)."""
    if not name or any(c in name for c in ",: ") or kind not in DRAFTER_KINDS or runs not in RUNS_KINDS:
        raise SpecgymError(f"drafter {name!r}: a word for a name, kind in {DRAFTER_KINDS}, runs in {RUNS_KINDS}")
    return {"name": name, "kind": kind, "runs": runs, **provenance}

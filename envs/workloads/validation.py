"""Validation of a workload: every invariant of the trace format (:mod:`specgym.envs.workloads.trace_format`), each
defect a one-line :class:`~specgym.errors.SpecgymError` naming the file (or workload), the field and the request."""

from __future__ import annotations

import numpy as np

from specgym.envs.core.cost import DRAFTER_KINDS
from specgym.envs.core.lookup import LOOKUP_MAX_N
from specgym.envs.core.signals import TOPK, projection_from_meta
from specgym.envs.workloads.workload import (
    HEAD_RANK_CAP,
    HEAD_RANKS_META,
    RUNS_DTYPE,
    RUNS_KINDS,
    RUNS_PREFIX,
    SIGNAL_COLUMNS,
    SOURCE_KINDS,
    SPLITS,
    Workload,
    head_ranks_depth,
)
from specgym.errors import SpecgymError


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
    for col in wl.position_names:
        arr = getattr(wl, col)
        if arr.dtype != np.float32 or arr.shape != (n,):
            raise SpecgymError(f"{where}: field {col!r} has {arr.shape[0]} values, expected {n} float32")
    for col in ("p_accept", "draft_conf", "draft_entropy"):
        arr = getattr(wl, col)
        if arr is not None and np.isnan(arr).any():
            bad = _first_request(off, np.flatnonzero(np.isnan(arr))[0])
            raise SpecgymError(f"{where}: field {col!r} contains NaN (request {wl.request_id[bad]!r})")
    for col, lo, hi in (("p_accept", 0.0, 1.0), ("draft_conf", 0.0, 1.0)):
        arr = getattr(wl, col)
        if arr is None:
            continue
        bad_mask = (arr < lo) | (arr > hi)
        if bad_mask.any():
            k = int(np.flatnonzero(bad_mask)[0])
            raise SpecgymError(
                f"{where}: field {col!r} value {float(arr[k])!r} out of range [{lo}, {hi}] "
                f"(request {wl.request_id[_first_request(off, k)]!r})"
            )
    for col in ("draft_entropy", "target_entropy"):
        arr = getattr(wl, col)
        if arr is not None and ((arr < 0).any() or np.isinf(arr).any()):
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
    _validate_runs(wl, where)
    _validate_signals(wl, where)


def _validate_runs(wl: Workload, where: str) -> None:
    """Format v3: the drafters block against the runs columns and ``p_accept``; the runs' dtype, shape and range."""
    names = [d.get("name") if isinstance(d, dict) else None for d in wl.drafters]
    if len(set(names)) != len(names) or any(not isinstance(n, str) for n in names):
        raise SpecgymError(f"{where}: metadata field 'drafters' must list objects with distinct 'name's")
    unlisted = sorted(set(wl.runs) - set(names))
    if unlisted:
        raise SpecgymError(f"{where}: column {RUNS_PREFIX + unlisted[0]!r} has no entry in metadata field 'drafters'")
    for d in wl.drafters:
        if d.get("kind") not in DRAFTER_KINDS or d.get("runs") not in RUNS_KINDS:
            raise SpecgymError(f"{where}: metadata field 'drafters' entry {d['name']!r}: 'kind' must be one of "
                               f"{DRAFTER_KINDS} and 'runs' one of {RUNS_KINDS}")
        if d["runs"] == "per-start" and d["name"] not in wl.runs:
            raise SpecgymError(f"{where}: drafter {d['name']!r} is per-start but column "
                               f"{RUNS_PREFIX + d['name']!r} is missing")
        if d["runs"] == "per-position" and d["name"] in wl.runs:
            raise SpecgymError(f"{where}: drafter {d['name']!r} is per-position but has a runs column")
    per_position = [d["name"] for d in wl.drafters if d["runs"] == "per-position"]
    if len(per_position) > 1:
        raise SpecgymError(f"{where}: metadata field 'drafters' lists {len(per_position)} per-position drafters "
                           f"(p_accept holds one)")
    if (per_position or not wl.drafters) and wl.p_accept is None:
        raise SpecgymError(f"{where}: missing column 'p_accept' (a per-position drafter's acceptance; a per-start "
                           f"trace lists its drafters and their runs columns)")
    n = wl.n_positions
    for drafter, arr in wl.runs.items():
        col = RUNS_PREFIX + drafter
        if arr.dtype != RUNS_DTYPE or arr.shape != (n,):
            raise SpecgymError(f"{where}: field {col!r} has shape {arr.shape} {arr.dtype}, expected ({n},) int16")
        if (arr < 0).any():
            k = int(np.flatnonzero(arr < 0)[0])
            raise SpecgymError(f"{where}: field {col!r} has a negative run (request "
                               f"{wl.request_id[_first_request(wl.offsets, k)]!r})")


def _validate_signals(wl: Workload, where: str) -> None:
    """Checks of the v2 signal columns: shape and dtype, ranges, and the identities between them."""
    n, off = wl.n_positions, wl.offsets
    sketch_meta = wl.signal_meta.get("hidden_sketch")
    if (sketch_meta is None) != (wl.hidden_sketch is None):
        raise SpecgymError(f"{where}: field 'hidden_sketch' and metadata field 'signals.hidden_sketch' must come "
                           "together")
    sketch_dim = None if sketch_meta is None else projection_from_meta(sketch_meta, where).shape[1]
    head_depth = head_ranks_depth(wl.signal_meta, where)
    if (head_depth is None) != (wl.ranks_head is None) or (wl.ranks_head is None and wl.topk_head is not None):
        raise SpecgymError(f"{where}: field 'ranks_head' and metadata field 'signals.{HEAD_RANKS_META}' must come "
                           f"together, and 'topk_head' needs them")
    widths = {"topk": TOPK, "sketch": sketch_dim, "head_depth": head_depth,
              "head_topk": None if head_depth is None else head_depth * TOPK}
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
    if wl.ranks_head is not None:
        fail("ranks_head", (wl.ranks_head < 0) | (wl.ranks_head > HEAD_RANK_CAP),
             f"has a value outside [0, {HEAD_RANK_CAP}]")
    if wl.topk_head is not None:
        blocks = wl.topk_head.reshape(n, -1, TOPK).astype(np.int32)
        fail("topk_head", np.diff(blocks, axis=2) > 0, "is not sorted in descending order within each depth")
    greedy = np.repeat(wl.temperature == 0, np.diff(off))
    if greedy.any() and wl.p_accept is not None:
        if wl.draft_token is not None and wl.token_id is not None:
            fail("draft_token", greedy & ((wl.draft_token == wl.token_id) != (wl.p_accept == 1)),
                 "disagrees with p_accept (greedy: accepted iff draft_token == token_id)")
        if wl.target_rank is not None:
            fail("target_rank", greedy & ((wl.target_rank == 0) != (wl.p_accept == 1)),
                 "disagrees with p_accept (greedy: accepted iff target_rank == 0)")


def _first_request(offsets: np.ndarray, flat_index: int) -> int:
    return int(np.searchsorted(offsets, flat_index, side="right") - 1)

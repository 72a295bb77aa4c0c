"""Parquet I/O of one workload file: :func:`workload_to_table`, :func:`save_workload` (atomic) and
:func:`read_workload_file` (every column checked, one-line errors naming the file and the field). The format is
documented in :mod:`specgym.envs.workloads.trace_format`; pyarrow is imported inside the functions (start-up)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.signals import TOPK
from specgym.envs.workloads.validation import validate_workload
from specgym.envs.workloads.workload import (
    HEAD_RANKS_META,
    META_KEY,
    POSITION_COLUMNS,
    REQUEST_COLUMNS,
    RUNS_PREFIX,
    SIGNAL_COLUMNS,
    SUPPORTED_VERSIONS,
    Workload,
    head_ranks_depth,
)
from specgym.errors import SpecgymError
from specgym.io import atomic_path, atomic_paths


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
    for col in wl.position_names:
        cols[col] = list_cls.from_arrays(offsets, pa.array(getattr(wl, col), pa.float32()))
    for col in wl.signal_names:
        arr = getattr(wl, col)
        values = pa.array(arr.reshape(-1))
        if arr.ndim == 2:
            values = pa.FixedSizeListArray.from_arrays(values, arr.shape[1])
        cols[col] = list_cls.from_arrays(offsets, values)
    for d, arr in wl.runs.items():
        cols[RUNS_PREFIX + d] = list_cls.from_arrays(offsets, pa.array(arr, pa.int16()))
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


def save_workloads(items: Sequence[tuple[Workload, str | Path]], overwrite: bool = False) -> list[Path]:
    """Write several workloads all or nothing: each is validated and written to a temporary first, and they move
    into place only once every one is complete (a bad one or a full disk leaves none of them)."""
    _, pq = _arrow()
    tables = []
    for wl, _path in items:
        validate_workload(wl, where=f"workload {wl.name!r}")
        tables.append(workload_to_table(wl))
    paths = [Path(p) for _, p in items]
    with atomic_paths(paths, overwrite=overwrite) as tmps:
        for table, tmp in zip(tables, tmps):
            pq.write_table(table, tmp, compression="zstd")
    return paths


def read_workload_file(path: str | Path) -> Workload:
    """Load and validate one workload file; any defect raises a one-line :class:`SpecgymError` naming file and
    field."""
    pa, _ = _arrow()
    where = str(path)
    table, meta, version = _read_table(path)
    names = set(table.column_names)
    profile = CostProfile.from_dict(meta["profile"], where=f"{where}: metadata 'profile'")
    drafters, run_cols = _drafter_columns(meta, version, names, where)
    offsets_ref, first_col, flats, runs = _position_columns(pa, table, run_cols, where)
    signal_meta = meta.get("signals", {}) if version >= 2 else {}
    if not isinstance(signal_meta, dict):
        raise SpecgymError(f"{where}: metadata field 'signals' must be an object")
    sketch_dim = (signal_meta.get("hidden_sketch") or {}).get("dim")
    head_depth = head_ranks_depth(signal_meta, where)
    widths = {"topk": TOPK, "sketch": sketch_dim, "head_depth": head_depth,
              "head_topk": None if head_depth is None else head_depth * TOPK}
    for col in SIGNAL_COLUMNS if version >= 2 else ():
        if col in names:
            offs, values = _list_column(pa, table, col, where)
            if not np.array_equal(offs, offsets_ref):
                raise SpecgymError(f"{where}: column {col!r} lengths differ from {first_col!r} (inconsistent lengths)")
            kind = SIGNAL_COLUMNS[col][1]
            flats[col] = _signal_values(pa, values, col, None if kind is None else widths[kind], where)
    prompt_col = table.column("prompt_text")
    prompt_text = None if prompt_col.null_count == len(prompt_col) else [t or "" for t in prompt_col.to_pylist()]
    wl = Workload(
        name=str(meta["name"]),
        source=dict(meta["source"]),
        profile=profile,
        request_id=_scalar(pa, table, "request_id", object, where),
        category=_scalar(pa, table, "category", object, where),
        temperature=_scalar(pa, table, "temperature", np.float32, where),
        prompt_len=_scalar(pa, table, "prompt_len", np.int32, where),
        split=_scalar(pa, table, "split", object, where),
        offsets=offsets_ref,
        prompt_text=prompt_text,
        split_seed=int(meta.get("split_seed", 0)),
        extra=dict(meta.get("extra", {})),
        signal_meta=dict(signal_meta),
        runs=runs,
        drafters=[dict(d) for d in drafters],
        **{c: flats.get(c) for c in POSITION_COLUMNS},
        **{c: v for c, v in flats.items() if c not in POSITION_COLUMNS},
    )
    validate_workload(wl, where=where)
    return wl


def _read_table(path: str | Path) -> tuple[Any, dict[str, Any], int]:
    """The file's table, its specgym metadata and format version, with the metadata fields and columns every
    workload of that version holds checked."""
    _, pq = _arrow()
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
    required = REQUEST_COLUMNS + (POSITION_COLUMNS if version < 3 else ())
    for col in required:
        if col not in names:
            raise SpecgymError(f"{where}: missing column {col!r}")
    return table, meta, version


def _scalar(pa: Any, table: Any, col: str, dtype: Any, where: str) -> np.ndarray:
    """One per-request column as a numpy array of ``dtype`` (no nulls)."""
    arr = table.column(col)
    if arr.null_count:
        raise SpecgymError(f"{where}: column {col!r} has null values")
    try:
        return arr.to_numpy().astype(dtype, copy=False)
    except (TypeError, ValueError, pa.ArrowInvalid) as exc:
        raise SpecgymError(f"{where}: column {col!r} has the wrong type ({exc})") from None


def _drafter_columns(meta: dict[str, Any], version: int, names: set[str],
                     where: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The metadata's drafters and the runs columns of those with per-start runs; a runs column no drafter names is
    refused."""
    drafters = meta.get("drafters", []) if version >= 3 else []
    if not isinstance(drafters, list) or not all(isinstance(d, dict) for d in drafters):
        raise SpecgymError(f"{where}: metadata field 'drafters' must be a list of objects")
    run_cols = [RUNS_PREFIX + str(d.get("name")) for d in drafters if d.get("runs") == "per-start"]
    stray = sorted(c for c in names if c.startswith(RUNS_PREFIX) and c not in run_cols)
    if stray:
        raise SpecgymError(f"{where}: column {stray[0]!r} has no per-start entry in metadata field 'drafters'")
    return drafters, run_cols


def _position_columns(pa: Any, table: Any, run_cols: list[str],
                      where: str) -> tuple[np.ndarray, str, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The per-position columns (``p_accept`` and the others of :data:`POSITION_COLUMNS`, float32) and the drafters'
    runs columns (int16, by drafter name), which must all share one set of offsets.

    Returns:
        The shared offsets, the column they were first read from, the float columns and the runs.
    """
    names = set(table.column_names)
    offsets_ref = None
    first_col = ""
    flats: dict[str, np.ndarray] = {}
    runs: dict[str, np.ndarray] = {}
    for col in (*POSITION_COLUMNS, *run_cols):
        if col not in names:
            continue
        offs, values = _list_column(pa, table, col, where)
        if col in run_cols:
            if values.type != pa.int16():
                raise SpecgymError(f"{where}: column {col!r} must be a list of int16, got list<{values.type}>")
            if values.null_count:
                raise SpecgymError(f"{where}: column {col!r} has null values")
            runs[col[len(RUNS_PREFIX):]] = values.to_numpy(zero_copy_only=False).astype(np.int16, copy=False)
        else:
            if not pa.types.is_floating(values.type):
                raise SpecgymError(f"{where}: column {col!r} must hold floats, got {values.type}")
            flats[col] = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        if offsets_ref is None:
            offsets_ref, first_col = offs, col
        elif not np.array_equal(offs, offsets_ref):
            raise SpecgymError(f"{where}: column {col!r} offsets differ from {first_col!r} (inconsistent lengths)")
    if offsets_ref is None:
        raise SpecgymError(f"{where}: no per-position column (neither 'p_accept' nor a runs column)")
    return offsets_ref, first_col, flats, runs


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
    want = {np.int32: pa.int32(), np.int8: pa.int8(), np.bool_: pa.bool_(), np.float32: pa.float32(),
            np.uint16: pa.uint16()}[dtype]
    if kind is not None:
        if width is None:
            block = HEAD_RANKS_META if kind.startswith("head") else "hidden_sketch"
            raise SpecgymError(f"{where}: column {col!r} needs metadata field 'signals.{block}'")
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

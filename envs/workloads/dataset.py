"""Sharded workloads, written: a workload as a folder of Parquet shards plus one metadata record.

:func:`write_dataset` writes shards one at a time (memory is one shard); :func:`chunks` cuts an in-memory workload
into shards; :func:`split_workload` and :func:`merge_workloads` are ``specgym workloads split`` / ``merge``;
:func:`iter_workload_shards` reads a folder or a single file shard by shard (one code path for both).

The folder format and its reader (:func:`~specgym.envs.workloads.trace_format.open_dataset`,
:class:`~specgym.envs.workloads.trace_format.ShardedWorkload`,
:func:`~specgym.envs.workloads.trace_format.load_dataset`) live in :mod:`specgym.envs.workloads.trace_format`,
whose ``load_workload`` reads a folder as well as a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.workloads.trace_format import (
    RECORD,
    RECORD_FORMAT,
    RECORD_VERSION,
    ShardedWorkload,
    ShardInfo,
    Workload,
    concat_workloads,
    load_workload,
    metadata_difference,
    open_dataset,
    save_workload,
)
from specgym.errors import SpecgymError
from specgym.io import atomic_dir, check_output

DEFAULT_SHARD_REQUESTS = 20_000


def shard_name(index: int) -> str:
    """File name of shard ``index`` (``shard-00000.parquet``)."""
    return f"shard-{index:05d}.parquet"


def is_dataset(path: str | Path) -> bool:
    """True when ``path`` is a folder (a sharded workload, or a folder that should be one)."""
    return Path(path).is_dir()


def write_dataset(shards: Iterable[Workload], out: str | Path, overwrite: bool = False) -> ShardedWorkload:
    """Write shards (consumed one at a time: memory is one shard) as a dataset folder, atomically.

    Every shard must carry the first one's metadata; request ids must be unique over the dataset.
    """
    out = Path(out)
    check_output(out, overwrite, "dir")
    infos: list[ShardInfo] = []
    meta: dict[str, Any] | None = None
    seen: set[str] = set()
    with atomic_dir(out, overwrite=overwrite) as tmp:
        for i, wl in enumerate(shards):
            if meta is None:
                meta = wl.metadata()
            elif wl.metadata() != meta:
                raise SpecgymError(f"{out}: shard {i}: metadata field {metadata_difference(wl.metadata(), meta)!r} "
                                   f"differs from shard 0 (mismatched metadata)")
            ids = wl.request_id.tolist()
            dup = next((r for r in ids if r in seen), None)
            if dup is not None:
                raise SpecgymError(f"{out}: shard {i}: request id {dup!r} already in an earlier shard")
            seen.update(ids)
            save_workload(wl, tmp / shard_name(i))
            infos.append(ShardInfo(shard_name(i), wl.n_requests, wl.n_positions))
        if meta is None:
            raise SpecgymError(f"{out}: no shards to write")
        rec = {"format": RECORD_FORMAT, "version": RECORD_VERSION, "metadata": meta,
               "shards": [vars(s) for s in infos], "requests": sum(s.requests for s in infos),
               "positions": sum(s.positions for s in infos)}
        (tmp / RECORD).write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
    return ShardedWorkload(out, meta, infos)


def chunks(wl: Workload, shard_requests: int) -> Iterator[Workload]:
    """``wl`` cut into consecutive shards of ``shard_requests`` requests (the last one may be shorter)."""
    if shard_requests < 1:
        raise SpecgymError(f"--shard-requests must be >= 1, got {shard_requests}")
    for lo in range(0, wl.n_requests, shard_requests):
        yield _slice(wl, lo, min(lo + shard_requests, wl.n_requests))


def _slice(wl: Workload, lo: int, hi: int) -> Workload:
    """Requests ``lo:hi`` of ``wl`` (a contiguous slice: views of the flat columns, no gather)."""
    return wl.slice(lo, hi)


PARQUET_MAGIC = b"PAR1"


def check_shard_files(ds: ShardedWorkload) -> None:
    """Check every shard's file at open, without reading its columns: present, a whole Parquet file (the magic at
    both ends and a footer that fits: a truncated copy loses its footer) whose row count is the record's. Reading
    is still lazy: the columns of a shard are validated when it is read (:meth:`ShardedWorkload.shard`).

    Raises:
        SpecgymError: The first defective shard, named, with what is wrong.
    """
    _, pq = _arrow()
    for info in ds.shards:
        path = ds.path / info.file
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(4)
                f.seek(max(size - 8, 0))
                tail = f.read(8)
        except FileNotFoundError:
            raise SpecgymError(f"{path}: shard listed in {ds.path / RECORD} is missing") from None
        except OSError as exc:
            raise SpecgymError(f"{path}: cannot read ({exc.strerror or exc})") from None
        footer = int.from_bytes(tail[:4], "little") if len(tail) == 8 else -1
        if size < 12 or head != PARQUET_MAGIC or tail[4:] != PARQUET_MAGIC or not 0 < footer <= size - 12:
            raise SpecgymError(f"{path}: truncated or damaged ({size:,} bytes, no whole Parquet footer); restore it "
                               f"from the recording")
        try:
            rows = pq.read_metadata(path).num_rows
        except Exception as exc:  # pyarrow raises several types for a damaged footer
            raise SpecgymError(f"{path}: damaged Parquet footer ({type(exc).__name__})") from None
        if rows != info.requests:
            raise SpecgymError(f"{path}: holds {rows} requests, {ds.path / RECORD} lists {info.requests}")


def _arrow() -> Any:
    import pyarrow
    import pyarrow.parquet as pq

    return pyarrow, pq


def iter_workload_shards(path: str | Path) -> Iterator[Workload]:
    """The shards of a dataset folder (every shard file checked at open: :func:`check_shard_files`), or a
    single-file workload as one shard (one code path for both)."""
    if is_dataset(path):
        ds = open_dataset(path)
        check_shard_files(ds)
        yield from ds.iter_shards()
    else:
        yield load_workload(path)


def split_workload(src: str | Path, out: str | Path, shard_requests: int = DEFAULT_SHARD_REQUESTS,
                   overwrite: bool = False) -> ShardedWorkload:
    """``specgym workloads split``: a single-file workload as a dataset folder of ``shard_requests``-request shards."""
    if shard_requests < 1:
        raise SpecgymError(f"--shard-requests must be >= 1, got {shard_requests}")
    check_output(out, overwrite, "dir")
    return write_dataset(chunks(load_workload(src), shard_requests), out, overwrite=overwrite)


#: What workloads must share to be merged into one: the recording setup (format, pair, temperature, dtype, signal
#: set and sketch projection). Everything else — names, summaries (``extra``), prompts files, seeds, lengths — may
#: differ: the merge names the result, recomputes the summaries and keeps each source's own under
#: ``source.merged_from``.
MERGE_FIELDS = ("format_version", "source.kind", "source.draft_model", "source.target_model", "source.temperature",
                "source.dtype", "signals")


def merge_workloads(sources: list[str | Path], out: str | Path, overwrite: bool = False, name: str | None = None,
                    notes: list[str] | None = None) -> Workload | ShardedWorkload:
    """``specgym workloads merge``: workloads (files or dataset folders), concatenated in the order given, into one
    ``.parquet`` file or (``out`` without that suffix) one dataset folder of the sources' shards.

    Sources with identical metadata are concatenated as they are (the shards of one workload). Sources that differ
    only where :data:`MERGE_FIELDS` allows (two ``specgym record`` runs of one pair over two prompts files) merge into
    a workload named ``name`` (default: ``out``'s stem) whose summaries are recomputed over all its requests; a
    genuinely incompatible source is refused in one line naming the field.

    Args:
        notes: Receives one line per decision the merge took for the user (a profile kept from the first source,
            request ids prefixed because two sources share them).
    """
    if not sources:
        raise SpecgymError("merge: name at least one workload")
    out = Path(out)
    as_file = out.suffix == ".parquet"
    check_output(out, overwrite, "file" if as_file else "dir")
    notes = [] if notes is None else notes
    resolved = [Path(src).resolve() for src in sources]
    twice = next((src for k, src in enumerate(sources) if resolved[k] in resolved[:k]), None)
    if twice is not None:
        raise SpecgymError(f"merge: {twice} is named twice (its requests would be counted twice)")
    # pass 1 (one shard in memory at a time): every source's metadata, request ids, categories and loops
    seen: dict[str, int] = {}
    metas: list[dict[str, Any]] = []
    columns: list[list[str]] = []
    counts: list[int] = []
    clash = None
    looped: list[bool] = []
    cats: list[str] = []
    tokens = True
    for i, src in enumerate(sources):
        n = 0
        for wl in iter_workload_shards(src):
            if n == 0:
                metas.append(wl.metadata())
                columns.append(wl.signal_names)
            for rid in wl.request_id.tolist():
                if seen.setdefault(rid, i) != i and clash is None:
                    clash = (rid, seen[rid], i)
            tokens = tokens and wl.token_id is not None
            flags = wl.looped()
            if flags is not None:
                looped += flags.tolist()
            cats += wl.category.tolist()
            n += wl.n_requests
        counts.append(n)
    same = all(m == metas[0] for m in metas) and name in (None, metas[0].get("name"))
    if same and clash is None:
        shards: Iterator[Workload] = (s for src in sources for s in iter_workload_shards(src))
        return _write_merged(shards, out, as_file, overwrite)
    where = [str(src) for src in sources]
    meta = merged_metadata(where, metas, columns, counts, name or out.stem, notes)
    if tokens:  # the recorder's summaries, recomputed over the merged requests
        meta["extra"].update(_loop_summary(looped, cats))
    prefixes = [""] * len(sources)
    if clash is not None:
        stems = [Path(w).stem if Path(w).stem else f"source{i}" for i, w in enumerate(where)]
        prefixes = [f"{stem if stems.count(stem) == 1 else f'{stem}{i}'}/" for i, stem in enumerate(stems)]
        notes.append(f"request id {clash[0]!r} is in both {where[clash[1]]} and {where[clash[2]]}: every request "
                     f"id is prefixed with its source ({', '.join(repr(p) for p in prefixes)})")
    shards = (_as_merged(s, meta, prefixes[i]) for i, src in enumerate(sources) for s in iter_workload_shards(src))
    return _write_merged(shards, out, as_file, overwrite)


def _write_merged(shards: Iterator[Workload], out: Path, as_file: bool, overwrite: bool) -> Workload | ShardedWorkload:
    if as_file:
        wl = concat_workloads(list(shards), where=str(out))
        save_workload(wl, out, overwrite=overwrite)
        return wl
    return write_dataset(shards, out, overwrite=overwrite)


def _field(meta: dict[str, Any], key: str) -> Any:
    value: Any = meta
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def merged_metadata(where: list[str], metas: list[dict[str, Any]], columns: list[list[str]], counts: list[int],
                    name: str, notes: list[str]) -> dict[str, Any]:
    """The metadata block of a merge (see :func:`merge_workloads`); an incompatible source raises one line naming
    the field and both values."""
    first = metas[0]
    for w, m, cols in zip(where[1:], metas[1:], columns[1:]):
        for key in MERGE_FIELDS:
            a, b = _field(m, key), _field(first, key)
            if a == b:
                continue
            if key == "signals" and a and b:
                key = f"signals.{metadata_difference(a, b)}"
                a, b = _field(m, key), _field(first, key)
                if key == "signals.hidden_sketch":  # the projection itself is a long base64 string
                    a, b = ({k: v for k, v in (x or {}).items() if k != "projection_f32_b64"} for x in (a, b))
                    a, b = a or "none", b or "none"
            raise SpecgymError(f"{w}: metadata field {key!r} is {_short(a)}, {where[0]} has {_short(b)}: not the "
                               f"same recording setup (merge recordings of one pair, temperature, dtype and signal "
                               f"set)")
        if cols != columns[0]:
            raise SpecgymError(f"{w}: signal columns {cols} differ from {where[0]}'s {columns[0]}: not the same "
                               f"recording setup")
    if any(m["profile"] != first["profile"] for m in metas[1:]):
        notes.append(f"the sources' cost profiles differ (field 'profile'); the merge keeps {where[0]}'s "
                     f"({first['profile'].get('name')}): evaluate under another with --profile")
    sources = [m.get("source") or {} for m in metas]
    common = {k: v for k, v in sources[0].items() if k != "merged_from" and all(s.get(k) == v for s in sources)}
    extras = [m.get("extra") or {} for m in metas]
    extra = {k: v for k, v in extras[0].items() if k not in ("loop_share", "loop_share_by_category")
             and all(e.get(k) == v for e in extras)}
    merged_from = [{"workload": m.get("name"), "path": w, "requests": n, "extra": m.get("extra") or {},
                    "source": {k: v for k, v in (m.get("source") or {}).items() if k not in common}}
                   for w, m, n in zip(where, metas, counts)]
    return {**first, "name": name, "source": {**common, "merged_from": merged_from}, "extra": extra}


def _loop_summary(looped: list[bool], cats: list[str]) -> dict[str, Any]:
    """``loop_share`` and ``loop_share_by_category`` from per-request loop flags (the recorder's summary)."""
    flags = np.asarray(looped, dtype=bool)
    labels = np.asarray(cats, dtype=object)
    return {"loop_share": float(flags.mean()) if len(flags) else float("nan"),
            "loop_share_by_category": {c: float(flags[labels == c].mean()) for c in dict.fromkeys(cats)}}


def _as_merged(wl: Workload, meta: dict[str, Any], prefix: str) -> Workload:
    """A source shard carrying the merge's metadata (and its ids prefixed where two sources share one)."""
    ids = wl.request_id if not prefix else np.array([prefix + str(r) for r in wl.request_id], dtype=object)
    return replace(wl, name=meta["name"], source=meta["source"], extra=meta["extra"], request_id=ids,
                   profile=CostProfile.from_dict(meta["profile"], where="merge"), split_seed=int(meta["split_seed"]))

"""Sharded workloads: a folder of Parquet shards plus one metadata record, read shard by shard.

A workload too large for memory (millions of requests) is stored as a *dataset folder*:

* ``workload.json``: the metadata record: ``{"format": "specgym-sharded-workload", "version": 1, "metadata": {...},
  "shards": [{"file": "shard-00000.parquet", "requests": R, "positions": P}, ...], "requests": R_total,
  "positions": P_total}``, where ``metadata`` is the workload's metadata block
  (:meth:`~specgym.envs.workloads.trace_format.Workload.metadata`: name, source, profile, split seed, extra,
  signals, format version);
* the shards, in order: each an ordinary single-file workload (:mod:`specgym.envs.workloads.trace_format`) whose
  embedded metadata is exactly the record's ``metadata`` (so every shard is self-describing and loadable alone).

The workload is the concatenation of the shards in the listed order: request order, splits and columns are the
shards' own. Request ids are unique over the whole dataset.

Reading is lazy: :func:`open_dataset` checks only the record; :meth:`ShardedWorkload.iter_shards` loads and
validates one shard at a time (its columns, its request count against the record, its metadata against the
record's), so replay, evaluation and the oracles (:mod:`specgym.eval.streaming`) hold one shard in memory.
:func:`load_dataset` concatenates every shard into one in-memory :class:`Workload` (what ``load_workload`` returns
for a folder, for the tools that need the whole workload at once).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.workloads.trace_format import Workload, load_workload, save_workload, validate_workload
from specgym.errors import SpecgymError
from specgym.io import atomic_dir, check_output

RECORD = "workload.json"
RECORD_FORMAT = "specgym-sharded-workload"
RECORD_VERSION = 1
DEFAULT_SHARD_REQUESTS = 20_000


def shard_name(index: int) -> str:
    """File name of shard ``index`` (``shard-00000.parquet``)."""
    return f"shard-{index:05d}.parquet"


def is_dataset(path: str | Path) -> bool:
    """True when ``path`` is a folder (a sharded workload, or a folder that should be one)."""
    return Path(path).is_dir()


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
            field = _first_difference(wl.metadata(), self.metadata)
            raise SpecgymError(f"{path}: metadata field {field!r} differs from {self.path / RECORD} "
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


def _first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
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
    for field, value in (("requests", ds.n_requests), ("positions", ds.n_positions)):
        if rec.get(field) != value:
            raise SpecgymError(f"{rec_path}: field {field!r} is {rec.get(field)!r}, the shards sum to {value}")
    return ds


def concat_workloads(parts: list[Workload], where: str = "workload") -> Workload:
    """One in-memory workload from shards that share their metadata (in order; splits kept as stored)."""
    if not parts:
        raise SpecgymError(f"{where}: no shards")
    first = parts[0]
    for wl in parts[1:]:
        if wl.metadata() != first.metadata():
            raise SpecgymError(f"{where}: metadata field {_first_difference(wl.metadata(), first.metadata())!r} "
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
                raise SpecgymError(f"{out}: shard {i}: metadata field {_first_difference(wl.metadata(), meta)!r} "
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
    if lo == 0 and hi == wl.n_requests:
        return wl
    p0, p1 = int(wl.offsets[lo]), int(wl.offsets[hi])
    flat = slice(p0, p1)
    return replace(
        wl, request_id=wl.request_id[lo:hi], category=wl.category[lo:hi], temperature=wl.temperature[lo:hi],
        prompt_len=wl.prompt_len[lo:hi], split=wl.split[lo:hi], offsets=wl.offsets[lo : hi + 1] - p0,
        p_accept=wl.p_accept[flat], draft_conf=wl.draft_conf[flat], draft_entropy=wl.draft_entropy[flat],
        target_entropy=wl.target_entropy[flat],
        prompt_text=None if wl.prompt_text is None else wl.prompt_text[lo:hi],
        **{c: getattr(wl, c)[flat] for c in wl.signal_names},
    )


def iter_workload_shards(path: str | Path) -> Iterator[Workload]:
    """The shards of a dataset folder, or a single-file workload as one shard (one code path for both)."""
    if is_dataset(path):
        yield from open_dataset(path).iter_shards()
    else:
        yield load_workload(path)


def split_workload(src: str | Path, out: str | Path, shard_requests: int = DEFAULT_SHARD_REQUESTS,
                   overwrite: bool = False) -> ShardedWorkload:
    """``specgym workloads split``: a single-file workload as a dataset folder of ``shard_requests``-request shards."""
    if shard_requests < 1:
        raise SpecgymError(f"--shard-requests must be >= 1, got {shard_requests}")
    check_output(out, overwrite, "dir")
    return write_dataset(chunks(load_workload(src), shard_requests), out, overwrite=overwrite)


def merge_workloads(sources: list[str | Path], out: str | Path, overwrite: bool = False) -> Workload | ShardedWorkload:
    """``specgym workloads merge``: workloads (files or dataset folders) with the same metadata, concatenated in
    the order given, into one ``.parquet`` file or (``out`` without that suffix) one dataset folder whose shards
    are the sources' shards."""
    if not sources:
        raise SpecgymError("merge: name at least one workload")
    out = Path(out)
    as_file = out.suffix == ".parquet"
    check_output(out, overwrite, "file" if as_file else "dir")
    if as_file:
        wl = concat_workloads([s for src in sources for s in iter_workload_shards(src)], where=str(out))
        save_workload(wl, out, overwrite=overwrite)
        return wl
    return write_dataset((s for src in sources for s in iter_workload_shards(src)), out, overwrite=overwrite)


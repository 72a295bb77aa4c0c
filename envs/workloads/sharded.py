"""The sharded-workload reader: a dataset folder (``workload.json`` + shards, format in
:mod:`specgym.envs.workloads.trace_format`) opened lazily (:func:`open_dataset`, :class:`ShardedWorkload`), streamed
shard by shard, or concatenated (:func:`load_dataset`, :func:`concat_workloads`). Writing, splitting and merging is
:mod:`specgym.envs.workloads.dataset`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.workloads.parquet_io import read_workload_file
from specgym.envs.workloads.validation import validate_workload
from specgym.envs.workloads.workload import Workload
from specgym.errors import SpecgymError

#: A sharded workload's metadata record (the folder's ``workload.json``).
RECORD = "workload.json"
RECORD_FORMAT = "specgym-sharded-workload"
RECORD_VERSION = 1


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
        wl = read_workload_file(path)
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
    names = list(first.flat_columns())
    if any(list(wl.flat_columns()) != names for wl in parts):
        raise SpecgymError(f"{where}: the shards carry different columns (mismatched shards)")

    def cat(col: str) -> np.ndarray:
        return np.concatenate([getattr(wl, col) for wl in parts])

    out = first.with_columns(
        {c: np.concatenate([wl.flat_columns()[c] for wl in parts]) for c in names},
        request_id=cat("request_id"), category=cat("category"), temperature=cat("temperature"),
        prompt_len=cat("prompt_len"), split=cat("split"), offsets=offsets,
        prompt_text=None if all(t is None for t in texts) else
        [s for wl, t in zip(parts, texts) for s in (t if t is not None else [""] * wl.n_requests)],
    )
    validate_workload(out, where=where)
    return out


def load_dataset(path: str | Path) -> Workload:
    """Every shard of a dataset folder concatenated into one in-memory workload (validated)."""
    ds = open_dataset(path)
    return concat_workloads(list(ds.iter_shards(check_ids=False)), where=str(path))

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
from pathlib import Path
from typing import Any

from specgym.envs.workloads.trace_format import (
    RECORD, RECORD_FORMAT, RECORD_VERSION, ShardedWorkload, ShardInfo, Workload, concat_workloads, load_workload,
    metadata_difference, open_dataset, save_workload,
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


"""Small workloads the CLI tests hand to commands as a user's inputs: a few requests of the shipped midpair-greedy
trace, saved as they are or with what a user's recording may lack (another pair's models, no hidden sketch, no
train split, a truncated shard)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from specgym.envs.workloads.dataset import chunks, write_dataset
from specgym.envs.workloads.trace_format import Workload, load_workload, save_workload


def small(n: int = 4) -> Workload:
    """A few requests of every split of the shipped midpair-greedy trace (v2 signals and the hidden sketch)."""
    wl = load_workload("midpair-greedy")
    return wl.subset(np.concatenate([wl.split_indices(s)[:n] for s in ("train", "val", "test")]))


def saved(wl: Workload, folder: Path, name: str) -> Path:
    """``wl`` written to ``folder/name``."""
    folder.mkdir(exist_ok=True)
    save_workload(wl, folder / name)
    return folder / name


def other_pair(folder: Path) -> Path:
    """A recording that names another pair's models."""
    wl = small()
    return saved(dataclasses.replace(wl, source={**wl.source, "draft_model": "my/llama-draft",
                                                 "target_model": "my/llama-target"}), folder, "llama.parquet")


def no_sketch(folder: Path) -> Path:
    """A recording without the hidden sketch."""
    wl = small()
    return saved(dataclasses.replace(wl, hidden_sketch=None, signal_meta={
        k: v for k, v in wl.signal_meta.items() if k != "hidden_sketch"}), folder, "nosketch.parquet")


def no_train(folder: Path) -> Path:
    """A recording without a train split."""
    wl = small()
    return saved(wl.subset(np.flatnonzero(wl.split != "train")), folder, "notrain.parquet")


def shards(folder: Path) -> Path:
    """A sharded folder whose last shard was truncated (a copy cut short)."""
    write_dataset(chunks(small(), 4), folder / "ds")
    last = sorted((folder / "ds").glob("shard-*.parquet"))[-1]
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    return folder / "ds"


#: ``{NAME}`` in a command line -> how to make that input in a folder.
WORKLOADS: dict[str, Callable[[Path], Path]] = {
    "MIDPAIR": lambda f: saved(small(), f, "mine.parquet"), "OTHERPAIR": other_pair, "NOSKETCH": no_sketch,
    "NOTRAIN": no_train, "SHARDS": shards}

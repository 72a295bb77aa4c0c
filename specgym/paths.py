"""Where the shipped data lives (``data/`` at the repository root, or ``$SPECGYM_DATA``)."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR = Path(os.environ.get("SPECGYM_DATA", Path(__file__).resolve().parent.parent / "data"))
WORKLOADS_DIR = DATA_DIR / "workloads"
PROFILES_DIR = DATA_DIR / "profiles"
MODELS_DIR = DATA_DIR / "models"

#: Workloads in order of preference for commands run without ``--workload``: the recorded greedy trace of the
#: shipped model pair when present, else the synthetic SpecLane mix.
DEFAULT_WORKLOADS = ("tinypair-greedy", "speclane-mix")


def default_workload_name() -> str:
    """The default workload of ``eval``, ``train``, ``demo`` and the environments."""
    for name in DEFAULT_WORKLOADS:
        if (WORKLOADS_DIR / f"{name}.parquet").exists():
            return name
    return DEFAULT_WORKLOADS[-1]

"""Where the shipped data lives: the ``specgym.data`` package (``data/`` in a checkout), or ``$SPECGYM_DATA``.

The data travels inside the wheel, so an installed specgym finds its workloads, cost profiles, models and policies
without a checkout (``importlib.resources``). Commands that *write* shipped data (``make models``, ``make record``)
take explicit output paths under ``data/`` of the checkout instead.
Names are resolved to these folders' entries by :mod:`specgym.catalogue`, the one place that does.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path


def _data_dir() -> Path:
    env = os.environ.get("SPECGYM_DATA")
    return Path(env) if env else Path(str(files("specgym.data")))


DATA_DIR = _data_dir()
WORKLOADS_DIR = DATA_DIR / "workloads"
PROFILES_DIR = DATA_DIR / "profiles"
MODELS_DIR = DATA_DIR / "models"
POLICIES_DIR = DATA_DIR / "policies"
PREDICTORS_DIR = DATA_DIR / "predictors"
#: The shipped RL-Zoo-style training configurations (``training/configs/MODE.yaml``), read by training and by
#: the policy benchmark (for the default architecture).
TRAINING_CONFIGS_DIR = Path(str(files("specgym.training") / "configs"))

#: Folders where a model name in metadata (``models/midpair/target``) resolves: passed to the core's
#: :class:`~specgym.envs.core.acceptance_predictor.SignalSource`, which reads no catalogue itself.
MODEL_ROOTS = (DATA_DIR,)

#: Workloads in order of preference for commands run without ``--workload``: the recorded greedy trace of the
#: shipped model pair when present, else the synthetic SpecLane mix.
DEFAULT_WORKLOADS = ("midpair-greedy", "tinypair-greedy", "speclane-mix")


#: Shipped model pairs in order of preference for the live commands: the pair where speculation pays on a CPU,
#: else the small overhead-bound one.
DEFAULT_PAIRS = ("midpair", "tinypair")
#: What ``specgym generate`` runs without ``--controller`` or ``--k``.
DEFAULT_CONTROLLER = "fixed:4"
#: A shipped pair's recommended controllers for ``specgym generate``, best first: the first that runs at the
#: requested temperature is the default (a rule that fits itself needs the pair's recording at that temperature).
#: smollm2: drafter choice is its best live row, the head at K = 4 its best fixed K (docs/results/live-smollm2.md).
RECOMMENDED_CONTROLLERS: dict[str, tuple[str, ...]] = {"smollm2": ("drafter-marginal", "fixed:4@head")}


def default_pair_name() -> str:
    """The shipped model pair the live commands use without ``--draft``/``--target``."""
    for name in DEFAULT_PAIRS:
        if (MODELS_DIR / name / "target" / "config.json").exists():
            return name
    return DEFAULT_PAIRS[-1]


def pair_profile(pair: str) -> Path | None:
    """The measured CPU profile shipped with a pair (``cpu-<pair>.json``), if any."""
    path = PROFILES_DIR / f"cpu-{pair}.json"
    return path if path.exists() else None


def portable_name(path: str | Path) -> str:
    """How metadata names a file: ``models/tinypair/draft`` for shipped data (no machine-specific prefix), else the
    path as given (a hub name stays a hub name)."""
    p = Path(path)
    for mine, data in ((p.absolute(), DATA_DIR.absolute()), (p.resolve(), DATA_DIR.resolve())):
        try:  # as given first: in a link-tree install the file resolves outside the data folder
            return mine.relative_to(data).as_posix()
        except (ValueError, OSError):
            continue
    return str(path)


def default_workload_name() -> str:
    """The default workload of ``eval``, ``train``, ``demo`` and the environments."""
    for name in DEFAULT_WORKLOADS:
        if (WORKLOADS_DIR / f"{name}.parquet").exists():
            return name
    return DEFAULT_WORKLOADS[-1]

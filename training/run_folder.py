"""The run folder ``runs/NAME`` that ``specgym train`` writes, and how its files are saved and read.

::

    config.yaml            resolved hyperparameters + run identity (what reproduces the run)
    model.zip              latest model (each checkpoint, end of training, or the one written on Ctrl-C)
    vecnormalize.pkl       its VecNormalize statistics (observation and reward normalisation)
    best_model.zip         best model by validation speedup vs the best fixed K (+ best_vecnormalize.pkl)
    resume.pkl             the resume snapshot, taken between two rollouts on a cadence (training/snapshot.py)
    state.json             status (running / interrupted / complete), timesteps done and target; kept current at
                           every checkpoint and validation, so a run killed outright still says where it stood
    summary.json/.md       final validation figures and an honest verdict against the best fixed K
    tb/PPO_1/              tensorboard: SB3's scalars, specdec/* (training rollouts) and eval/* (validation)
    .specgym               the marker: what specgym owns here (``--force`` replaces nothing else)
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specgym.errors import SpecgymError
from specgym.io import atomic_path, atomic_write_text

#: What ``specgym train`` writes into a run folder (the marker's list; an exported ``policy/`` has its own marker).
RUN_FILES = ("config.yaml", "model.zip", "vecnormalize.pkl", "best_model.zip", "best_vecnormalize.pkl", "resume.pkl",
             "state.json", "summary.json", "summary.md", "tb/*")


@dataclass(frozen=True)
class RunFiles:
    """Paths inside a run folder."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def model(self) -> Path:
        return self.root / "model.zip"

    @property
    def vecnorm(self) -> Path:
        return self.root / "vecnormalize.pkl"

    @property
    def best_model(self) -> Path:
        return self.root / "best_model.zip"

    @property
    def best_vecnorm(self) -> Path:
        return self.root / "best_vecnormalize.pkl"

    @property
    def resume(self) -> Path:
        return self.root / "resume.pkl"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def summary_md(self) -> Path:
        return self.root / "summary.md"

    @property
    def tb(self) -> Path:
        return self.root / "tb"


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """A run file's JSON object; a truncated or damaged one is a one-line error naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecgymError(f"{path}: damaged {what} (not valid JSON: {exc}); the run's models are unaffected: "
                           f"delete this file and retry") from None
    except OSError as exc:
        raise SpecgymError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise SpecgymError(f"{path}: damaged {what} (expected a JSON object)")
    return data


def read_summary(run: RunFiles) -> dict[str, Any] | None:
    """The run's ``summary.json`` (None before the run finished)."""
    if not run.summary.is_file():
        return None
    return _read_json(run.summary, "run summary")


def read_state(run: RunFiles) -> dict[str, Any]:
    """The run's ``state.json`` (empty before the run started)."""
    return _read_json(run.state, "run state") if run.state.is_file() else {}


def has_model(run: RunFiles) -> bool:
    """The folder holds something to export or resume from (a model or a resume snapshot)."""
    return any(p.is_file() for p in (run.model, run.best_model, run.resume))


def load_model(path: Path, **kwargs: Any) -> Any:
    """``PPO.load`` of a run's model file; a truncated or foreign file is a one-line error naming it."""
    from stable_baselines3 import PPO

    try:
        return PPO.load(path, **kwargs)
    except Exception as exc:  # SB3 raises AssertionError, zipfile.BadZipFile, KeyError... for a damaged file
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecgymError(f"{path}: not a readable model (truncated or damaged: {why})") from None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON, atomically."""
    atomic_write_text(path, json.dumps(data, indent=1, default=float) + "\n", overwrite=True)


def save_checkpoint(model: Any, vecnorm: Any, model_path: Path, stats_path: Path) -> None:
    """Save a model and its VecNormalize statistics, each file atomically."""
    buf = io.BytesIO()
    model.save(buf)
    with atomic_path(model_path, overwrite=True) as tmp:
        tmp.write_bytes(buf.getvalue())
    with atomic_path(stats_path, overwrite=True) as tmp:
        vecnorm.save(str(tmp))


def load_vecnormalize(stats_path: Path, venv: Any) -> Any:
    """``VecNormalize.load`` of a run's statistics around ``venv`` (a clear error for a missing or foreign file)."""
    from stable_baselines3.common.vec_env import VecNormalize

    if not stats_path.is_file():
        raise SpecgymError(f"{stats_path}: missing (the run's VecNormalize statistics)")
    try:
        vec = VecNormalize.load(str(stats_path), venv)
    except Exception as exc:  # unpickling errors come in many types
        raise SpecgymError(f"{stats_path}: not VecNormalize statistics ({type(exc).__name__}: {exc})") from None
    if not isinstance(vec, VecNormalize):
        raise SpecgymError(f"{stats_path}: not VecNormalize statistics")
    return vec

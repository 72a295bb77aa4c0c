"""Resume snapshots of a PPO run (``resume.pkl``): everything that decides how training continues.

Resuming from ``model.zip`` alone does not continue the run it came from: SB3 re-seeds torch, numpy and the envs
with the run's seed on load (the resumed run replays the request sequence and the action noise of step 0), resets
the envs (new episodes, a stale last observation), drops VecNormalize's running discounted returns, and a checkpoint
written mid-rollout loses the rollout collected so far. A snapshot is taken between two rollouts (nothing collected
and not trained on) and holds:

* the SB3 model: weights, Adam state, ``num_timesteps``, ``_current_progress_remaining`` (the learning-rate
  schedule's position), the last observation and episode starts, the episode-info buffer;
* VecNormalize: observation and return statistics and the per-env discounted returns;
* the training envs themselves (current request and position, feature tracker, ``np_random``, monitor); shared
  workloads are stored by reference and trace engines as their constructor arguments (their caches are derived);
* the global RNG states of torch, numpy and ``random`` (action sampling, minibatch shuffles);
* the run state (validation history, last validation step, behaviour-cloning record).

Resuming from it continues exactly as the uninterrupted run would have (``tests/test_training.py``).
"""

from __future__ import annotations

import io
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.domains import DomainDistribution
from specgym.errors import SpecgymError
from specgym.io import atomic_path

SNAPSHOT_VERSION = 1


def shared_objects(workload: Any) -> list[Any]:
    """The objects a snapshot stores by reference (the run's workload, or its domain distribution and workloads).

    The same list is rebuilt from the run's config on resume, so index ``i`` names the same object both times.
    """
    if isinstance(workload, DomainDistribution):
        return [workload, *workload.workloads]
    return [workload]


class _Pickler(pickle.Pickler):
    def __init__(self, file: Any, shared: list[Any]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._ids = {id(o): str(i) for i, o in enumerate(shared)}

    def persistent_id(self, obj: Any) -> str | None:
        return self._ids.get(id(obj))

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is TraceEngine:  # rebuilt from its arguments: its outcome caches are a function of them
            return TraceEngine, (obj.workload, obj.profile, obj.k_max, obj.seed)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, shared: list[Any]):
        super().__init__(file)
        self._shared = shared

    def persistent_load(self, pid: Any) -> Any:
        return self._shared[int(pid)]


def _vecnorm_state(vec: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(vec).items() if k not in ("venv", "class_attributes")}


def save_snapshot(path: Path, model: Any, venv: Any, state: dict[str, Any], workload: Any) -> bytes:
    """Write the snapshot atomically; returns the model's bytes (also the run's ``model.zip``)."""
    import torch

    buf = io.BytesIO()
    model.save(buf)
    model_bytes = buf.getvalue()
    doc = {
        "version": SNAPSHOT_VERSION,
        "timesteps": int(model.num_timesteps),
        "model": model_bytes,
        "vecnormalize": _vecnorm_state(venv),
        "envs": venv.venv.envs,
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()},
        "state": state,
    }
    out = io.BytesIO()
    _Pickler(out, shared_objects(workload)).dump(doc)
    with atomic_path(path, overwrite=True) as tmp:
        tmp.write_bytes(out.getvalue())
    return model_bytes


def load_snapshot(path: Path, venv: Any, workload: Any, tb_dir: Path) -> tuple[Any, dict[str, Any]]:
    """Restore a snapshot into the freshly built training env ``venv``; returns ``(model, run state)``.

    Raises:
        SpecgymError: A file that is not a snapshot of this specgym, or of another run's envs.
    """
    import torch
    from stable_baselines3 import PPO

    try:
        with open(path, "rb") as f:
            doc = _Unpickler(f, shared_objects(workload)).load()
        if doc.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"snapshot version {doc.get('version')!r}")
        envs = list(doc["envs"])
        if len(envs) != len(venv.venv.envs):
            raise ValueError(f"{len(envs)} envs, the run's config has {len(venv.venv.envs)}")
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, IndexError, KeyError, TypeError,
            ValueError) as exc:
        raise SpecgymError(f"{path}: not a usable resume snapshot ({type(exc).__name__}: {exc})") from None
    venv.venv.envs[:] = envs
    vars(venv).update(doc["vecnormalize"])
    model = PPO.load(io.BytesIO(doc["model"]), env=venv, device="cpu", tensorboard_log=str(tb_dir),
                     force_reset=False)
    rng = doc["rng"]  # after load: PPO.load re-seeds every generator with the run's seed
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["random"])
    return model, dict(doc["state"])

"""One PPO training run as an object: its folder, configuration, training data, state and acceptance predictor.

:class:`TrainingRun` is what ``specgym train`` passes around instead of five loose arguments: the env factory, the
callbacks, behaviour cloning and the summary read the run's predictor from it (loaded once per run, checked against
the checksum the run started with) and update its typed :class:`RunState`, which is what ``state.json`` and the
resume snapshot hold.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import specgym.catalogue as catalogue
from specgym.envs.core.acceptance_predictor import AcceptancePredictor, load_predictor
from specgym.errors import SpecgymError
from specgym.training.config import RunConfig
from specgym.training.run_folder import RunFiles, read_state, write_json

#: Run statuses ``state.json`` may hold.
STATUSES = ("running", "interrupted", "complete", "failed")


def load_run_predictor(cfg: RunConfig) -> AcceptancePredictor | None:
    """The acceptance predictor a run's token-mode observations read (config key ``predictor``), or ``None``; the
    very one the run started with (its checksum is in the run config), else a one-line error."""
    if cfg.ppo.predictor is None:
        return None
    path = catalogue.resolve("predictor", cfg.ppo.predictor)
    pred = load_predictor(path)
    sha = pred.to_dict()["sha256"]
    if cfg.predictor_sha256 is not None and sha != cfg.predictor_sha256:
        raise SpecgymError(f"{path}: acceptance predictor changed since the run started (sha256 {sha[:12]}, the run "
                           f"used {cfg.predictor_sha256[:12]}): restore that file or train a new run")
    return pred


@dataclass
class RunState:
    """Where a run stands: ``state.json`` (kept current at every checkpoint and validation) and the snapshot's copy.

    Attributes:
        status: ``running``, ``interrupted``, ``complete`` or ``failed``.
        timesteps_done: Timesteps trained so far (at the last checkpoint while running).
        timesteps_target: The timesteps the run was asked for.
        checkpoint_timesteps: Timesteps of the last checkpoint (``model.zip`` + resume snapshot).
        config_sha256: Checksum of ``config.yaml`` when the run started (``--resume`` refuses an edited one).
        best: The best validation so far (``timesteps`` and the figures it was kept by); its model is
            ``best_model.zip``.
        val_history: Every validation: ``timesteps``, ``speedup_vs_best_fixed`` and the key figure.
        last_eval_step: Timesteps of the last validation.
        bc_init: The behaviour-cloning record (spec, samples, accuracy, seconds).
        steps_per_s: Training speed of the last session.
        wall_s: Seconds trained over all sessions.
        error: What failed the run (status ``failed``).
        extra: Keys of a ``state.json`` this version does not know (kept, never dropped).
    """

    status: str = "running"
    timesteps_done: int = 0
    timesteps_target: int | None = None
    checkpoint_timesteps: int | None = None
    config_sha256: str | None = None
    best: dict[str, Any] | None = None
    val_history: list[dict[str, Any]] = field(default_factory=list)
    last_eval_step: int | None = None
    bc_init: dict[str, Any] | None = None
    steps_per_s: float | None = None
    wall_s: float = 0.0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (fields not yet known are left out, as ``state.json`` always had them)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**self.extra, **{k: v for k, v in out.items() if v is not None}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "run state") -> RunState:
        """Read the JSON form; a field of the wrong type is a one-line error naming ``where`` and the field."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names and v is not None}
        checks: dict[str, tuple[type, ...]] = {
            "status": (str,), "timesteps_done": (int,), "timesteps_target": (int,), "checkpoint_timesteps": (int,),
            "config_sha256": (str,), "best": (dict,), "val_history": (list,), "last_eval_step": (int,),
            "bc_init": (dict,), "steps_per_s": (int, float), "wall_s": (int, float), "error": (str,)}
        for key, value in known.items():
            if not isinstance(value, checks[key]) or isinstance(value, bool):
                raise SpecgymError(f"{where}: field {key!r} has a bad value {value!r}")
        if known.get("status", "running") not in STATUSES:
            raise SpecgymError(f"{where}: field 'status' must be one of {STATUSES}, got {known['status']!r}")
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})


@dataclass
class TrainingRun:
    """A training run: what ``specgym train`` builds once and every step of the run reads.

    Attributes:
        files: The run folder.
        config: The run's configuration (``config.yaml``).
        workload: The training workload, or the domain distribution of a generalist run.
        state: Where the run stands (written to ``state.json`` by :meth:`save_state`).
    """

    files: RunFiles
    config: RunConfig
    workload: Any
    state: RunState = field(default_factory=RunState)

    @cached_property
    def fit_workload(self) -> Any:
        """What the policy learns from (its episodes, its behaviour cloning): the workload, or, where it fits on val
        (:attr:`Workload.fit_split`), val's fit rows of :meth:`Workload.learning_requests` only, so the
        validation that keeps the best model never scores requests the policy trained on."""
        wl = self.workload
        if not hasattr(wl, "learning_requests") or wl.fit_split == "train":
            return wl  # a domain distribution, or train to learn from and val to choose on
        return wl.subset(wl.learning_requests()[0])

    @cached_property
    def select_workload(self) -> Any:
        """What the best model is chosen on (its ``val`` split): the workload, or, where it fits on val, val's
        choice rows of :meth:`Workload.learning_requests` (disjoint from :attr:`fit_workload`)."""
        wl = self.workload
        if not hasattr(wl, "learning_requests") or wl.fit_split == "train":
            return wl
        return wl.subset(wl.learning_requests()[1])

    @cached_property
    def predictor(self) -> AcceptancePredictor | None:
        """The run's acceptance predictor (:func:`load_run_predictor`), loaded on first use and once per run."""
        return load_run_predictor(self.config)

    def save_state(self) -> None:
        """Write :attr:`state` to ``state.json`` (atomically)."""
        write_json(self.files.state, self.state.to_dict())


def read_run_state(files: RunFiles) -> RunState:
    """The run's ``state.json`` as a :class:`RunState` (a fresh one before the run started)."""
    return RunState.from_dict(read_state(files), str(files.state))


"""PPO training of speculation-length policies (``specgym train``), with stable-baselines3.

A run lives in one folder (:mod:`specgym.training.run_folder`); its configuration is resolved from the RL-Zoo-style
YAML files (:mod:`specgym.training.config`); the vectorised env is SB3's ``make_vec_env`` in ``VecNormalize``
(:mod:`specgym.training.env_factory`) with the reward wrappers of :mod:`specgym.training.rewards`; the callbacks
(:mod:`specgym.training.callbacks`) log ``specdec/*`` and ``eval/*`` to tensorboard, validate on the val split and
keep the best model.
The run itself is one :class:`~specgym.training.run.TrainingRun` (folder, config, workload, typed state, and the
acceptance predictor, loaded once) that all of them read.

Choices (documented here because they shape results):

* Reward: ``token_value * produced - time / t_AR`` (see :mod:`specgym.training.rewards`); the optimum is the env's.
* Observations and rewards are normalised by ``VecNormalize`` (gamma-discounted return scaling); the statistics are
  saved with every model and exported.
* Behaviour-cloning initialisation (``bc_init``, ``specgym train --init-from SPEC``): the actor is first cloned from a
  baseline's decisions on the train split, the critic is warmed up with the actor frozen (``bc_warmup`` steps), then
  PPO fine-tunes; the clone is validated before PPO starts (:mod:`specgym.training.bc_init`).
* The learning-rate schedule ``linear`` decays to 0 at the target and is clamped there; the run stops at exactly the
  target timesteps (the unfinished last rollout is not trained on).
* Training draws requests from the ``train`` split; validation uses ``val``; reports use ``test``.
* Crash safety: between two rollouts, every ``checkpoint_every_s`` seconds (and before the last rollout), the run
  writes a resume snapshot, ``model.zip`` and ``state.json`` (:class:`~specgym.training.callbacks.CheckpointCallback`).
  ``--resume`` continues from the snapshot exactly as the uninterrupted run would have
  (:mod:`specgym.training.snapshot`); what was trained after it is redone, identically.
* ``torch.set_num_threads(1)``: the networks are tiny and the machine is shared.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import specgym.catalogue as catalogue
from specgym.agents.modes import MODES, get_mode
from specgym.console import make_console
from specgym.envs.core.acceptance_predictor import SignalSource
from specgym.envs.core.kinds import kind_row
from specgym.envs.workloads.domains import TRAIN_RECORDED, generalist_domains
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError
from specgym.io import atomic_write_text, check_output, make_owned_dir, remove_owned, sha256_file
from specgym.paths import MODEL_ROOTS, WORKLOADS_DIR
from specgym.training.bc_init import alloc_demonstrations, clone_into, demonstrations
from specgym.training.config import PPOConfig, RunConfig, resolve_config
from specgym.training.env_factory import make_env_fn, make_training_env, training_distribution
from specgym.training.rewards import auto_token_value
from specgym.training.run import RunState, TrainingRun, read_run_state
from specgym.training.run_folder import (
    RUN_FILES,
    RunFiles,
    has_model,
    load_model,
    read_summary,
    save_checkpoint,
    write_json,
)
from specgym.training.snapshot import load_snapshot
from specgym.training.summary import summarize
from specgym.training.validation import make_validator


def linear_schedule(lr: float):
    """SB3 learning-rate schedule ``lr * progress_remaining``, clamped at 0 (SB3 may step past the end)."""
    def schedule(progress_remaining: float) -> float:
        return lr * max(progress_remaining, 0.0)

    return schedule


def build_model(ppo: PPOConfig, venv: Any, seed: int, tb_dir: Path):
    """A fresh SB3 PPO model with the run's hyperparameters."""
    import torch.nn as nn
    from stable_baselines3 import PPO

    lr = ppo.learning_rate
    arch = list(ppo.net_arch)
    return PPO(
        "MlpPolicy", venv, learning_rate=linear_schedule(lr) if ppo.lr_schedule == "linear" else lr,
        n_steps=ppo.n_steps, batch_size=ppo.batch_size, n_epochs=ppo.n_epochs, gamma=ppo.gamma,
        gae_lambda=ppo.gae_lambda, clip_range=ppo.clip_range, ent_coef=ppo.ent_coef, vf_coef=ppo.vf_coef,
        max_grad_norm=ppo.max_grad_norm,
        policy_kwargs={"net_arch": {"pi": arch, "vf": arch},
                       "activation_fn": nn.Tanh if ppo.activation == "tanh" else nn.ReLU},
        tensorboard_log=str(tb_dir), seed=seed, device="cpu", verbose=0,
    )


@dataclass
class TrainRequest:
    """What ``specgym train`` was asked to do."""

    workload: str
    mode: str
    out: Path
    timesteps: int | None = None
    seed: int = 0
    config_file: str | None = None
    overrides: dict[str, Any] | None = None
    resume: bool = False
    force: bool = False
    quiet: bool = False
    checkpoint_every_s: float = 30.0


def workload_identity(name_or_path: str) -> tuple[Any, dict[str, Any]]:
    """The loaded workload and what identifies it in a run config (a shipped workload is stored by name)."""
    path = catalogue.resolve("workload", name_or_path)
    wl = cached_workload(path)
    shipped = path.resolve().parent == WORKLOADS_DIR.resolve()
    return wl, {"workload_name": wl.name, "workload_path": path.stem if shipped else str(path.resolve()),
                "workload_sha256": sha256_file(path), "workload_synthetic": bool(wl.is_synthetic)}


def domain_identity() -> tuple[Any, dict[str, Any]]:
    """The generalist training distribution and what identifies it (its recorded workloads' hashes)."""
    h = hashlib.sha256()
    for name in TRAIN_RECORDED:
        if name in catalogue.names("workload"):
            h.update(sha256_file(catalogue.resolve("workload", name)).encode())
    return generalist_domains(), {"workload_name": "generalist", "workload_path": "generalist",
                                  "workload_sha256": h.hexdigest(), "workload_synthetic": False}


def _new_run(req: TrainRequest, run: RunFiles) -> TrainingRun:
    check_output(run.root, req.force, hint="pass --force to replace it, --resume to continue" if has_model(run)
                 else "pass --force to replace it; it holds no model to resume")
    overrides = req.overrides or {}
    if overrides.get("domains"):
        wl, ident = domain_identity()
        ppo = resolve_config(req.mode, "generalist", req.config_file, overrides)
    else:
        wl, ident = workload_identity(req.workload)
        drafters = tuple(getattr(wl, "drafter_names", ()))
        # before any cost check that would blame the profile
        if kind_row(get_mode(req.mode).kind).chooses_drafter and len(drafters) < 2:
            one = drafters[0] if drafters else "draft"
            raise SpecgymError(f"--mode drafter: workload {wl.name!r} holds one drafter ({one}); drafter choice "
                               f"needs two (e.g. an imported SpecDecode-Bench file)")
        ppo = resolve_config(req.mode, wl.name, req.config_file, overrides)  # bad input fails before rmtree
    if ppo.drafter is not None and get_mode(req.mode).action != "tree_widths":
        raise SpecgymError(f"--hyperparams drafter={ppo.drafter}: only --mode tree names who drafts (its trees); "
                           f"this run is --mode {req.mode}")
    if req.timesteps is not None:
        ppo.timesteps = int(req.timesteps)
        ppo.validate("--timesteps")
    if ppo.domains:
        token_value, note = 1.0, "per episode: 1/speedup of the model-optimal fixed K of the episode's domain"
    elif ppo.token_value == "auto":
        tv, bk = auto_token_value(wl, ppo.k_max, drafter=ppo.drafter)
        of = f" of the {ppo.drafter}" if ppo.drafter else ""
        token_value, note = round(tv, 6), (f"auto: 1/speedup of best fixed K={bk}{of} on the rows it learns from "
                                           f"({wl.fit_split} split)")
    else:
        token_value, note = float(ppo.token_value), ""
    cfg = RunConfig(ppo=ppo, mode=req.mode, seed=int(req.seed), token_value_resolved=token_value,
                    token_value_note=note, **ident)
    training = TrainingRun(run, cfg, wl)
    pred = training.predictor  # loaded here, once: the run's envs, validations and summary share it
    if pred is not None:
        if not get_mode(cfg.mode).predictor:
            readers = " and ".join(f"--mode {m.name}" for m in MODES.values() if m.predictor)
            raise SpecgymError(f"--hyperparams predictor={ppo.predictor}: only {readers} read an acceptance "
                               f"predictor (this run is --mode {cfg.mode})")
        for w in getattr(wl, "workloads", None) or [wl]:  # the policy learns from its outputs: no fallback
            pred.for_source(SignalSource.of_workload(w, MODEL_ROOTS), strict=True)
        cfg.predictor_sha256 = pred.to_dict()["sha256"]
    if run.root.exists():
        remove_owned(run.root)
    make_owned_dir(run.root, "specgym train", RUN_FILES)
    text = cfg.to_yaml()
    try:
        atomic_write_text(run.config, text)
    except SpecgymError as exc:  # a full disk: no run folder without its config
        remove_owned(run.root)
        raise SpecgymError(f"{exc}; {run.root} was removed") from None
    training.state = RunState(status="running", timesteps_done=0,
                              config_sha256=hashlib.sha256(text.encode()).hexdigest())
    return training


def _check_config_unchanged(run: RunFiles, state: RunState) -> None:
    """A resumed run continues the configuration it started with (its snapshot holds the model, optimiser and
    schedule built from it): an edited ``config.yaml`` is refused, not silently ignored."""
    want = state.config_sha256
    if want is not None and sha256_file(run.config) != want:
        raise SpecgymError(f"{run.config}: edited since the run started; --resume continues the run as it was "
                           f"configured (restore the file, or start a new run: specgym train --config FILE --out NEW)")


def _resumed_run(req: TrainRequest, run: RunFiles) -> TrainingRun:
    if not run.config.is_file() or not (run.resume.is_file() or run.model.is_file()):
        raise SpecgymError(f"{run.root}: nothing to resume (needs config.yaml and resume.pkl or model.zip)")
    cfg = RunConfig.from_file(run.config)
    wl, ident = domain_identity() if cfg.ppo.domains else workload_identity(cfg.workload_path)
    if ident["workload_sha256"] != cfg.workload_sha256:
        raise SpecgymError(f"{cfg.workload_path}: workload changed since the run started (sha256 differs)")
    state = read_run_state(run)
    _check_config_unchanged(run, state)
    if req.timesteps is not None:
        cfg.ppo.timesteps = int(req.timesteps)
        cfg.ppo.validate("--timesteps")
    else:  # a plain --resume continues to the last target asked (an extension's, not the config's first one)
        cfg.ppo.timesteps = max(int(cfg.ppo.timesteps), int(state.timesteps_target or 0))
    _check_resume_target(run, state, int(cfg.ppo.timesteps), req.timesteps is not None)
    return TrainingRun(run, cfg, wl, state)


class RunComplete(Exception):
    """``--resume`` of a run that already reached its target: nothing to train (the message says where it stands)."""


def _check_resume_target(run: RunFiles, state: RunState, target: int, asked: bool) -> None:
    """A resumed run only grows: a complete run at or past ``target`` has nothing to do (:class:`RunComplete`), and a
    target below the checkpoint the run would continue from is refused (it cannot be shortened), before anything in
    the folder changes."""
    done = int(state.timesteps_done)
    if state.status == "complete" and target <= done:
        past = f", past --timesteps {target:,}" if asked and target < done else ""
        raise RunComplete(f"{run.root}: complete at {done:,} timesteps{past}; nothing to resume ('specgym train --out "
                          f"{run.root} --resume --timesteps N' with N above {done:,} extends it)")
    start = state.checkpoint_timesteps if run.resume.is_file() and state.checkpoint_timesteps is not None else done
    if target < start:
        raise SpecgymError(f"--timesteps {target:,} is below the checkpoint at {start:,} timesteps in {run.root}: "
                           f"--resume continues a run, it cannot shorten it (give --timesteps above {start:,}, or "
                           f"train a new run with another --out)")


def train(req: TrainRequest, console: Any = None) -> dict[str, Any]:
    """Train (or resume) a PPO run; returns the summary dict (also written to ``summary.json``/``summary.md``).

    Raises:
        SpecgymError: Existing run folder without ``--force``/``--resume``, nothing to resume, bad config.
    """
    import torch

    console = console or make_console(stderr=True, quiet=req.quiet)
    torch.set_num_threads(1)
    run = RunFiles(Path(req.out))
    if req.resume and req.force:
        raise SpecgymError("--resume and --force exclude each other")
    try:
        training = _resumed_run(req, run) if req.resume else _new_run(req, run)
    except RunComplete as done:
        console.print(str(done), highlight=False)
        return read_summary(run) or {}
    try:
        return _train(req, training, console)
    except BaseException as exc:
        raise _failed(run, training.state, exc, new=not req.resume) from None


def _failed(run: RunFiles, state: RunState, exc: BaseException, new: bool) -> BaseException:
    """What a failed run leaves: a new run with no model yet is removed whole (a full disk leaves no half-written
    folder); otherwise the folder keeps its last checkpoint and says so. Returns the exception to raise."""
    if isinstance(exc, KeyboardInterrupt) and has_model(run):
        return exc  # the interrupt handler saved the model and said how to resume
    if new and not has_model(run):
        try:
            remove_owned(run.root)
        except SpecgymError:
            pass  # a file of the user's was put in it meanwhile: the folder stays
        else:
            if isinstance(exc, (SpecgymError, OSError)):
                return SpecgymError(f"{_message(exc)}; nothing was trained to keep: {run.root} was removed")
        return exc
    if not isinstance(exc, (SpecgymError, OSError)):
        return exc
    try:
        write_json(run.state, dataclasses.replace(state, status="failed", error=_message(exc)).to_dict())
    except (SpecgymError, OSError):
        pass  # the disk that failed the run may refuse this too: state.json then says where the run last stood
    if _message(exc).startswith(f"{run.resume}: not a usable resume snapshot"):  # resuming again fails the same way
        return SpecgymError(f"{_message(exc)}; move it away (mv {run.resume} {run.resume}.damaged): 'specgym train "
                            f"--out {run.root} --resume' then continues from {run.model.name} alone")
    return SpecgymError(f"{_message(exc)}; {run.root} keeps its last checkpoint: 'specgym train --out {run.root} "
                        f"--resume' continues from it")


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, SpecgymError):
        return f"{exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror or exc}"
    return str(exc)


def _train(req: TrainRequest, training: TrainingRun, console: Any) -> dict[str, Any]:
    """The body of :func:`train` once the run folder exists."""
    from stable_baselines3.common.callbacks import CallbackList

    from specgym.training.callbacks import (
        CheckpointCallback,
        CriticWarmupCallback,
        ProgressCallback,
        SpecDecMetricsCallback,
        ValidationCallback,
    )

    run, cfg, wl = training.files, training.config, training.workload
    ppo = cfg.ppo
    target = int(ppo.timesteps)
    training.state.status, training.state.timesteps_target = "running", target
    training.save_state()
    model, venv, resumed_at = _start_model(req, training, target, console)
    start = int(model.num_timesteps)
    if target < start:  # state.json said otherwise (lost or restored): the model itself is the authority
        raise SpecgymError(f"--timesteps {target:,} is below the checkpoint at {start:,} timesteps in {run.root}: "
                           f"--resume continues a run, it cannot shorten it")
    # validate the cloned policy before PPO starts: the kept best model is never worse (on val) than the clone
    validator, key = make_validator(cfg, training.select_workload)  # never the rows it learns from
    val = ValidationCallback(training, validator, key, console,
                             at_start=bool(ppo.bc_init) and start == 0 and ppo.eval_freq > 0 and not req.resume)
    progress = ProgressCallback(target, start, console)
    checkpoint = CheckpointCallback(training, target, ppo.n_envs * ppo.n_steps, req.checkpoint_every_s,
                                    done=resumed_at)
    cbs = [SpecDecMetricsCallback(), val, checkpoint, progress]
    if ppo.bc_init and ppo.bc_warmup > start:
        cbs.append(CriticWarmupCallback(ppo.bc_warmup))
    label = (f"the generalist distribution ({len(wl.workloads)} workloads x randomised profiles)" if ppo.domains
             else wl.label)
    where = f"{wl.fit_split} split" if ppo.domains or wl.fit_split == "train" else \
        (f"val split: {training.fit_workload.n_requests} requests to learn from, "
         f"{training.select_workload.n_requests} to choose the best model on")
    console.print(f"[bold]specgym train[/bold] {cfg.mode} mode on {label} ({where}): "
                  f"{start:,} -> {target:,} timesteps, n_envs {ppo.n_envs}, token_value "
                  f"{cfg.token_value_resolved:.3f}; run folder {run.root}", highlight=False)
    t0 = time.perf_counter()
    interrupted = False
    try:
        if target > start:
            model.learn(total_timesteps=target - start, callback=CallbackList(cbs),
                        reset_num_timesteps=not req.resume, tb_log_name="PPO", progress_bar=False)
    except KeyboardInterrupt:
        interrupted = True
        if progress.bar is not None:
            progress.bar.stop()
    _record_session(training, model, venv, start, time.perf_counter() - t0, interrupted, console)
    done = int(model.num_timesteps)
    if val.freq > 0 and done > start and val.last != done:
        val.num_timesteps = done
        val.evaluate_now()
    # a validation inside the last (stopped) rollout is recorded but SB3 never dumps it: write it to tensorboard
    if done > start:  # SB3 sets the logger up in learn(): a session that trained nothing has none to dump
        model.logger.dump(done)
    training.state.status = "complete"
    training.save_state()
    return summarize(training, validator, key, console)


def _start_model(req: TrainRequest, training: TrainingRun, target: int, console: Any) -> tuple[Any, Any, int | None]:
    """The model to train and its env, and the timestep of the resume snapshot it continues (None without one).

    ``--resume`` continues from the snapshot exactly (the run's state becomes the snapshot's history up to its step),
    or, in a run folder from before resume snapshots, from ``model.zip`` alone; a new run builds a fresh model,
    behaviour-cloned first when the config names a teacher (``bc_init``).
    """
    run, cfg, state = training.files, training.config, training.state
    seed = int(cfg.seed)
    if req.resume and run.resume.is_file():
        venv = make_training_env(training, seed)
        model, snap_dict = load_snapshot(run.resume, venv, training.workload, run.tb)
        snap = RunState.from_dict(snap_dict, f"{run.resume} (run state)")
        _check_config_unchanged(run, snap)  # the snapshot's own record (state.json may have been lost)
        # the snapshot's history up to its step (what follows is redone, identically); the best model on disk
        # and its figures stay what state.json says, so a redone validation never replaces it by an equal one
        training.state = dataclasses.replace(
            snap, best=state.best if state.best is not None else snap.best, wall_s=state.wall_s, status="running",
            timesteps_target=target)
        return model, venv, int(model.num_timesteps)
    if req.resume:  # a run folder from before resume snapshots: the model alone (not an exact continuation)
        console.print(f"{run.resume}: missing; continuing from {run.model} alone (RNG, env and return-normalisation "
                      "state start afresh)", style="yellow", highlight=False)
        venv = make_training_env(training, seed + int(state.timesteps_done), run.vecnorm)
        return load_model(run.model, env=venv, device="cpu", tensorboard_log=str(run.tb)), venv, None
    venv = make_training_env(training, seed)
    model = build_model(cfg.ppo, venv, seed, run.tb)
    if cfg.ppo.bc_init:
        _behaviour_clone(training, model, venv, cfg.ppo.bc_init, console)
    return model, venv, None


def _behaviour_clone(training: TrainingRun, model: Any, venv: Any, teacher: str, console: Any) -> None:
    """Clone the new model's actor from the decisions of its ``teacher`` (the config's ``bc_init``) and record how
    well it fits."""
    cfg, ppo, seed = training.config, training.config.ppo, int(training.config.seed)
    t_bc = time.perf_counter()
    if MODES[cfg.mode].env_demonstrations:  # the teacher is the budget rule the policy calibrates
        obs, labels = alloc_demonstrations(teacher, make_env_fn(training), ppo.bc_passes, seed)
    else:
        obs, labels = demonstrations(teacher, training_distribution(cfg, training.fit_workload), cfg.mode, ppo.k_min,
                                     ppo.k_max, passes=ppo.bc_passes, seed=seed, predictor=training.predictor)
    bc = clone_into(model, venv, obs, labels, epochs=ppo.bc_epochs, seed=seed)
    bc["seconds"] = round(time.perf_counter() - t_bc, 1)
    training.state.bc_init = {"spec": teacher, **bc}
    console.print(f"behaviour cloning from {teacher}: {bc['samples']:,} decisions, train accuracy "
                  f"{bc['accuracy']:.4f} ({bc['seconds']:.1f} s)", highlight=False)


def _record_session(training: TrainingRun, model: Any, venv: Any, start: int, wall: float, interrupted: bool,
                    console: Any) -> None:
    """Save the model where the session stopped and add the session to the run's state; an interrupted session
    then says how to resume and raises ``KeyboardInterrupt``."""
    run, state = training.files, training.state
    save_checkpoint(model, venv, run.model, run.vecnorm)
    done = int(model.num_timesteps)
    steps_per_s = (done - start) / wall if wall > 0 else 0.0
    state.timesteps_done, state.steps_per_s, state.wall_s = done, steps_per_s, state.wall_s + wall
    if interrupted:
        state.status = "interrupted"
        training.save_state()
        console.print(f"interrupted at {done:,} timesteps: model saved to {run.model}; 'specgym train --out "
                      f"{run.root} --resume' continues from the checkpoint at "
                      f"{state.checkpoint_timesteps or 0:,} timesteps", highlight=False)
        raise KeyboardInterrupt

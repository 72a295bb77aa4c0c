"""Export a trained SB3 PPO run to a self-contained, pickle-free policy artifact (``policy.npz`` + ``policy.json``).

What is exported: the actor path of the SB3 ``MlpPolicy`` (``mlp_extractor.policy_net`` then ``action_net``; the
feature extractor of a Box observation is a flatten, i.e. the identity) and the observation statistics of the run's
``VecNormalize``. The critic is not needed to act and is dropped. The runtime side is
:class:`specgym.agents.policy_controller.PolicyController` (numpy only).

This module imports torch and stable-baselines3 (the ``train`` extra); loading the artifact does not.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specgym.agents.artifact import PolicyArtifact, write_artifact
from specgym.agents.modes import get_mode
from specgym.envs.core.acceptance_predictor import AcceptancePredictor
from specgym.envs.gym.tree_env import DEFAULT_SHAPES
from specgym.errors import SpecgymError
from specgym.io import check_output
from specgym.training.config import RunConfig
from specgym.training.env_factory import SpacesOnlyEnv
from specgym.training.feature_ranges import vecnorm_range
from specgym.training.run import load_run_predictor
from specgym.training.run_folder import RunFiles, load_model, load_vecnormalize, read_state, read_summary
from specgym.training.sb3_actor import actor_layers

#: The validation figures (``speedup_vs_X``) of the rules a policy hands its decisions to, or calibrates (its
#: teacher), or replaces (``eagle-head``: EAGLE-2 fitted on the head's trees, what a tree policy on the head is
#: compared with): a policy below one of them, or below its mode's fixed reference (``speedup_vs_best_fixed``: the best
#: fixed K, batch: the best static K), is exported only with ``force``.
TEACHER_FIGURES = {**{t: f"its teacher {t}" for t in ("marginal", "planned", "goodput", "drafter-marginal", "budget")},
                   "eagle-head": "the rule it replaces, tree-eagle:fit@head"}


def below_verdict(metrics: Mapping[str, Any] | None, mode: str) -> str | None:
    """What a policy's validation figures put it below (its mode's fixed reference, its teacher), or None: at or
    above both, or no figures (a run that never validated)."""
    below = []
    for key, what in (("best_fixed", get_mode(mode).reference), *TEACHER_FIGURES.items()):
        x = (metrics or {}).get(f"speedup_vs_{key}")
        if isinstance(x, (int, float)) and x < 1.0:
            below.append(f"{what} ({x:.3f}x)")
    return "BELOW " + " and ".join(below) if below else None


def check_deployable(metrics: Mapping[str, Any] | None, mode: str, what: str, force: bool) -> str | None:
    """Refuse to export a policy its validation found below its fixed reference or its teacher (what training's
    summary tells not to deploy); with ``force``, say so on stderr and return the warning the export carries (None:
    not below).

    Args:
        metrics: The policy's validation figures (``summary.json``'s, or an exported ``policy.json``'s ``metrics``).
        mode: Its policy mode.
        what: How the messages name it (the run folder and model).
        force: Export it anyway, with the warning.
    """
    verdict = below_verdict(metrics, mode)
    if verdict is None:
        return None
    if not force:
        raise SpecgymError(f"{what}: its validation puts it {verdict}, so it is not exported (do not deploy it); "
                           f"train longer or tune it, or pass --force to export it anyway (the export then carries "
                           f"this warning)")
    warning = f"{what} is {verdict} on validation: exported with --force; do not deploy it"
    print(f"warning: {warning}", file=sys.stderr)
    return warning


def run_metrics(run: RunFiles, picked: str) -> dict[str, Any] | None:
    """The validation figures of a run's ``picked`` model (``best``/``final``): the full-split ones of
    ``summary.json`` when it describes the run as it is now, else (an unfinished run) the figures the best model was
    kept by in ``state.json`` (None: the final model of an unfinished run, which no validation describes)."""
    summary, state = read_summary(run), read_state(run)
    if summary is not None and summary.get("timesteps") == state.get("timesteps_done"):
        figures = (summary.get("val_all") or {}).get(picked)
        if figures is None and summary.get("model") == picked:
            figures = summary.get("val")
        if isinstance(figures, dict):
            return figures
    best = state.get("best")
    return best if picked == "best" and isinstance(best, dict) else None


def artifact_from_model(model: Any, vecnorm: Any | None, mode: str, k_min: int, k_max: int,
                        meta: dict[str, Any] | None = None, predictor: Any = None,
                        drafter: str | None = None, shapes: list | None = None) -> PolicyArtifact:
    """Build a :class:`PolicyArtifact` from an in-memory SB3 PPO model and its ``VecNormalize`` (or None).

    Args:
        model: ``stable_baselines3.PPO`` with an ``MlpPolicy``.
        vecnorm: The ``VecNormalize`` the model was trained under (None if observations were not normalised).
        mode: A policy mode (:data:`~specgym.agents.modes.MODES`).
        k_min, k_max: The K range of the env (action ``a`` in K mode means ``K = k_min + a``).
        meta: Training record stored in ``policy.json``.
        predictor: The acceptance predictor the observations were computed with (embedded in the artifact).
        drafter: Tree mode: who drafted the trees it learned on (``None`` the draft model, ``head``).
        shapes: Tree mode: its action menu (``None``: the tree env's default one).
    """
    layers, acts = actor_layers(model)
    if acts - {"Tanh", "ReLU"} or len(acts) > 1:
        raise SpecgymError(f"cannot export activations {sorted(acts)} (supported: Tanh, ReLU)")
    activation = "relu" if acts == {"ReLU"} else "tanh"
    weights = [lin.weight.detach().cpu().numpy().astype(np.float32).copy() for lin in layers]
    biases = [lin.bias.detach().cpu().numpy().astype(np.float32).copy() for lin in layers]
    mean = var = None
    clip_obs, eps = 10.0, 1e-8
    if vecnorm is not None and vecnorm.norm_obs:
        mean = np.asarray(vecnorm.obs_rms.mean, np.float64).copy()
        var = np.asarray(vecnorm.obs_rms.var, np.float64).copy()
        clip_obs, eps = float(vecnorm.clip_obs), float(vecnorm.epsilon)
    row = get_mode(mode)
    # a tree menu: the run's (its config's `shapes`), else the tree env's default one
    menu = [e if isinstance(e, str) else list(e) for e in (shapes or DEFAULT_SHAPES)] \
        if row.action == "tree_widths" else []
    # the guard of a chain, drafter or batch policy: the range it saw in training and the rule that decides outside it
    seen = vecnorm_range(vecnorm) if row.guarded else None
    teacher = None if seen is None else row.teacher or \
        ("planned" if predictor is not None and predictor.continuation else "marginal")
    art = PolicyArtifact(mode=mode, k_min=k_min, k_max=k_max, weights=weights, biases=biases, activation=activation,
                         obs_mean=mean, obs_var=var, clip_obs=clip_obs, epsilon=eps,
                         feature_version=row.feature_version, features=row.features(row.feature_version),
                         predictor=None if predictor is None else predictor.to_dict(), meta=dict(meta or {}),
                         shapes=menu, obs_low=None if seen is None else seen[0],
                         obs_high=None if seen is None else seen[1], teacher=teacher, drafter=drafter)
    art.validate()
    return art


def run_artifact(model: Any, vecnorm: Any | None, cfg: RunConfig, predictor: AcceptancePredictor | None,
                 meta: dict[str, Any] | None = None) -> PolicyArtifact:
    """:func:`artifact_from_model` for a run: its mode, K range and acceptance predictor (``predictor``: the run's,
    already loaded: :attr:`~specgym.training.run.TrainingRun.predictor` or
    :func:`~specgym.training.run.load_run_predictor`), so validation, the summary and export price the same policy."""
    return artifact_from_model(model, vecnorm, cfg.mode, cfg.ppo.k_min, cfg.ppo.k_max, meta, predictor,
                               cfg.ppo.drafter, cfg.ppo.shapes)


def load_run_model(run: RunFiles, which: str = "best") -> tuple[Any, Any, str, RunConfig]:
    """``(model, vecnormalize or None, "best"|"final", config)`` of a run folder.

    ``best`` falls back to the final model when no validation ran; a run killed before its first checkpoint has
    only ``best_model.zip``, which ``best`` still takes.
    """
    from stable_baselines3.common.vec_env import DummyVecEnv

    if which not in ("best", "final"):
        raise SpecgymError(f"--which must be 'best' or 'final', got {which!r}")
    if not run.config.is_file() or not (run.model.is_file() or run.best_model.is_file()):
        raise SpecgymError(f"{run.root}: not a training run (needs config.yaml and model.zip or best_model.zip from "
                           f"'specgym train')")
    if which == "final" and not run.model.is_file():
        raise SpecgymError(f"{run.root}: no final model yet (model.zip); export --which best, or resume the run")
    cfg = RunConfig.from_file(run.config)
    model_path, stats_path, picked = run.model, run.vecnorm, "final"
    if which == "best" and run.best_model.is_file():
        model_path, stats_path, picked = run.best_model, run.best_vecnorm, "best"
    model = load_model(model_path, device="cpu")
    vecnorm = None
    if stats_path.is_file() or cfg.ppo.normalize.norm_obs:
        # statistics only: VecNormalize.load needs a venv with the right spaces, which the model carries
        vecnorm = load_vecnormalize(stats_path, DummyVecEnv([lambda: SpacesOnlyEnv(model)]))
    return model, vecnorm, picked, cfg


def export_run(run_dir: str | Path, out: str | Path | None = None, which: str = "best",
               overwrite: bool = False, force: bool = False) -> Path:
    """Export a training run folder (``specgym export``).

    Args:
        run_dir: ``runs/NAME`` written by ``specgym train``.
        out: Artifact folder (default ``RUN/policy``).
        which: ``best`` (the best model by validation speedup; falls back to the final one when no validation
            ran) or ``final`` (the last saved model).
        overwrite: Replace an existing artifact folder.
        force: Export a policy its validation found below its fixed reference or its teacher
            (:func:`check_deployable`); ``policy.json`` then carries the warning.
    """
    run = RunFiles(Path(run_dir))
    out = check_output(out or run.root / "policy", overwrite)  # before the model loads
    model, vecnorm, picked, cfg = load_run_model(run, which)
    metrics = run_metrics(run, picked)
    warning = check_deployable(metrics, cfg.mode, f"{run_dir} ({picked} model)", force)
    meta = {
        "training": {
            "run": Path(run_dir).resolve().name,
            "model": picked,
            "algorithm": "PPO (stable-baselines3)",
            "workload": cfg.workload_name,
            "workload_sha256": cfg.workload_sha256,
            "timesteps": int(model.num_timesteps),
            "seed": cfg.seed,
            "config": cfg.ppo.to_dict(),
        },
        "metrics": metrics or {},
        **({"warning": warning} if warning else {}),
    }
    art = run_artifact(model, vecnorm, cfg, load_run_predictor(cfg), meta)
    return write_artifact(art, out, overwrite=overwrite)

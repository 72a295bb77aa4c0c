"""The end of a run: full-val-split figures of the final and best models, and an honest verdict."""

from __future__ import annotations

from typing import Any

from specgym.agents.modes import get_mode
from specgym.io import atomic_write_text
from specgym.training.export import load_run_model, run_artifact
from specgym.training.run import RunState, TrainingRun
from specgym.training.run_folder import write_json
from specgym.training.validation import COMPARED_BASELINES, ValidationResult, Validator


def summarize(training: TrainingRun, validator: Validator, key: str, console: Any) -> dict[str, Any]:
    """Validate the final and best models on the whole validation set; write ``summary.json`` and ``summary.md``.

    ``validator`` and ``key`` come from :func:`specgym.training.validation.make_validator`.
    """
    run, cfg, state = training.files, training.config, training.state
    results: dict[str, ValidationResult] = {}
    for which in ("final", "best"):
        if which == "best" and not run.best_model.is_file():
            continue
        model, vec, picked, _ = load_run_model(run, which)
        art = run_artifact(model, vec, cfg, training.predictor)
        results[picked] = validator(art, None)
    pick = "best" if "best" in results and _at_least(results["best"], results["final"], key) else "final"
    val = results[pick]
    lines = [f"# PPO run {run.root.name}", "",
             f"- mode {cfg.mode}, workload `{cfg.workload_name}`" + (" (synthetic)" if cfg.workload_synthetic else "")
             + f", {state.timesteps_done:,} timesteps, seed {cfg.seed}, "
               f"{state.steps_per_s or 0:,.0f} steps/s in the last session",
             f"- validation split ({val.requests} requests), model `{pick}`{_at(state, pick)} "
             f"(the one `specgym export` takes by default):", ""]
    verdict = []
    sp = val.speedup_vs_best_fixed
    where = f"on val ({val.cells} cells, geometric mean)" if val.cells is not None else "on val"
    if val.replications is not None:
        where = f"on val ({val.replications} mixed-concurrency replications)"
    what = get_mode(cfg.mode).reference
    if sp >= 1.0:
        verdict.append(f"the policy beats {what} {where}: {sp:.3f}x")
    else:
        verdict.append(f"WARNING: the policy is BELOW {what} {where}: {sp:.3f}x. Do not deploy it; train "
                       f"longer or tune (see training/configs).")
    for name, label in COMPARED_BASELINES:
        if name in val.vs:
            x = val.vs[name]
            verdict.append(f"the policy {'beats' if x >= 1 else 'is BELOW'} {label}: {x:.3f}x")
    if val.oracle_ratio is not None:
        verdict.append(f"oracle ratio {val.oracle_ratio:.3f}")
    lines += [f"- {v}" for v in verdict] + [""]
    summary = {"run": run.root.name, "mode": cfg.mode, "workload": cfg.workload_name,
               "timesteps": state.timesteps_done, "steps_per_s": state.steps_per_s, "model": pick,
               "val": val.to_dict(),
               "val_all": {k: v.to_dict() for k, v in results.items()}, "below_best_fixed": sp < 1.0,
               "verdict": verdict, "val_history": state.val_history}
    write_json(run.summary, summary)
    atomic_write_text(run.summary_md, "\n".join(lines), overwrite=True)
    console.print(verdict[0], style="bold red" if sp < 1.0 else "bold green", highlight=False)
    for v in verdict[1:]:
        console.print(v, highlight=False)
    return summary


def _at(state: RunState, pick: str) -> str:
    """Which step the reported model is from (the best one's step is in the run state)."""
    if pick == "best" and (state.best or {}).get("timesteps") is not None:
        return f" (saved at {int((state.best or {})['timesteps']):,} timesteps)"
    return f" (at {int(state.timesteps_done):,} timesteps)"


def _at_least(a: ValidationResult, b: ValidationResult, key: str) -> bool:
    """True when ``a``'s figure ``key`` is at least ``b``'s."""
    x, y = a.figure(key), b.figure(key)
    return x is not None and y is not None and x >= y

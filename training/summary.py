"""The end of a run: full-val-split figures of the final and best models, and an honest verdict."""

from __future__ import annotations

from typing import Any

from specgym.io import atomic_write_text
from specgym.training.config import RunConfig
from specgym.training.export import load_run_model, run_artifact
from specgym.training.run_folder import RunFiles, write_json
from specgym.training.validation import COMPARED_BASELINES


def summarize(run: RunFiles, cfg: RunConfig, validator: Any, key: str, state: dict[str, Any],
              console: Any) -> dict[str, Any]:
    """Validate the final and best models on the whole validation set; write ``summary.json`` and ``summary.md``.

    ``validator`` and ``key`` come from :func:`specgym.training.validation.make_validator`.
    """
    results = {}
    for which in ("final", "best"):
        if which == "best" and not run.best_model.is_file():
            continue
        model, vec, picked, _ = load_run_model(run, which)
        art = run_artifact(model, vec, cfg)
        results[picked] = validator(art, None)
    pick = "best" if "best" in results and results["best"][key] >= results["final"][key] else "final"
    val = results[pick]
    lines = [f"# PPO run {run.root.name}", "",
             f"- mode {cfg.mode}, workload `{cfg.workload_name}`" + (" (synthetic)" if cfg.workload_synthetic else "")
             + f", {state['timesteps_done']:,} timesteps, seed {cfg.seed}, "
               f"{state.get('steps_per_s', 0):,.0f} steps/s in the last session",
             f"- validation split ({val['requests']} requests), model `{pick}`{_at(state, pick)} "
             f"(the one `specgym export` takes by default):", ""]
    verdict = []
    sp = val["speedup_vs_best_fixed"]
    where = f"on val ({val['cells']} cells, geometric mean)" if "cells" in val else "on val"
    if "replications" in val:
        where = f"on val ({val['replications']} mixed-concurrency replications)"
    what = "the best static K" if cfg.mode == "batch" else "the best fixed K"
    if sp >= 1.0:
        verdict.append(f"the policy beats {what} {where}: {sp:.3f}x")
    else:
        verdict.append(f"WARNING: the policy is BELOW {what} {where}: {sp:.3f}x. Do not deploy it; train "
                       f"longer or tune (see training/configs).")
    for k, label in COMPARED_BASELINES:
        if k in val:
            verdict.append(f"the policy {'beats' if val[k] >= 1 else 'is BELOW'} {label}: {val[k]:.3f}x")
    if val.get("oracle_ratio") == val.get("oracle_ratio"):
        verdict.append(f"oracle ratio {val['oracle_ratio']:.3f}")
    lines += [f"- {v}" for v in verdict] + [""]
    summary = {"run": run.root.name, "mode": cfg.mode, "workload": cfg.workload_name,
               "timesteps": state["timesteps_done"], "steps_per_s": state.get("steps_per_s"), "model": pick,
               "val": val, "val_all": results, "below_best_fixed": sp < 1.0, "verdict": verdict,
               "val_history": state.get("val_history", [])}
    write_json(run.summary, summary)
    atomic_write_text(run.summary_md, "\n".join(lines), overwrite=True)
    console.print(verdict[0], style="bold red" if sp < 1.0 else "bold green", highlight=False)
    for v in verdict[1:]:
        console.print(v, highlight=False)
    return summary


def _at(state: dict[str, Any], pick: str) -> str:
    """Which step the reported model is from (the best one's step is in the run state)."""
    if pick == "best" and state.get("best", {}).get("timesteps") is not None:
        return f" (saved at {int(state['best']['timesteps']):,} timesteps)"
    return f" (at {int(state['timesteps_done']):,} timesteps)"

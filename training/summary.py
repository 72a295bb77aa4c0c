"""The end of a run: full-val-split figures of the final and best models, and an honest verdict."""

from __future__ import annotations

from typing import Any

from specgym.io import atomic_write_text
from specgym.training.config import RunConfig
from specgym.training.export import artifact_from_model, load_run_model
from specgym.training.run_folder import RunFiles, write_json
from specgym.training.validation import validate_policy


def summarize(run: RunFiles, cfg: RunConfig, wl: Any, state: dict[str, Any], console: Any) -> dict[str, Any]:
    """Validate the final and best models on the whole val split; write ``summary.json`` and ``summary.md``."""
    results = {}
    for which in ("final", "best"):
        if which == "best" and not run.best_model.is_file():
            continue
        model, vec, picked, _ = load_run_model(run, which)
        art = artifact_from_model(model, vec, cfg.mode, cfg.ppo.k_min, cfg.ppo.k_max)
        results[picked] = validate_policy(art, wl, "val", None)
    pick = "best" if "best" in results and (results["best"]["speedup_vs_best_fixed"]
                                            >= results["final"]["speedup_vs_best_fixed"]) else "final"
    val = results[pick]
    lines = [f"# PPO run {run.root.name}", "",
             f"- mode {cfg.mode}, workload `{cfg.workload_name}`" + (" (synthetic)" if cfg.workload_synthetic else "")
             + f", {state['timesteps_done']:,} timesteps, seed {cfg.seed}, "
               f"{state.get('steps_per_s', 0):,.0f} steps/s in the last session",
             f"- validation split ({val['requests']} requests), model `{pick}` "
             f"(the one `specgym export` takes by default):", ""]
    verdict = []
    sp = val["speedup_vs_best_fixed"]
    if sp >= 1.0:
        verdict.append(f"beats the best fixed K (K={val['best_fixed_k']}, {val['best_fixed_tok_s']:.2f} tok/s) "
                       f"on val: {val['throughput_tok_s']:.2f} tok/s ({sp:.3f}x)")
    else:
        verdict.append(f"WARNING: the policy is BELOW the best fixed K (K={val['best_fixed_k']}, "
                       f"{val['best_fixed_tok_s']:.2f} tok/s) on val: {val['throughput_tok_s']:.2f} tok/s "
                       f"({sp:.3f}x). Do not deploy it; train longer or tune (see training/configs).")
    verdict.append(f"{'beats' if val['speedup_vs_speclane'] >= 1 else 'is BELOW'} speclane "
                   f"({val['speclane_tok_s']:.2f} tok/s): {val['speedup_vs_speclane']:.3f}x")
    if "speedup_vs_confidence" in val:
        verdict.append(f"{'beats' if val['speedup_vs_confidence'] >= 1 else 'is BELOW'} confidence:0.4 "
                       f"({val['confidence_tok_s']:.2f} tok/s): {val['speedup_vs_confidence']:.3f}x")
    verdict.append(f"oracle ratio {val['oracle_ratio']:.3f} (oracle {val['oracle_tok_s']:.2f} tok/s)")
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

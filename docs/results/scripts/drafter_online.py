"""The figures of `drafter-online` on docs/kinds/drafter.md that no single `specgym eval` prints.

Validation splits (`val`: where every parameter was chosen):

1. The prior weight: every weight against `drafter-marginal` on the same fit (the floor off: how the weight was
   chosen), on the four published traces (in distribution, and fitted on one serving another) and on
   `smollm2-greedy` (its own fit and a fit on its train split), and on `smollm2-greedy` with every run set to 0.
2. The floor at plain: every (stop loss, hindsight loss, first gap, growth) of a small grid, at the shipped weight,
   against the rule without the floor: every run set to 0 (vs plain decoding), the fit right (`smollm2-greedy`'s own,
   the four published traces'), and wrong (`smollm2-greedy` fitted on its train split; GSM8K serving InstructCoder);
   and sampled (`smollm2-t07`, its own fit and every run set to 0).

Test splits (`test`: measured once the parameters were frozen; nothing here chooses them):

3. Fitted on one published trace, serving another's test split: `drafter-online` over `drafter-marginal` on the same
   fit, paired over requests (95% bootstrap intervals).
4. The floor: every run set to 0, the fit right, the fit wrong (as in 2), and, per category of `smollm2-greedy`'s
   test split, every shipped drafter-choice default against plain decoding (the issue's "never below plain").

Run: `specgym workloads import specdecode-bench DATA --out traces/` (the published files), then
`python docs/results/scripts/drafter_online.py traces/ val` (parts 1-2, about two minutes on one core; replay) and
`python docs/results/scripts/drafter_online.py traces/ test` (parts 3-4, about a minute).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from specgym.baselines.drafter_marginal import DrafterMarginal, fit_on_fit_split
from specgym.baselines.drafter_online import DrafterOnline, PlainFloor
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.stats import PairedBootstrap

WEIGHTS = (1, 2, 4, 8, 16, 64)
NAMES = ("gsm8k", "instructcoder", "sharegpt", "cnn")
#: The floor's grid: (stop loss, hindsight loss, first gap, growth); the shipped one is (1.5, 0.5, 2, 2).
FLOORS = [(s, h, 2, 2.0) for s in (1.25, 1.5, 2.0) for h in (0.4, 0.5, 0.6)] + [(1.5, 0.5, 4, 3.0)]
#: The shipped drafter-choice defaults whose per-category minimum against plain decoding part 4 reports.
DEFAULTS = "drafter-online,drafter-marginal,lookup-switch,ppo:smollm2-drafter"


def times(wl, rows, split: str, prof, k_max: int) -> dict[str, np.ndarray]:
    rep = evaluate(EvalConfig(wl, rows, split=split, profile=prof, k_max=k_max, bootstrap=0, per_request=True))
    return {k: np.asarray(v) for k, v in rep["per_request_time_ms"].items()}


def no_floor(fit, **kw: Any) -> DrafterOnline:
    """`drafter-online` without its floor (the rule before it)."""
    return DrafterOnline(fit, floor=PlainFloor(stop_loss=float("inf")), **kw)


def hopeless(wl):
    """``wl`` with every drafter's proposals rejected (every run 0)."""
    cols = wl.flat_columns()
    cols.update({k: np.zeros_like(v) for k, v in cols.items() if k.startswith("runs_") or k == "p_accept"})
    return wl.with_columns(cols)


def weights(published: dict, h100, fits: dict) -> None:
    """Part 1: the weight sweep on the validation splits (the floor off)."""
    def rows(fit):
        return [("marginal", DrafterMarginal(fit))] + [(f"w{w}", no_floor(fit, prior_tokens=w)) for w in WEIGHTS]

    cells: dict[str, dict[int, list[float]]] = {"in distribution": {w: [] for w in WEIGHTS},
                                                "fitted on another": {w: [] for w in WEIGHTS}}
    for fit in NAMES:
        for serve in NAMES:
            t = times(published[serve], rows(fits[fit]), "val", h100, 16)
            for w in WEIGHTS:
                cells["in distribution" if fit == serve else "fitted on another"][w].append(
                    np.log(t["marginal"].sum() / t[f"w{w}"].sum()))
    for what, by_w in cells.items():
        print(f"published val, {what}: online / marginal, geometric mean (min) by weight: " + ", ".join(
            f"{w}: {np.exp(np.mean(v)):.4f} ({np.exp(min(v)):.4f})" for w, v in by_w.items()))
    sm, cpu = cached_workload("smollm2-greedy"), load_profile("cpu-smollm2")
    for label, fit in (("its own fit", fits["smollm2"]), ("a train-split fit", fits["smollm2-train"])):
        t = times(sm, rows(fit), "val", cpu, 8)
        print(f"smollm2-greedy val, {label}: " + ", ".join(f"{w}: {t['marginal'].sum() / t[f'w{w}'].sum():.4f}"
                                                           for w in WEIGHTS))
    rep = evaluate(EvalConfig(hopeless(sm), rows(fits["smollm2"]), split="val", profile=cpu, bootstrap=0))
    print("smollm2-greedy val, every run 0, vs plain decoding: " + ", ".join(
        f"{r['spec']}: {r['speedup_vs_ar']:.3f}" for r in rep["rows"]))


def floor_cases(published: dict, fits: dict) -> list[tuple[str, Any, Any, Any, int]]:
    """(label, workload, fit, profile, k_max) of part 2 and 4: every run 0, the fit right, the fit wrong; and at
    T = 0.7 (`smollm2-t07`, no counterfactual: only probes resume drafting) where its fit is given."""
    sm, cpu, h100 = cached_workload("smollm2-greedy"), load_profile("cpu-smollm2"), load_profile("h100-llama31-8b")
    sampled = []
    if "smollm2-t07" in fits:
        t07 = cached_workload("smollm2-t07")
        sampled = [("smollm2-t07, every run 0 (vs plain)", hopeless(t07), fits["smollm2-t07"], cpu, 8),
                   ("smollm2-t07, its own fit", t07, fits["smollm2-t07"], cpu, 8)]
    return ([("every run 0 (vs plain)", hopeless(sm), fits["smollm2"], cpu, 8),
             ("smollm2-greedy, its own fit", sm, fits["smollm2"], cpu, 8)]
            + [(f"{n}, its own fit", published[n], fits[n], h100, 16) for n in NAMES]
            + [("smollm2-greedy, a train-split fit", sm, fits["smollm2-train"], cpu, 8),
               ("gsm8k fit serving instructcoder", published["instructcoder"], fits["gsm8k"], h100, 16)] + sampled)


def floors(published: dict, fits: dict, split: str, grid: list[tuple[float, float, int, float]]) -> None:
    """Parts 2 and 4: each floor of ``grid`` against the rule without it (and `drafter-marginal`) on ``split``."""
    def label(s: float, h: float, g: int, r: float) -> str:
        return f"floor {s:g}/{h:g}/{g}/{r:g}"

    for what, wl, fit, prof, k_max in floor_cases(published, fits):
        rows = [("marginal", DrafterMarginal(fit)), ("no floor", no_floor(fit))] + [
            (label(*p), DrafterOnline(fit, floor=PlainFloor(*p))) for p in grid]
        rep = evaluate(EvalConfig(wl, rows, split=split, profile=prof, k_max=k_max, bootstrap=0))
        got = {r["spec"]: r for r in rep["rows"]}
        if "every run 0" in what:
            print(f"{split}, {what}: " + ", ".join(f"{k}: {r['speedup_vs_ar']:.4f}x" for k, r in got.items()))
            continue
        base = got["marginal"]["total_time_ms"]
        print(f"{split}, {what}, over drafter-marginal: " + ", ".join(
            f"{k}: {base / r['total_time_ms']:.4f}x" for k, r in got.items() if k != "marginal"))


def categories(split: str) -> None:
    """Part 4: each shipped default's throughput over plain decoding's, per category of `smollm2-greedy`."""
    wl = cached_workload("smollm2-greedy")
    rep = evaluate(EvalConfig("smollm2-greedy", DEFAULTS, split=split, profile="cpu-smollm2", bootstrap=0,
                              per_request=True))
    per, cat = rep["per_request_time_ms"], wl.category[wl.split_indices(split)]
    for note in rep.get("notes") or []:
        print(f"  note: {note}")
    for spec in DEFAULTS.split(","):
        if spec not in per:
            print(f"smollm2-greedy {split}, {spec}: not evaluated")
            continue
        by = {c: per["fixed:0"][cat == c].sum() / per[spec][cat == c].sum() for c in dict.fromkeys(cat.tolist())}
        low = min(by, key=by.__getitem__)
        print(f"smollm2-greedy {split}, {spec}: {per['fixed:0'].sum() / per[spec].sum():.3f}x plain, lowest category "
              f"{low} {by[low]:.3f}x" + (" (BELOW PLAIN)" if by[low] < 1.0 else "") + "; "
              + ", ".join(f"{c} {v:.3f}" for c, v in by.items()))


def shifted(published: dict, h100, fits: dict) -> None:
    """Part 3: fitted on one published trace, serving another's test split."""
    logs = []
    for fit in NAMES:
        for serve in NAMES:
            if fit == serve:
                continue
            rows = [("marginal", DrafterMarginal(fits[fit])), ("online", DrafterOnline(fits[fit]))]
            t = times(published[serve], rows, "test", h100, 16)
            lo, hi = PairedBootstrap(len(t["online"]), 2000, seed=0).ratio_ci(t["marginal"], t["online"])
            r = t["marginal"].sum() / t["online"].sum()
            logs.append(np.log(r))
            print(f"test, fitted on {fit}, serving {serve}: online / marginal {r:.3f}x [{lo:.3f}, {hi:.3f}]")
    print(f"geometric mean over the {len(logs)} cells {np.exp(np.mean(logs)):.3f}x, min {np.exp(min(logs)):.3f}x")


def main(traces: str, split: str) -> None:
    h100 = load_profile("h100-llama31-8b")
    published = {n: cached_workload(Path(traces) / f"specdecode-{n}.parquet") for n in NAMES}
    fits = {n: fit_on_fit_split(published[n], h100) for n in NAMES}
    sm, cpu = cached_workload("smollm2-greedy"), load_profile("cpu-smollm2")
    fits.update({"smollm2": fit_on_fit_split(sm, cpu), "smollm2-train": fit_on_fit_split(sm, cpu, split="train")})
    if split == "val":
        fits["smollm2-t07"] = fit_on_fit_split(cached_workload("smollm2-t07"), cpu)
        weights(published, h100, fits)
        floors(published, fits, "val", FLOORS)
    elif split == "test":
        shifted(published, h100, fits)
        floors(published, fits, "test", [(1.5, 0.5, 2, 2.0)])
        categories("test")
    else:
        raise SystemExit(f"split must be val or test, got {split!r}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "traces", sys.argv[2] if len(sys.argv) > 2 else "val")

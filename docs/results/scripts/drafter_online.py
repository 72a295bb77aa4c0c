"""The figures of `drafter-online` on docs/kinds/drafter.md that no single `specgym eval` prints.

1. The prior weight, chosen on validation splits: every weight against `drafter-marginal` on the same fit, on the
   four published traces (in distribution, and fitted on one serving another) and on `smollm2-greedy` (its own fit
   and a fit on its train split), and on `smollm2-greedy` with every run set to 0 (vs plain decoding).
2. The test splits of the published traces: fitted on one, serving another, `drafter-online` over `drafter-marginal`
   on the same fit, paired over requests (95% bootstrap intervals).

Run: `specgym workloads import specdecode-bench DATA --out traces/` (the published files), then
`python docs/results/scripts/drafter_online.py traces/` (about a minute on one core; replay).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from specgym.baselines.drafter_marginal import DrafterMarginal, fit_on_fit_split
from specgym.baselines.drafter_online import DrafterOnline
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.stats import PairedBootstrap

WEIGHTS = (1, 2, 4, 8, 16, 64)
NAMES = ("gsm8k", "instructcoder", "sharegpt", "cnn")


def times(wl, rows, split: str, prof, k_max: int) -> dict[str, np.ndarray]:
    rep = evaluate(EvalConfig(wl, rows, split=split, profile=prof, k_max=k_max, bootstrap=0, per_request=True))
    return {k: np.asarray(v) for k, v in rep["per_request_time_ms"].items()}


def weights(published: dict, h100, fits: dict) -> None:
    """Part 1: the weight sweep on the validation splits."""
    def rows(fit):
        return [("marginal", DrafterMarginal(fit))] + [(f"w{w}", DrafterOnline(fit, prior_tokens=w)) for w in WEIGHTS]

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
    for label, fit in (("its own fit", fit_on_fit_split(sm, cpu)), ("a train-split fit", fit_on_fit_split(sm, cpu,
                                                                                                           split="train"))):
        t = times(sm, rows(fit), "val", cpu, 8)
        print(f"smollm2-greedy val, {label}: " + ", ".join(f"{w}: {t['marginal'].sum() / t[f'w{w}'].sum():.4f}"
                                                           for w in WEIGHTS))
    cols = sm.flat_columns()
    cols.update({k: np.zeros_like(v) for k, v in cols.items() if k.startswith("runs_") or k == "p_accept"})
    rep = evaluate(EvalConfig(sm.with_columns(cols), rows(fit_on_fit_split(sm, cpu)), split="val", profile=cpu,
                              bootstrap=0))
    print("smollm2-greedy val, every run 0, vs plain decoding: " + ", ".join(
        f"{r['spec']}: {r['speedup_vs_ar']:.3f}" for r in rep["rows"]))


def shifted(published: dict, h100, fits: dict) -> None:
    """Part 2: fitted on one published trace, serving another's test split."""
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


def main(traces: str) -> None:
    h100 = load_profile("h100-llama31-8b")
    published = {n: cached_workload(Path(traces) / f"specdecode-{n}.parquet") for n in NAMES}
    fits = {n: fit_on_fit_split(published[n], h100) for n in NAMES}
    weights(published, h100, fits)
    shifted(published, h100, fits)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "traces")

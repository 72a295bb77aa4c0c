"""Benchmark section ``predictor``: what the acceptance predictor costs per draft token (target <= 20 us).

Every shipped predictor is timed on draft steps carrying the recorded v2 signals of the default workload (the
deployment path, :meth:`AcceptancePredictor.predict_step`), and so is its controller's ``keep_drafting`` (the
predictor plus the marginal rule), beside ``marginal``'s, so the ratio shows what the prediction adds.
"""

from __future__ import annotations

import time
from typing import Any

import specgym.catalogue as catalogue
from specgym.baselines.marginal import MarginalStop
from specgym.baselines.predicted_marginal import PredictedMarginal
from specgym.envs.core.acceptance_predictor import load_predictor
from specgym.envs.core.rounds import DraftStep
from specgym.envs.core.signals import DraftSignals
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.trace_format import cached_workload
from specgym.eval.bench.common import print_table

TARGET_US = 20.0


def _per_call_us(fn, items: list, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for it in items:
            fn(it)
        best = min(best, (time.perf_counter() - t0) / len(items) * 1e6)
    return best


def predictor_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """Microseconds per draft token of each shipped predictor (and of its controller's token check)."""
    wl = cached_workload(workload)
    cols = wl.signal_columns()
    names = catalogue.names("predictor")
    if cols is None or not names:
        why = "no shipped predictor" if not names else f"{workload} has no v2 signals"
        console.print(f"[yellow]predictor section skipped: {why}[/yellow]")
        return {}
    n = min(20_000, wl.n_positions)
    conf, ent = wl.require("draft_conf", "the predictor bench"), wl.require("draft_entropy", "the predictor bench")
    steps = [DraftStep(1 + i % 7, 8, i % 100, float(conf[i]), float(ent[i]),
                       DraftSignals(cols, i, i + 1)) for i in range(n)]
    ctx = TraceEngine(wl, k_max=8, seed=0).context(0)
    figures: dict[str, Any] = {}
    rows = []
    marginal = MarginalStop()
    marginal.reset(ctx)
    m_us = _per_call_us(marginal.keep_drafting, steps)
    rows.append(("marginal: keep_drafting per draft token", f"{m_us:.2f} us", "(reference)"))
    figures["marginal_token_check_us"] = m_us
    for name in names:
        pred = load_predictor(catalogue.resolve("predictor", name))
        p_us = _per_call_us(lambda s: pred.predict_step(s, 0.0), steps)
        ctrl = PredictedMarginal(pred)
        ctrl.reset(ctx)
        c_us = _per_call_us(ctrl.keep_drafting, steps)
        ok = "met" if p_us <= TARGET_US else "MISSED"
        rows.append((f"predictor {name} ({pred.kind}, {len(pred.columns)} inputs) per draft token",
                     f"{p_us:.2f} us", f"<= {TARGET_US:g} us ({ok})"))
        rows.append((f"predicted:{name}: keep_drafting per draft token", f"{c_us:.2f} us",
                     f"{c_us / m_us:.2f}x marginal's"))
        figures[f"predictor_{name}_us"] = p_us
        figures[f"predicted_{name}_token_check_us"] = c_us
    print_table(console, f"acceptance predictor cost, {n} recorded draft steps of {wl.name}", rows)
    return {"predictor": figures}

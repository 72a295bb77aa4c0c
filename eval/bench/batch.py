"""``specgym bench batch``: batched replay speed, the vLLM tuner's time, and the measured batched profile
of the shipped pair against a roofline model of this CPU."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from rich.table import Table

import specgym.catalogue as catalogue
from specgym.envs.core.batch_cost import Roofline
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.profiles import load_batch_profile
from specgym.envs.workloads.synthetic import generate_workload
from specgym.eval.bench.common import print_table, versus
from specgym.eval.tune import tune_vllm
from specgym.paths import default_pair_name

TARGET_SEQ_STEPS = 1_000_000
TARGET_TUNE_S = 30.0
#: One core of this project's CPU (AMD EPYC, Zen 3, AVX2): 2 x 256-bit FMA per cycle at ~3 GHz, and the memory
#: bandwidth one core reaches; fp32 weights.
CPU_ROOFLINE = {"bytes_per_param": 4.0, "bandwidth_gb_s": 20.0, "peak_tflops": 0.096, "efficiency": 0.6}


def batch_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """Sequence-steps per second of the batched replay, the tuner's time, measured-vs-roofline (if measured)."""
    prof = load_batch_profile("batch-a100-7b-roofline")
    wl = generate_workload("speclane-mix", 1000, seed=0)
    rows, figures = [], {}
    for b in (64, 256, 512):
        sim = BatchReplay(wl, prof, b, seed=0)
        t0 = time.perf_counter()
        sim.run_fixed(3)
        rate = sim.seq_steps / (time.perf_counter() - t0)
        figures[f"batch_seq_steps_per_s/{b}"] = rate
        rows.append((f"batched replay, concurrency {b}", f"{rate:,.0f} seq-steps/s", versus(rate, TARGET_SEQ_STEPS)))
    t0 = time.perf_counter()
    res = tune_vllm(wl, prof, max_batch=512)
    dt = time.perf_counter() - t0
    figures["tune_vllm_s"] = dt
    rows.append(("specgym tune vllm, concurrency 1..512, 1,000 requests (synthetic)", f"{dt:.1f} s",
                 versus(dt, TARGET_TUNE_S, higher_better=False)))
    print_table(console, "serving at concurrency", rows)
    figures["tune_table"] = res["table"]
    measured = f"batch-cpu-{default_pair_name()}"
    if measured in catalogue.names("batch_profile"):
        figures.update(roofline_side_by_side(load_batch_profile(measured), console))
    return figures


def roofline_side_by_side(measured: Any, console: Any) -> dict[str, Any]:
    """The measured profile's step times next to the roofline model's prediction for this CPU."""
    hw = measured.hardware
    params = hw.get("target_params"), hw.get("draft_params")
    if not all(params):
        return {}
    # one fitted number: the fixed time per forward (framework, attention, LM head), from the batch-1 step
    bare = Roofline(float(params[0]), float(params[1]), fixed_ms=0.0, **CPU_ROOFLINE)
    fixed = max(measured.verify(1, 1) - bare.forward_ms(float(params[0]), 1), 0.0)
    model = Roofline(float(params[0]), float(params[1]), fixed_ms=fixed, overhead_ms=measured.overhead(1),
                     **CPU_ROOFLINE)
    table = Table(title=f"{measured.name}: measured target step (ms) vs roofline prediction for one core "
                        f"({CPU_ROOFLINE['bandwidth_gb_s']:g} GB/s, {CPU_ROOFLINE['peak_tflops'] * 1000:g} GFLOP/s "
                        f"peak, fp32)")
    for col in ("batch", "n = 1 measured", "roofline", "n = 5 measured", "roofline", "n = 9 measured", "roofline"):
        table.add_column(col, justify="right")
    errs = []
    for b in measured.batch_sizes:
        cells = [str(b)]
        for n in (1, 5, 9):
            m, r = measured.verify(b, n), model.forward_ms(float(params[0]), b * n)
            errs.append(abs(np.log(r / m)))
            cells += [f"{m:.2f}", f"{r:.2f}"]
        table.add_row(*cells)
    console.print(table)
    err = float(np.exp(np.mean(errs)))
    console.print(f"roofline (fixed time per forward fitted at batch 1: {fixed:.2f} ms) off by a factor {err:.2f} on "
                  "average (geometric mean over the cells)", highlight=False)
    return {"roofline_mean_factor_off": err, "roofline_fixed_ms": fixed}

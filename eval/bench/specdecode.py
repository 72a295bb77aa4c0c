"""Benchmark sections on the published SpecDecode-Bench traces (a user's copy, ``--data DIR``; never shipped).

* ``specdecode-bench``: the import of every file (both drafters, written to a temporary folder: < 60 s), then the
  reference simulator's like-experiment (:mod:`specgym.eval.like_experiment`) for fixed K = 1, 3, 5 and the
  oracle with EAGLE at bs = 1, 8, 32, 128 over every request of every file, with specgym's ordinary harness figure
  beside each cell. The JSON's ``rows`` hold ``dataset``, ``policy``, ``bs``, ``speedup`` (and ``harness_speedup``).
* ``specdecode-eval``: the time of one evaluation (``--controllers`` of every runnable controller) on the largest
  dataset's test split, priced by ``h100-llama31-8b`` (target: < 60 s).

These are replays of published traces priced by a published cost model, not live GPU runs.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.specdecode import PROFILE, dataset_name, import_file, input_files
from specgym.envs.workloads.trace_format import save_workload
from specgym.errors import SpecgymError
from specgym.eval.bench.common import print_table, versus
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.like_experiment import BATCH_SIZES, POLICIES, harness_speedup, like_experiment

IMPORT_TARGET_S = 60.0
EVAL_TARGET_S = 60.0
#: The controllers that run on a per-start trace (no draft confidence or entropy): every baseline of ``all`` but
#: the confidence/entropy stops, with fixed K up to 16.
EVAL_CONTROLLERS = "marginal,assc,speclane,hf-heuristic,ucb," + ",".join(f"fixed:{k}" for k in range(1, 17))


def _data(args: Any) -> list[Path]:
    data = getattr(args, "data", None)
    if data is None:
        raise SpecgymError("bench specdecode-bench/specdecode-eval need --data DIR (a copy of SpecDecode-Bench's "
                           "data/llama3.1-8B folder: combined_<dataset>.jsonl)")
    return input_files(data)


def reproduction(files: list[Path], batch_sizes: tuple[int, ...] = BATCH_SIZES,
                 policies: tuple[str, ...] = POLICIES) -> list[dict[str, Any]]:
    """The like-experiment rows of every file (EAGLE at its own length), with the harness figure beside each."""
    profile = load_profile(PROFILE)
    rows = []
    for f in files:
        wl = import_file(f, ("eagle",)).workload
        engine = TraceEngine(wl, profile, k_max=16, drafter="eagle")
        for bs in batch_sizes:
            at = TraceEngine(wl, profile.copies(bs), k_max=16, drafter="eagle")
            for policy in policies:
                res = like_experiment(engine, profile, bs, policy)
                rows.append({"dataset": dataset_name(f), "policy": policy, "bs": bs, "speedup": res.speedup,
                             "harness_speedup": harness_speedup(at, policy), "requests": wl.n_requests})
    return rows


def specdecode_bench_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``specdecode-bench``: import time of every file, then the reproduction table."""
    files = _data(args)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            imp = import_file(f)
            save_workload(imp.workload, Path(tmp) / f"{imp.workload.name}.parquet")
    import_s = time.perf_counter() - t0
    print_table(console, "import of the published traces (both drafters, parse + lookup signals + Parquet)", [
        (f"{len(files)} files", f"{import_s:.1f} s", versus(import_s, IMPORT_TARGET_S, higher_better=False))])
    t0 = time.perf_counter()
    rows = reproduction(files)
    repro_s = time.perf_counter() - t0
    table = Table(title="like-experiment speedup (SpecDecode-Bench semantics; harness = specgym's ordinary replay, "
                        "prefill excluded), EAGLE, h100-llama31-8b; a replay of published traces, not a live GPU run",
                  show_header=True, header_style="bold")
    table.add_column("dataset")
    table.add_column("policy")
    for bs in BATCH_SIZES:
        table.add_column(f"bs={bs}", justify="right")
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for policy in POLICIES:
            cells = {r["bs"]: r for r in rows if r["dataset"] == ds and r["policy"] == policy}
            table.add_row(ds, policy, *(f"{cells[b]['speedup']:.2f}x ({cells[b]['harness_speedup']:.2f}x)"
                                        if b in cells else "" for b in BATCH_SIZES))
    console.print(table)
    console.print(f"reproduction: {len(rows)} cells over every request in {repro_s:.1f} s", highlight=False)
    return {"rows": rows, "specdecode_import_s": import_s, "specdecode_reproduction_s": repro_s}


def specdecode_eval_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``specdecode-eval``: one evaluation of every runnable controller on the largest file's test split."""
    files = _data(args)
    biggest = max(files, key=lambda p: p.stat().st_size)
    wl = import_file(biggest).workload
    t0 = time.perf_counter()
    report = evaluate(EvalConfig(workload=wl, controllers=EVAL_CONTROLLERS, profile=PROFILE, k_max=16))
    eval_s = time.perf_counter() - t0
    print_table(console, f"evaluation on {wl.name} (test split, {report['workload']['requests']} requests, "
                         f"{len(report['rows'])} controllers, bootstrap CIs)",
                [("one evaluation", f"{eval_s:.1f} s", versus(eval_s, EVAL_TARGET_S, higher_better=False))])
    return {"specdecode_eval_s": eval_s, "specdecode_eval_workload": wl.name}

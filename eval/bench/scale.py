"""Benchmark section ``scale``: a million requests in bounded memory, and recording on 1 vs 2 Ray workers.

1. A SYNTHETIC sharded workload (speclane-mix, ``--requests`` requests, ``--shard-requests`` per shard)
   is generated shard by shard (:func:`generate_sharded`) into ``--dir`` (reused when it is already there).
2. The streaming evaluation (:func:`specgym.eval.streaming.evaluate_streaming`) of fixed K = 1..8, ``marginal``
   and both oracles over every request: wall time and peak RSS (target <= 3 GB).
3. Recording throughput of the default pair on ``--record-prompts`` prompts: one process (one torch thread)
   vs ``--record-workers`` Ray actors (one thread each), pair loading and cluster start excluded, and whether
   the two workloads are byte-identical (target: >= 1.7x with 2 workers). Both load the pair without the timed
   fast-kernel choice (``fast_kernels=False``), so that the float columns are reproducible. Skipped without Ray.

Generation and evaluation each run in a fresh child process, so each peak RSS (``ru_maxrss``) is that job's alone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import specgym.catalogue as catalogue
from specgym.envs.engines.live.distributed import record_distributed
from specgym.envs.engines.live.model_loading import load_pair
from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.dataset import write_dataset
from specgym.envs.workloads.prompts import read_prompts
from specgym.envs.workloads.synthetic import generate_workload
from specgym.envs.workloads.trace_format import open_dataset
from specgym.errors import SpecgymError
from specgym.eval.bench.common import print_table
from specgym.eval.streaming import evaluate_streaming
from specgym.io import sha256_file
from specgym.paths import default_pair_name, pair_profile

PRESET = "speclane-mix"
RSS_TARGET_GB = 3.0
SPEEDUP_TARGET = 1.7


#: What the scale section evaluates over the whole sharded workload: fixed K = 1..8 and ``marginal``.
SCALE_CONTROLLERS = "marginal," + ",".join(f"fixed:{k}" for k in range(1, 9))

def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def generate_sharded(out: Path, n_requests: int, shard_requests: int, seed: int = 0) -> None:
    """A synthetic sharded workload of ``n_requests`` (labelled synthetic), one shard in memory at a time: shard ``i``
    is :func:`~specgym.envs.workloads.synthetic.generate_workload` with seed ``seed + i``, its requests renamed by
    their index in the whole workload; the metadata names the scheme."""
    name = f"{PRESET}-{n_requests}"

    def shards():
        for i, lo in enumerate(range(0, n_requests, shard_requests)):
            n = min(shard_requests, n_requests - lo)
            wl = generate_workload(PRESET, n, seed=seed + i, name=name)
            yield replace(wl, request_id=np.array([f"{name}-{lo + r:07d}" for r in range(n)], dtype=object),
                          source={**wl.source, "seed": seed,
                                  "sharded": f"shard i generated with seed {seed} + i, {shard_requests} requests "
                                             f"per shard"},
                          split_seed=seed)

    write_dataset(shards(), out, overwrite=True)


def _child_generate(out: str, n: int, shard: int, queue: Any) -> None:
    t0 = time.perf_counter()
    generate_sharded(Path(out), n, shard)
    queue.put({"wall_s": time.perf_counter() - t0, "peak_rss_gb": _peak_rss_gb()})


def _child_eval(path: str, queue: Any) -> None:
    t0 = time.perf_counter()
    rep = evaluate_streaming(path, SCALE_CONTROLLERS, split="all")
    queue.put({"wall_s": time.perf_counter() - t0, "peak_rss_gb": _peak_rss_gb(), "requests": rep["requests"],
               "tokens": rep["tokens"], "shards": rep["workload"]["shards"],
               "best_fixed_k": rep["reference"]["best_fixed_k"],
               "speedup_vs_best_fixed": {r["spec"]: r["speedup_vs_best_fixed"] for r in rep["rows"]},
               "oracle_speedup_vs_best_fixed": rep["oracle"]["speedup_vs_best_fixed"]})


def _in_child(target: Any, *args: Any) -> dict[str, Any]:
    """Run ``target(*args, queue)`` in a fresh (spawned) process; its result dict."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise SpecgymError(f"scale bench: the {target.__name__.strip('_')} child process failed "
                           f"(exit {proc.exitcode})")
    return queue.get()


def _dataset_ok(path: Path, n: int) -> bool:
    try:
        return path.is_dir() and open_dataset(path).n_requests == n
    except SpecgymError:
        return False


def bench_recording(prompts: int, workers: int, max_new_tokens: int = 32) -> dict[str, Any]:
    """Recording throughput (trace positions/s) of the default pair, one process vs ``workers`` Ray actors."""
    import torch

    pair_name = default_pair_name()
    specs = read_prompts(catalogue.resolve("prompts", f"{pair_name}-prompts"))[:prompts]
    profile = load_profile(pair_profile(pair_name) or "speclane-table")
    draft, target = catalogue.pair_models(pair_name)
    spec = RecordingSpec(max_new_tokens, 0.0, profile, name="scale-bench", seed=0, gen_k=3)
    with tempfile.TemporaryDirectory(prefix="specgym-scale-") as tmp:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            pair = load_pair(str(draft), str(target), fast_kernels=False)
            _, one = record_workload(pair, specs, Path(tmp) / "one.parquet", spec)
        finally:
            torch.set_num_threads(threads)
        load = {"draft": str(draft), "target": str(target), "fast_kernels": False}
        _, many = record_distributed(load, specs, Path(tmp) / "many.parquet", spec, workers)
        identical = sha256_file(Path(tmp) / "one.parquet") == sha256_file(Path(tmp) / "many.parquet")
    positions = one["positions"]
    return {"pair": pair_name, "prompts": len(specs), "positions": positions, "workers": workers,
            "one_process_s": one["wall_s"], "workers_s": many["record_s"], "workers_startup_s": many["startup_s"],
            "one_process_pos_per_s": positions / one["wall_s"], "workers_pos_per_s": positions / many["record_s"],
            "speedup": one["wall_s"] / many["record_s"], "identical": identical}


def scale_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """Figures of the ``scale`` section (see the module docstring)."""
    n, shard = int(args.scale_requests), int(args.scale_shard_requests)
    path = Path(args.scale_dir or Path("out") / f"scale-synthetic-{n}")
    rows: list[tuple[str, str, str]] = []
    out: dict[str, Any] = {"scale_requests": n, "scale_dir": str(path), "scale_synthetic": True}
    if _dataset_ok(path, n):
        console.print(f"scale: reusing the synthetic sharded workload {path}")
    else:
        console.print(f"scale: generating a SYNTHETIC sharded workload of {n:,} requests into {path}")
        gen = _in_child(_child_generate, str(path), n, shard)
        out["generate"] = gen
        rows.append(("generate (synthetic, sharded)", f"{gen['wall_s']:.1f} s, peak RSS {gen['peak_rss_gb']:.2f} GB",
                     "-"))
    ev = _in_child(_child_eval, str(path))
    out["eval"] = ev
    ok = ev["peak_rss_gb"] <= RSS_TARGET_GB
    rows.append((f"streaming eval, {ev['requests']:,} requests (synthetic), fixed 1..8 + marginal + oracles",
                 f"{ev['wall_s']:.1f} s", "-"))
    rows.append(("  its peak RSS", f"{ev['peak_rss_gb']:.2f} GB",
                 f"<= {RSS_TARGET_GB:g} GB ({'met' if ok else 'MISSED'})"))
    rows.append(("  marginal vs best fixed K", f"{ev['speedup_vs_best_fixed'].get('marginal', float('nan')):.3f}x "
                 f"(K={ev['best_fixed_k']}; oracle {ev['oracle_speedup_vs_best_fixed']:.3f}x)", "-"))
    try:
        import ray  # noqa: F401
    except ImportError:
        console.print("scale: recording throughput skipped (needs Ray: pip install 'specgym[distributed]')")
    else:
        rec = bench_recording(int(args.scale_record_prompts), int(args.scale_record_workers))
        out["record"] = rec
        met = rec["speedup"] >= SPEEDUP_TARGET and rec["identical"]
        rows.append((f"record {rec['pair']}, {rec['prompts']} prompts, 1 process",
                     f"{rec['one_process_pos_per_s']:.0f} positions/s", "-"))
        rows.append((f"record on {rec['workers']} Ray workers", f"{rec['workers_pos_per_s']:.0f} positions/s "
                     f"({rec['speedup']:.2f}x; identical output: {rec['identical']})",
                     f">= {SPEEDUP_TARGET}x, identical ({'met' if met else 'MISSED'})"))
    print_table(console, f"scale (cpu count {os.cpu_count()}; workload SYNTHETIC)", rows)
    return {"scale": out}

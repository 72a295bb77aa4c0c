"""``make gpu-check``: one prepared run on a machine with a GPU, writing one JSON of figures (under 8 minutes).

On the shipped midpair pair, on the given device (``--device cuda`` by default):

1. **load**: the pair in float32 (the fast CPU kernels do not apply on a GPU; the lean forwards do), the device's
   name and memory;
2. **profile**: the pair's cost profile measured on the device (wall clock, device-synchronised; chain rounds and
   tree verification up to 16 nodes);
3. **record**: a small greedy trace (8 prompts of the shipped midpair prompts, 64 new tokens, the hidden sketch) and
   a sampled one (T = 0.8, seed 1) whose tokens are compared with the same recording on the CPU for the first two
   prompts (the sampling generator lives on the host: the tokens should agree up to float rounding of the
   probabilities);
4. **live bench**: plain decoding, fixed K = 2 and 4, ``marginal`` and the static tree 2-2-1 on two test prompts per
   category of ``midpair-greedy`` (the tree through live tree verification), every greedy output checked against
   plain decoding, with transformers' ``generate()`` plain and assisted.

``specgym gpu-check`` runs it (``make gpu-check``: ``--device cuda``); ``--device cpu --quick`` runs the same steps
at a toy size on the CPU (the test suite's dry run). Every figure is a measurement on the device named in the JSON;
nothing here has been run on a GPU until docs/guides/own-pair.md says so.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

import specgym.catalogue as catalogue
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair
from specgym.envs.engines.live.profiler import measure_profile
from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
from specgym.envs.workloads.prompts import read_prompts
from specgym.eval.bench.live import run_live_bench
from specgym.io import atomic_write_text
from specgym.paths import default_pair_name

#: Seconds the whole check must stay under on a GPU.
BUDGET_S = 480


def device_info(device: str) -> dict[str, Any]:
    """What the JSON says about the machine: the device's name and memory, torch and CUDA versions."""
    import torch

    info: dict[str, Any] = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
                            "host": platform.node()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def run_check(device: str, out: Path, quick: bool = False, console: Any = None) -> dict[str, Any]:
    """Run every step; returns the figures (also written to ``out``, atomically)."""
    import torch

    console = console or Console(file=sys.stderr)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    steps: dict[str, float] = {}
    figures: dict[str, Any] = {"machine": device_info(device), "quick": quick}
    pair_name = default_pair_name()
    draft, target = (str(p) for p in catalogue.pair_models(pair_name))

    t0 = time.perf_counter()
    pair = load_pair(draft, target, device=device)
    steps["load_s"] = time.perf_counter() - t0
    figures["pair"] = {"name": pair_name, "dtypes": pair.dtypes, "packed_linears": pair.packed,
                       "target_params": sum(p.numel() for p in pair.target.parameters())}

    t0 = time.perf_counter()
    prof = measure_profile(pair, k_max=8, repeats=5 if quick else 20, warmup=2 if quick else 5,
                           name=f"measured-{device}", tree_nodes=0 if quick else 16)
    steps["profile_s"] = time.perf_counter() - t0
    figures["profile"] = prof.to_dict() if hasattr(prof, "to_dict") else {"draft_ms": prof.draft_ms,
                                                                          "verify_ms": list(prof.verify_ms)}

    prompts = read_prompts(catalogue.resolve("prompts", f"{pair_name}-prompts"))[: 2 if quick else 8]
    new_tokens = 12 if quick else 64
    work = out.with_name(out.stem + "-files")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    halves = (0.5, 0.0, 0.5)
    greedy = RecordingSpec(new_tokens, 0.0, prof, name="gpu-greedy", gen_k=3, split_fractions=halves, hidden_sketch=16)
    t08 = RecordingSpec(new_tokens, 0.8, prof, name="gpu-t08", seed=1, gen_k=2, split_fractions=halves)
    wl, stats = record_workload(pair, prompts, work / "greedy.parquet", greedy, overwrite=True)
    sampled, _ = record_workload(pair, prompts[:2], work / "t08.parquet", t08, overwrite=True)
    steps["record_s"] = time.perf_counter() - t0
    figures["record"] = {"requests": wl.n_requests, "positions": wl.n_positions,
                         "mean_p_accept": float(wl.require("p_accept", "gpu-check").mean()),
                         "trace_positions_per_s": stats.get("trace_positions_per_s")}
    if device != "cpu":  # the same sampled recording on the CPU: the generator is on the host on both
        cpu_pair = load_pair(draft, target, device="cpu")
        ref, _ = record_workload(cpu_pair, prompts[:2], work / "t08-cpu.parquet",
                                 dataclasses.replace(t08, name="cpu-t08"), overwrite=True)
        ref_ids, gpu_ids = ref.require("token_id", "gpu-check"), sampled.require("token_id", "gpu-check")
        same = [ref_ids[ref.span(r)].tolist() == gpu_ids[sampled.span(r)].tolist() for r in range(ref.n_requests)]
        figures["record"]["sampled_tokens_equal_cpu"] = same
    figures["record"]["prompt_tokens"] = [len(encode_prompt(pair.tokenizer, p.text)) for p in prompts]

    t0 = time.perf_counter()
    specs = ["fixed:2", "fixed:4", "marginal", "tree-static:2-2-1"]
    bench = run_live_bench(console, workload=f"{pair_name}-greedy", per_category=1 if quick else 2, repeats=1 if quick
                           else 3, specs=specs, max_new_tokens=12 if quick else 64, profile=None if not quick else
                           f"cpu-{pair_name}", calibration_prompts=1, resamples=200 if quick else 1000,
                           hf_generate=not quick, micro_repeats=3 if quick else 10, device=device)
    steps["live_bench_s"] = time.perf_counter() - t0
    figures["live_bench"] = bench
    steps["total_s"] = time.perf_counter() - t_start
    figures["seconds"] = {k: round(v, 1) for k, v in steps.items()}
    figures["within_budget"] = steps["total_s"] < BUDGET_S
    atomic_write_text(out, json.dumps(figures, indent=2, default=float) + "\n", overwrite=True)
    return figures

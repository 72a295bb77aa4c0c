"""``specgym bench``: speed benchmarks that print figures (and ratios to their targets)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import specgym.catalogue as catalogue
from specgym.commands.args import k_max_type, positive_int
from specgym.console import make_console
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.specdecode import input_files
from specgym.errors import SpecgymError
from specgym.eval.bench import DEFAULT_SECTIONS, SECTIONS, section
from specgym.eval.bench.live import DEFAULT_PER_CATEGORY, DEFAULT_REPEATS, check_live_specs
from specgym.eval.bench.machine import machine_calibration, machine_line
from specgym.io import atomic_write_text, check_output
from specgym.paths import default_workload_name


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``bench``."""
    p = sub.add_parser("bench", help="speed benchmarks (env, replay, controllers, evaluation, live engine)")
    p.add_argument("--workload", default=None, help="workload name or path (default: the default workload)")
    p.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                   help=f"comma-separated, from: {','.join(SECTIONS)} (default: %(default)s)")
    p.add_argument("--eval-requests", type=positive_int, default=10_000,
                   help="requests of synthetic speclane-mix for the evaluation-speed section (default %(default)s)")
    p.add_argument("--live-prompts", type=positive_int, default=DEFAULT_PER_CATEGORY,
                   help="live section: test prompts per category (default %(default)s)")
    p.add_argument("--live-repeats", type=positive_int, default=DEFAULT_REPEATS,
                   help="live section: runs of every (prompt, controller); a prompt's time is their median "
                        "(default %(default)s)")
    p.add_argument("--live-controllers", default=None,
                   help="live section: comma-separated controller specs (default: plain, fixed:1..6, every "
                        "baseline, the pair's predictor, every shipped policy, and on a greedy workload with ranks "
                        "the trees tree-sequoia, tree-static:2-2-1, tree-static:3-2-1, tree-eagle; tree specs "
                        "(tree-static:W1-W2-.., tree-sequoia[:BUDGET], tree-eagle[:D:B:M], tree-chain:SPEC) decode "
                        "with live tree verification; plain decoding is always added)")
    p.add_argument("--live-profile", default=None,
                   help="live section: cost profile (name or path) for controllers and the replay prediction "
                        "(default: fit one to the engine's rounds on this machine first)")
    p.add_argument("--live-draft", default=None,
                   help="live section: your draft model (folder or hub name; default: the pair the workload was "
                        "recorded from)")
    p.add_argument("--live-target", default=None, help="live section: your target model (with --live-draft)")
    p.add_argument("--live-device", default="cpu", help="live section: cpu, cuda, cuda:1 ... (default %(default)s)")
    p.add_argument("--policy", default=None, help="exported policy for the 'policy' section (name or folder)")
    p.add_argument("--scale-requests", type=positive_int, default=1_000_000,
                   help="scale section: requests of the synthetic sharded workload (default %(default)s)")
    p.add_argument("--scale-shard-requests", type=positive_int, default=20_000,
                   help="scale section: requests per shard (default %(default)s)")
    p.add_argument("--scale-dir", type=Path, default=None,
                   help="scale section: where the synthetic sharded workload is written and reused (default "
                        "out/scale-synthetic-N)")
    p.add_argument("--scale-record-prompts", type=positive_int, default=32,
                   help="scale section: prompts recorded with 1 process and with Ray workers (default %(default)s)")
    p.add_argument("--scale-record-workers", type=positive_int, default=2,
                   help="scale section: Ray workers of the recording comparison (default %(default)s)")
    p.add_argument("--data", type=Path, default=None,
                   help="specdecode-bench / specdecode-eval sections: your copy of SpecDecode-Bench's published "
                        "traces (the folder of combined_<dataset>.jsonl files, or one file)")
    v = p.add_argument_group("vllm section (real vLLM on this CPU; run from the vLLM environment, make vllm-env)")
    v.add_argument("--vllm-concurrency", default="1,4,16", help="concurrent sequences (default %(default)s)")
    v.add_argument("--vllm-k-max", type=k_max_type, default=6,
                   help="num_speculative_tokens: fixed K = 0..this, and the largest K of the table and plugin "
                        "(default %(default)s)")
    v.add_argument("--vllm-requests", type=positive_int, default=8,
                   help="test requests per run (at least 2 x the concurrency) (default %(default)s)")
    v.add_argument("--vllm-max-tokens", type=positive_int, default=None,
                   help="cut every request to this many new tokens (default: the recorded lengths)")
    v.add_argument("--vllm-repeats", type=positive_int, default=3,
                   help="repetitions of every (concurrency, policy) run, interleaved (default %(default)s)")
    v.add_argument("--vllm-plugins", default="goodput",
                   help="batch controller specs run inside vLLM by specgym's plugin, comma-separated (default "
                        "%(default)s)")
    v.add_argument("--vllm-no-mixed", action="store_true", help="skip the mixed-concurrency runs")
    v.add_argument("--vllm-mixed", default="mixed,phased",
                   help="mixed-concurrency cells, comma-separated: mixed (the concurrency changes with the clock, "
                        "--vllm-mixed-segment-ms per concurrency) and phased (each concurrency serves its own cell's "
                        "requests, one phase after another) (default %(default)s)")
    v.add_argument("--vllm-mixed-requests", type=positive_int, default=32,
                   help="requests of a mixed-concurrency run (default %(default)s)")
    v.add_argument("--vllm-mixed-segment-ms", type=positive_int, default=4000,
                   help="duration of each concurrency segment of the mixed runs, ms (default %(default)s)")
    v.add_argument("--vllm-profile", default=None,
                   help="a vLLM-measured batched profile to use (default: measure one first, on train prompts)")
    v.add_argument("--vllm-profile-batches", default="1,2,4,8,16",
                   help="batch sizes of the measured profile (default %(default)s)")
    v.add_argument("--vllm-profile-tokens", type=positive_int, default=48,
                   help="new tokens per request of the profiling runs (default %(default)s)")
    v.add_argument("--vllm-profile-repeats", type=positive_int, default=1,
                   help="profiling runs per (batch, K) cell before the runs (default %(default)s; one more "
                        "pass follows every repetition, for the prediction)")
    v.add_argument("--vllm-eager", action="store_true",
                   help="enforce_eager: no torch.compile (faster engine start, slower steps)")
    v.add_argument("--vllm-out", type=Path, default=Path("out/bench-vllm"),
                   help="folder of the measured profile, plots and vllm.json (default %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        raise SpecgymError(f"--sections: unknown section(s) {unknown}; choose from {','.join(SECTIONS)}")
    console = make_console()
    workload = args.workload or default_workload_name()
    catalogue.resolve("workload", workload)
    if args.json:  # the figures file is rewritten on every run; still never a folder, device or link
        check_output(args.json, True, "file", "--json")
    if args.live_profile is not None:
        load_profile(args.live_profile)  # a bad name fails before anything runs
    if args.live_controllers:
        check_live_specs(args.live_controllers)
    if not args.live_device.startswith(("cpu", "cuda")):
        raise SpecgymError(f"--live-device {args.live_device!r}: expected cpu, cuda or cuda:N")
    if (args.live_draft is None) != (args.live_target is None):
        raise SpecgymError("give both --live-draft and --live-target, or neither")
    if any(s.startswith("specdecode") for s in sections):
        if args.data is None:
            raise SpecgymError("--sections specdecode-bench/specdecode-eval need --data DIR (a copy of "
                               "SpecDecode-Bench's data/llama3.1-8B folder)")
        input_files(args.data)  # a missing folder fails before anything runs
    machine = machine_calibration()
    figures: dict[str, Any] = {"workload": workload, "cpu_count": os.cpu_count(), "machine": machine}
    console.print(f"[bold]specgym bench[/bold] on workload {workload}")
    console.print(machine_line(machine), highlight=False)
    for name in sections:
        figures.update(section(name)(args, workload, console))
    if args.json:
        atomic_write_text(args.json, json.dumps(figures, indent=2, default=float) + "\n", overwrite=True)
    return 0

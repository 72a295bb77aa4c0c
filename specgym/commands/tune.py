"""``specgym tune``: serving at concurrency. ``tune vllm`` computes vLLM's Dynamic SD batch-size table from your
traces and hardware profile; ``tune roofline`` writes a batched profile from public hardware numbers; ``tune compare``
runs batch controllers on a mixed-concurrency workload with paired confidence intervals; ``tune sweep`` runs them at
each of several concurrencies against the best fixed K there (:mod:`specgym.eval.sweep`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specgym.agents.specs import resolve, usage_line
from specgym.baselines.batch_rules import BatchSizeTable
from specgym.commands.args import float_range, int_range, k_max_type, nonneg_int, path_type, positive_int
from specgym.envs.core.batch_cost import Roofline, roofline_profile, save_batch_profile
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.core.switching import SwitchCosts
from specgym.envs.profiles import load_batch_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError
from specgym.eval.batch_eval import compare
from specgym.eval.sweep import plot, sweep, table_lines
from specgym.eval.tune import describe, tune_vllm
from specgym.io import atomic_write_text, check_output
from specgym.paths import default_workload_name

#: ``tune sweep``'s largest default K (where the profile prices K that far; else the profile's largest priced K).
SWEEP_K_MAX = 12


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``tune``."""
    p = sub.add_parser("tune", help="serving at concurrency: vLLM Dynamic SD tables, roofline profiles, batch "
                                    "controller comparisons")
    tsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    v = tsub.add_parser("vllm", help="the batch-size -> K table for vLLM's speculative config")
    v.add_argument("--workload", default=None, help="workload name or path (default: the default workload)")
    v.add_argument("--profile", required=True, help="batched cost profile: name (batch-...) or JSON path")
    v.add_argument("--max-batch", type=int_range(1, 4096), default=512,
                   help="largest concurrency (default %(default)s)")
    v.add_argument("--k-max", type=k_max_type, default=DEFAULT_K_MAX, help="largest K (default %(default)s)")
    v.add_argument("--split", default="all", choices=("train", "val", "test", "all"),
                   help="requests the acceptance comes from (default %(default)s)")
    v.add_argument("--seed", type=nonneg_int, default=0, help="seed of the acceptance draws (default %(default)s)")
    v.add_argument("--out", type=path_type, default=None, help="also write the result as JSON here")
    v.add_argument("--force", action="store_true", help="overwrite --out")
    v.set_defaults(func=_vllm, command="tune vllm")

    r = tsub.add_parser("roofline", help="write a batched cost profile from public hardware and model numbers")
    r.add_argument("--target-params", type=float_range(1.0, lo_open=False), required=True,
                   help="target parameters (e.g. 7e9)")
    r.add_argument("--draft-params", type=float_range(1.0), required=True, help="draft parameters (e.g. 6.8e7)")
    r.add_argument("--bandwidth-gb-s", type=float_range(0.0, lo_open=True), required=True,
                   help="memory bandwidth, GB/s (e.g. 2039 for an A100-80GB)")
    r.add_argument("--peak-tflops", type=float_range(0.0, lo_open=True), required=True,
                   help="dense matrix throughput at the weights' precision, TFLOP/s (e.g. 312)")
    r.add_argument("--bytes-per-param", type=float_range(0.0, lo_open=True), default=2.0,
                   help="2 = fp16/bf16, 1 = int8 (default %(default)s)")
    r.add_argument("--efficiency", type=float_range(0.0, 1.0, lo_open=True), default=0.6,
                   help="share of peak compute reached (default %(default)s)")
    r.add_argument("--fixed-ms", type=float_range(0.0), default=0.2, help="fixed time per forward (default "
                                                                         "%(default)s)")
    r.add_argument("--overhead-ms", type=float_range(0.0), default=0.1,
                   help="fixed work per speculative step (default %(default)s)")
    r.add_argument("--max-batch", type=int_range(1, 4096), default=512, help="largest batch size (default 512)")
    r.add_argument("--k-max", type=k_max_type, default=DEFAULT_K_MAX, help="largest K (default %(default)s)")
    r.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    r.add_argument("--out", type=path_type, required=True, help="the profile JSON to write")
    r.add_argument("--force", action="store_true", help="overwrite --out")
    r.set_defaults(func=_roofline, command="tune roofline")

    c = tsub.add_parser("compare", help="batch controllers on a mixed-concurrency workload (paired CIs)")
    c.add_argument("--workload", default=None, help="workload name or path (default: the default workload)")
    c.add_argument("--profile", required=True, help="batched cost profile: name or JSON path")
    c.add_argument("--controllers", default="goodput,static:2",
                   help=f"comma-separated batch controller specs; {usage_line(('batch',))} (the first is the "
                        "reference of the ratios; default %(default)s)")
    c.add_argument("--replications", type=positive_int, default=10, help="schedules x request sets (default 10)")
    c.add_argument("--requests", type=positive_int, default=256, help="requests per replication (default 256)")
    c.add_argument("--max-batch", type=int_range(1, 4096), default=256, help="largest concurrency (default 256)")
    c.add_argument("--split", default="test", choices=("train", "val", "test", "all"), help="(default test)")
    c.add_argument("--out", type=path_type, default=None, help="also write the result as JSON here")
    c.add_argument("--force", action="store_true", help="overwrite --out")
    c.set_defaults(func=_compare, command="tune compare")

    w = tsub.add_parser("sweep", help="batch controllers across concurrencies vs the best fixed K at each (closed "
                                      "loop, paired CIs, the clairvoyant oracle's headroom)")
    w.add_argument("--workload", default=None, help="workload name or path (default: the default workload)")
    w.add_argument("--profile", required=True, help="batched cost profile: name (e.g. h100-llama31-8b) or JSON path")
    w.add_argument("--concurrency", type=_positive_ints("concurrencies"), default=[1, 4, 16, 64, 128, 256],
                   help="comma-separated concurrencies (default 1,4,16,64,128,256)")
    w.add_argument("--controllers", default="all",
                   help=f"comma-separated batch controller specs, 'all' = every batch controller; "
                        f"{usage_line(('batch',))} (static K are always run: the best fixed K; default %(default)s)")
    w.add_argument("--replications", type=positive_int, default=5, help="request sets per concurrency (default 5)")
    w.add_argument("--k-max", type=k_max_type, default=None,
                   help=f"largest K (default: the profile's largest priced K, at most {SWEEP_K_MAX}; the shipped "
                        f"batch profiles price K up to 8)")
    w.add_argument("--split", default="all", choices=("train", "val", "test", "all"), help="(default all)")
    w.add_argument("--switch-costs", default="off",
                   help="what a K-tier switch costs: ms=X,cooldown=N,captured=0-1-3,slowdown=F (default off)")
    w.add_argument("--capture-sizes", type=_positive_ints("capture sizes"), default=None,
                   help="CUDA-graph capture sizes the batched tokens are padded to, e.g. 1,2,4,8,16,32,64,128,256,512 "
                        "(a linear profile such as h100-llama31-8b; default: the profile's own)")
    w.add_argument("--seed", type=nonneg_int, default=0, help="seed of requests and draws (default %(default)s)")
    w.add_argument("--json", type=path_type, default=None, help="write the result as JSON here")
    w.add_argument("--plot", type=path_type, default=None, help="write a PNG plot here (default: next to --json)")
    w.add_argument("--force", action="store_true", help="overwrite --json and --plot")
    w.set_defaults(func=_sweep, command="tune sweep")  # errors say `specgym tune sweep: error: ...`


def _drafter_note(wl) -> None:
    """Say which drafter serving replays on a workload that holds several (the default one, alone)."""
    names = list(getattr(wl, "drafter_names", ()))
    if len(names) > 1:
        print(f"note: {wl.name} holds drafters {', '.join(names)}: serving replays the default one, {names[0]} "
              f"(its runs and costs)", file=sys.stderr)


def _write(path: Path | None, data: dict, force: bool) -> None:
    if path is not None:
        atomic_write_text(path, json.dumps(data, indent=1, default=float) + "\n", overwrite=force)


def _vllm(args: argparse.Namespace) -> int:
    if args.out is not None:
        check_output(args.out, args.force, "file", suffixes=(".json",))
    profile = load_batch_profile(args.profile)
    wl = cached_workload(args.workload or default_workload_name())
    _drafter_note(wl)
    lo, hi = profile.batch_sizes[0], profile.batch_sizes[-1]
    if args.max_batch > hi:
        print(f"warning: {profile.name} was measured at batch sizes {lo}..{hi}; the table above batch {hi} (up to "
              f"--max-batch {args.max_batch}) is an extrapolation", file=sys.stderr)
    result = tune_vllm(wl, profile, args.max_batch, args.k_max, args.split, args.seed)
    print("\n".join(describe(result)))
    _write(args.out, result, args.force)
    return 0


def _roofline(args: argparse.Namespace) -> int:
    check_output(args.out, args.force, "file", suffixes=(".json",))
    model = Roofline(args.target_params, args.draft_params, args.bytes_per_param, args.bandwidth_gb_s,
                     args.peak_tflops, args.efficiency, args.fixed_ms, args.overhead_ms)
    prof = roofline_profile(args.name or args.out.stem, model, args.max_batch, args.k_max)
    save_batch_profile(prof, args.out, overwrite=args.force)
    knee = args.peak_tflops * 1e12 * args.efficiency / (2 * args.bandwidth_gb_s * 1e9 / args.bytes_per_param)
    print(f"wrote {args.out}: one target step {prof.verify(1, 1):.3f} ms, draft {prof.draft(1):.3f} ms; verification "
          f"turns compute-bound beyond ~{knee:.0f} tokens per forward (batch x (K + 1))")
    return 0


def _positive_ints(what: str):
    """An argparse type: comma-separated integers in 1..4096 (``what`` names them in the message)."""
    def parse(text: str) -> list[int]:
        try:
            out = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not out or any(c < 1 or c > 4096 for c in out):
            raise argparse.ArgumentTypeError(f"{what} must be 1..4096, got {text!r}")
        return sorted(set(out))

    parse.__name__ = what
    return parse


def _sweep(args: argparse.Namespace) -> int:
    png = args.plot or (args.json.with_suffix(".png") if args.json is not None else None)
    for path in (args.json, png):
        if path is not None:
            check_output(path, args.force, "file", "--json" if path == args.json else "--plot",
                         "pass --force to replace it",
                         suffixes=(".json",) if path == args.json else (".png", ".pdf", ".svg"))
    switch = SwitchCosts.parse(args.switch_costs)
    profile = load_batch_profile(args.profile)
    if args.k_max is None:
        args.k_max = min(profile.max_k, SWEEP_K_MAX)
    if args.k_max > profile.max_k:  # an explicit --k-max above what the profile prices
        raise SpecgymError(f"--k-max {args.k_max}: batch profile {profile.name!r} prices K up to {profile.max_k}; "
                           f"pass --k-max {profile.max_k} or less (the default)")
    if args.capture_sizes is not None and profile.linear is None:
        raise SpecgymError(f"--capture-sizes: batch profile {profile.name!r} is a grid; capture sizes pad a linear "
                           f"profile's batched tokens (e.g. h100-llama31-8b)")
    wl = cached_workload(args.workload or default_workload_name())
    _drafter_note(wl)
    specs = resolve(args.controllers, k_max=args.k_max, workload=wl, kinds=("batch",)).rows
    res = sweep(wl, profile, args.concurrency, specs, args.replications, args.k_max, args.split, args.seed,
                None if switch.free else switch,
                progress=lambda c, rep: print(f"  concurrency {c}: replication {rep + 1}/{args.replications}",
                                              file=sys.stderr), capture_sizes=args.capture_sizes)
    print(f"{wl.label} on {profile.name}: closed loop, steady-state tokens/s vs the best fixed K at each concurrency "
          f"(K in 0..{args.k_max}, in hindsight), paired 95% CIs over {args.replications} replications"
          + ("" if switch.free else f"; switch costs {args.switch_costs}") + f" ({res['seconds']:.0f} s)")
    print("\n".join(table_lines(res)))
    _write(args.json, res, args.force)
    if png is not None:
        plot(res, png, overwrite=args.force)
        print(f"wrote {png}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    if args.out is not None:
        check_output(args.out, args.force, "file", suffixes=(".json",))
    specs = resolve(args.controllers, kinds=("batch",)).rows  # a bad spec fails before any work
    for row in specs:
        ctrl = row.controller
        if isinstance(ctrl, BatchSizeTable):  # a K above k_max fails here, before any replication
            ctrl.check_k_max(DEFAULT_K_MAX)
            if ctrl.max_batch < args.max_batch:
                print(f"note: {row.spec} covers batch sizes 1..{ctrl.max_batch}; larger batches (up to --max-batch "
                      f"{args.max_batch}) draft 0", file=sys.stderr)
    profile = load_batch_profile(args.profile)
    wl = cached_workload(args.workload or default_workload_name())
    _drafter_note(wl)
    res = compare(wl, profile, specs, args.replications, args.requests, args.max_batch, args.split)
    print(f"{wl.label} on {profile.name}: {args.replications} mixed-concurrency replications x {args.requests} "
          f"requests (concurrency up to {args.max_batch}); ratios vs {res['reference']} with paired 95% intervals")
    print("| controller | tok/s (mean) | vs reference [95% CI] | replications won |")
    print("|---|---:|---:|---:|")
    for r in sorted(res["rows"], key=lambda r: -r["tok_s_mean"]):
        lo, hi = r["vs_reference_ci95"]
        if r["controller"] == res["reference"]:  # compared with itself: no interval, nothing to win
            print(f"| {r['controller']} (reference) | {r['tok_s_mean']:.1f} | 1.000x | – |")
            continue
        print(f"| {r['controller']} | {r['tok_s_mean']:.1f} | {r['vs_reference']:.3f}x [{lo:.3f}, {hi:.3f}] | "
              f"{r['wins']}/{args.replications} |")
    _write(args.out, res, args.force)
    return 0

"""``specgym eval``: every controller on the same workload, one table and plots."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

import specgym.catalogue as catalogue
from specgym.agents.artifact import list_policies
from specgym.agents.specs import EVAL_KINDS, usage_line
from specgym.commands.args import bootstrap_type, k_max_type, nonneg_int, path_type, positive_int
from specgym.console import Progress, make_console, make_progress
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.workloads.domains import suite_cells
from specgym.envs.workloads.trace_format import cached_workload, open_dataset
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate, resolve_controllers
from specgym.eval.report import drafter_section, markdown_table, without_loops_section, write_report
from specgym.eval.streaming import evaluate_streaming
from specgym.eval.suite import markdown, run_suite
from specgym.io import atomic_dir, check_output
from specgym.paths import default_workload_name


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``eval``."""
    p = sub.add_parser("eval", help="evaluate controllers against each other and the oracle")
    p.add_argument("--workload", default=None, help="workload name or .parquet path (default: the default workload)")
    p.add_argument("--controllers", default="all",
                   help=f"comma-separated controller specs (chain, tree and drafter choice); {usage_line(EVAL_KINDS)} "
                        "(every baseline + fixed:1..k_max, plus the workload's acceptance-predictor, tree and "
                        "drafter-choice rows where it carries their signals or drafters; the report lists what it "
                        "left out and why). Default: %(default)s")
    p.add_argument("--split", default="test", choices=("train", "val", "test", "all"),
                   help="which requests (default %(default)s)")
    p.add_argument("--seed", type=nonneg_int, default=0,
                   help="seed of the common random numbers (default %(default)s)")
    p.add_argument("--k-max", type=k_max_type, default=DEFAULT_K_MAX,
                   help="largest draft cap, 1..16 (default %(default)s)")
    p.add_argument("--profile", default=None, help="cost profile override: name or JSON path (default: the "
                                                   "workload's own)")
    p.add_argument("--max-requests", type=positive_int, default=None,
                   help="evaluate only the first N requests of the split (default: all)")
    p.add_argument("--bootstrap", type=bootstrap_type, default=2000,
                   help="bootstrap resamples for the paired 95%% confidence intervals: 0 = none, else 100..100000 "
                        "(default %(default)s)")
    p.add_argument("--suite", choices=("generalization",), default=None,
                   help="run a suite instead of one workload: 'generalization' evaluates the policies given by "
                        "--controllers (default: the shipped ones) on held-out workload x cost-profile cells against "
                        "every baseline in hindsight")
    p.add_argument("--out", type=path_type, default=None, help="report folder (default out/eval-WORKLOAD or "
                                                          "out/suite-SUITE)")
    p.add_argument("--force", action="store_true", help="replace an existing report folder")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--stream", action="store_true",
                   help="evaluate shard by shard in memory bounded by one shard (a sharded workload folder of "
                        "millions of requests): the same per-request results, a compact report (stream.json: no "
                        "CIs, plots or traces; chain controllers only)")
    p.set_defaults(func=_eval)


def _suite(args: argparse.Namespace) -> int:
    """``specgym eval --suite generalization``: policies on held-out cells (see :mod:`specgym.eval.suite`)."""
    for opt in ("workload", "profile"):
        if getattr(args, opt, None) is not None:
            raise SpecgymError(f"--suite {args.suite} runs its own held-out workload x profile cells: drop "
                               f"--{opt} {getattr(args, opt)}")
    out = check_output(args.out or Path("out") / f"suite-{args.suite}", args.force)
    if args.controllers == "all":
        policies = [f"ppo:{name}" for name in list_policies(kind="chain")]
        if not policies:
            raise SpecgymError("no shipped policy to evaluate: pass --controllers ppo:DIR[,ppo:DIR...]")
    else:
        policies = [s.strip() for s in args.controllers.split(",") if s.strip()]
    cells = suite_cells()
    with make_progress() as bar:  # per held-out cell: the estimate comes from the cells done so far
        task = bar.add_task("suite", total=len(cells))
        started: list[str] = []

        def on_cell(name: str) -> None:
            if started:
                bar.advance(task)
            started.append(name)
            bar.update(task, description=f"suite cell {len(started)}/{len(cells)} {name}")

        report = run_suite(policies, cells=cells, k_max=args.k_max, bootstrap=args.bootstrap, progress=on_cell,
                           max_requests=args.max_requests)
        bar.update(task, completed=len(cells))
    with atomic_dir(out, overwrite=args.force, owner="specgym eval --suite") as tmp:
        (tmp / "suite.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
        (tmp / "suite.md").write_text(markdown(report))
    print(markdown(report))
    print(f"suite report: {out}/suite.md (json: suite.json)")
    return 0


def _eval(args: argparse.Namespace) -> int:
    """Handler of ``specgym eval``."""
    if getattr(args, "suite", None):
        return _suite(args)
    if getattr(args, "stream", False):
        return _stream(args)
    return eval_to_folder(args.workload or default_workload_name(), args.controllers, args.out, split=args.split,
                          seed=args.seed, k_max=args.k_max, profile=args.profile, max_requests=args.max_requests,
                          bootstrap=args.bootstrap, force=args.force, plots=not args.no_plots)


def eval_to_folder(workload: str, controllers: str, out: Path | None, *, split: str = "test", seed: int = 0,
                   k_max: int | None = None, profile: str | None = None, max_requests: int | None = None,
                   bootstrap: int = 2000, force: bool = False, plots: bool = True) -> int:
    """Evaluate ``controllers`` on ``workload``, write the report folder and print the table (``specgym eval``,
    and ``specgym demo``'s last step).

    Args:
        out: The report folder (None: ``out/eval-WORKLOAD``); an existing one is replaced only with ``force``.
        k_max: Largest draft cap (None: the default).
    """
    k_max = DEFAULT_K_MAX if k_max is None else k_max
    out = check_output(out or Path("out") / f"eval-{Path(workload).stem}", force)
    wl = cached_workload(workload)  # bad input fails here, before the progress bar starts
    specs = resolve_controllers(controllers, k_max, wl)
    cfg = EvalConfig(workload=workload, controllers=specs, split=split, seed=seed, k_max=k_max, profile=profile,
                     max_requests=max_requests, bootstrap=bootstrap)
    console = make_console(stderr=True)
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), console=console, transient=True) as bar:

        def progress(name: str, n: int):
            task = bar.add_task(name, total=n)
            return lambda: bar.advance(task)

        report = evaluate(cfg, progress)
    for note in report.get("notes", []):
        console.print(f"note: {note}", style="yellow", highlight=False, markup=False)
    write_report(report, out, overwrite=force, plots=plots)
    meta = report["workload"]
    print(f"{meta['label']} — split {meta['split']}, {meta['requests']} requests, profile {report['profile']['name']}, "
          f"seed {report['seed']}")
    print(markdown_table(report))
    if report.get("best_single_drafter"):
        print("\n" + drafter_section(report))
    if report.get("without_loops"):
        print("\n" + without_loops_section(report))
    for note in report.get("left_out", []):
        print(f"left out of all: {note}")
    print(f"\nreport: {out}/report.md  (json: report.json{', plots: *.png' if plots else ''})")
    return 0


def _stream(args: argparse.Namespace) -> int:
    """``specgym eval --stream``: shard-by-shard evaluation (:mod:`specgym.eval.streaming`)."""
    if args.max_requests is not None:
        raise SpecgymError("--max-requests: not with --stream (split the workload instead)")
    workload = args.workload or default_workload_name()
    path = catalogue.resolve("workload", workload)
    out = check_output(args.out or Path("out") / f"eval-{Path(workload).stem}", args.force)
    shards = len(open_dataset(path).shards) if path.is_dir() else 1
    with make_progress(transient=True) as bar:  # per shard: the estimate comes from the shards done so far
        task = bar.add_task("streaming shards", total=shards)
        report = evaluate_streaming(path, args.controllers, split=args.split, seed=args.seed, k_max=args.k_max,
                                    profile=args.profile, on_shard=lambda i, n: bar.update(task, completed=i + 1))
    per_request = report.pop("per_request_time_ms")
    for note in report.get("notes", []):
        make_console(stderr=True).print(f"note: {note}", style="yellow", highlight=False, markup=False)
    with atomic_dir(out, overwrite=args.force, owner="specgym eval --stream") as tmp:
        (tmp / "stream.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
        np_path = tmp / "per_request_time_ms.npz"
        np.savez_compressed(np_path, **{k.replace(":", "_"): v for k, v in per_request.items()})
    meta = report["workload"]
    print(f"{meta['label']} — split {meta['split']}, {report['requests']} requests in {meta['shards']} shard(s), "
          f"seed {report['seed']} (streamed)")
    print(f"{'controller':<22}{'tok/s':>12}{'vs best fixed':>15}{'oracle ratio':>14}")
    for row in [*report["rows"], report["informed_oracle"]]:
        print(f"{row['spec']:<22}{row['throughput_tok_s']:>12.1f}{row['speedup_vs_best_fixed']:>15.3f}"
              f"{row['oracle_ratio']:>14.3f}")
    print(f"{'oracle':<22}{report['oracle']['throughput_tok_s']:>12.1f}"
          f"{report['oracle']['speedup_vs_best_fixed']:>15.3f}{1.0:>14.3f}")
    print(f"\nreport: {out}/stream.json (per-request times: per_request_time_ms.npz)")
    return 0

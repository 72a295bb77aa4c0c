"""``specgym eval``: every controller on the same workload, one table and plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from specgym.paths import default_workload_name


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``eval``."""
    p = sub.add_parser("eval", help="evaluate controllers against each other and the oracle")
    p.add_argument("--workload", default=None, help="workload name or .parquet path (default: the default workload)")
    p.add_argument("--controllers", default="all",
                   help="comma-separated specs: fixed:K, assc, speclane, hf-heuristic, confidence:TAU|adaptive, "
                        "cumulative:H, entropy, ucb, ppo:DIR; 'all' = every baseline + fixed:1..k_max")
    p.add_argument("--split", default="test", help="train, val, test or all (default test)")
    p.add_argument("--seed", type=int, default=0, help="seed of the common random numbers")
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--profile", default=None, help="cost profile override (name or JSON path)")
    p.add_argument("--max-requests", type=int, default=None, help="evaluate only the first N requests of the split")
    p.add_argument("--out", type=Path, default=None, help="report folder (default out/eval-WORKLOAD)")
    p.add_argument("--force", action="store_true", help="replace an existing report folder")
    p.add_argument("--no-plots", action="store_true")
    p.set_defaults(func=run_eval_command)


def run_eval_command(args: argparse.Namespace) -> int:
    """Handler of ``specgym eval`` (also used by ``specgym demo``)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import specgym.agents  # noqa: F401  (registers the ppo: controller prefix)
    from specgym.eval.harness import EvalConfig, evaluate
    from specgym.eval.report import markdown_table, write_report
    from specgym.io import refuse_overwrite

    workload = args.workload or default_workload_name()
    out = args.out or Path("out") / f"eval-{Path(workload).stem}"
    refuse_overwrite(out, args.force)
    cfg = EvalConfig(workload=workload, controllers=args.controllers, split=args.split, seed=args.seed,
                     k_max=args.k_max, profile=args.profile, max_requests=args.max_requests)
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:

        def progress(name: str, n: int):
            task = bar.add_task(name, total=n)
            return lambda: bar.advance(task)

        report = evaluate(cfg, progress)
    write_report(report, out, overwrite=args.force, plots=not args.no_plots)
    wl = report["workload"]
    print(f"{wl['label']} — split {wl['split']}, {wl['requests']} requests, profile {report['profile']['name']}, "
          f"seed {report['seed']}")
    print(markdown_table(report))
    print(f"\nreport: {out}/report.md  (json: report.json, plots: *.png)")
    return 0

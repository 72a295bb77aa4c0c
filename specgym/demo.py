"""``specgym demo``: the main job on the shipped default workload."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``demo``."""
    p = sub.add_parser("demo", help="run the whole story on the shipped default workload")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from specgym.cli_workloads import summarize
    from specgym.envs.spec_env import cached_workload
    from specgym.envs.trace_engine import TraceEngine, VectorReplay
    from specgym.paths import default_workload_name

    console = Console()
    wl = cached_workload(default_workload_name())
    console.print(summarize(wl))
    test = wl.split_indices("test")
    engine = TraceEngine(wl, k_max=8, seed=0)
    console.print(f"\nfixed-K replay on the test split ({len(test)} requests, {wl.label}):")
    for k in range(0, 9):
        v = VectorReplay(engine, test)
        v.run_fixed(k)
        tokens = int((v.pos - v.start).sum())
        console.print(f"  K={k}: {tokens / v.time_ms.sum() * 1000:7.2f} tok/s, "
                      f"speedup vs AR {tokens * engine.t_ar / v.time_ms.sum():.3f}x")
    return 0

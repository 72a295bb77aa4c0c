"""``specgym bench``: speed benchmarks that print figures (and ratios to their targets).

Sections: workload load time, single-env steps/s (random actions, K and token mode), vectorised replay
rounds/s, controller decision overhead, evaluation speed, exported-policy overhead, and (with ``--live``) the
live engine. Targets are the project's (README "Speed"); a missed target is reported, never hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specgym.paths import default_workload_name

TARGETS = {
    "env_steps_per_s": 50_000,
    "vector_rounds_per_s": 5_000_000,
    "controller_us_rule": 5.0,
    "controller_us_speclane": 20.0,
    "policy_us": 20.0,
    "eval_10k_s": 60.0,
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``bench``."""
    p = sub.add_parser("bench", help="speed benchmarks (env, replay, controllers, evaluation, live engine)")
    p.add_argument("--workload", default=None, help="workload name or path (default: the default workload)")
    p.add_argument("--sections", default="load,env,vector,controllers,eval,policy",
                   help="comma-separated: load,env,vector,controllers,eval,policy,live")
    p.add_argument("--eval-requests", type=int, default=10_000,
                   help="requests of synthetic speclane-mix for the evaluation-speed section")
    p.add_argument("--policy", default=None, help="exported policy dir for the 'policy' section")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    p.set_defaults(func=_run)


def _timeit(fn: Callable[[], int], min_time: float = 0.5) -> float:
    """Operations per second of ``fn`` (which returns how many operations it did), best of 3."""
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        n = fn()
        dt = time.perf_counter() - t0
        while dt < min_time / 3:
            n += fn()
            dt = time.perf_counter() - t0
        best = max(best, n / dt)
    return best


def bench_load(workload: str) -> dict[str, Any]:
    """Cold load + validation time of a workload file."""
    from specgym.envs.trace_format import load_workload, resolve_workload_path

    path = resolve_workload_path(workload)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        wl = load_workload(path)
        times.append(time.perf_counter() - t0)
    return {"workload": wl.label, "requests": wl.n_requests, "tokens": wl.n_positions,
            "load_s": min(times), "file_mb": path.stat().st_size / 1e6}


def bench_env(workload: str, steps: int = 100_000) -> dict[str, Any]:
    """Steps/s of ``gymnasium.make`` environments under random actions (resets included)."""
    import gymnasium as gym

    import specgym  # noqa: F401  (registers the ids)

    out = {}
    for key, env_id in (("k", "specgym/SpecDecode-v0"), ("token", "specgym/SpecDecodeToken-v0")):
        env = gym.make(env_id, workload=workload)
        env.reset(seed=0)
        space = env.action_space
        actions = np.random.default_rng(0).integers(space.start, space.start + space.n, steps).tolist()

        def run() -> int:
            for a in actions:
                if env.step(a)[2]:
                    env.reset()
            return len(actions)

        out[f"env_{key}_steps_per_s"] = _timeit(run, 1.0)
    return out


def bench_vector(workload: str) -> dict[str, Any]:
    """Rounds/s of the vectorised replay (all requests at once, fixed K=4, one process)."""
    from specgym.envs.spec_env import cached_workload
    from specgym.envs.trace_engine import TraceEngine, VectorReplay

    engine = TraceEngine(cached_workload(workload), k_max=8, seed=0)
    engine.all_runs()

    def run() -> int:
        v = VectorReplay(engine)
        v.run_fixed(4)
        return int(v.rounds.sum())

    return {"vector_rounds_per_s": _timeit(run, 1.0)}


def _print(console, title: str, rows: list[tuple[str, str, str]]) -> None:
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    for col in ("figure", "measured", "target"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    console.print(table)


def _vs(value: float, target: float, higher_better: bool = True) -> str:
    ratio = value / target if higher_better else target / value
    ok = ratio >= 1.0
    return f"{'>=' if higher_better else '<='} {target:,.0f} ({ratio:.1f}x {'met' if ok else 'MISSED'})"


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from specgym.envs.trace_format import resolve_workload_path

    console = Console()
    workload = args.workload or default_workload_name()
    resolve_workload_path(workload)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    figures: dict[str, Any] = {"workload": workload, "cpu_count": os.cpu_count()}
    console.print(f"[bold]specgym bench[/bold] on workload {workload} ({os.cpu_count()} CPUs)")
    if "load" in sections:
        f = bench_load(workload)
        figures.update(f)
        _print(console, "workload load", [(f"load {f['requests']} requests ({f['file_mb']:.1f} MB)",
                                           f"{f['load_s'] * 1000:.1f} ms", "well under 1 s")])
    if "env" in sections:
        f = bench_env(workload)
        figures.update(f)
        _print(console, "single environment (gymnasium.make, random actions)", [
            ("SpecDecode-v0 steps/s", f"{f['env_k_steps_per_s']:,.0f}",
             _vs(f["env_k_steps_per_s"], TARGETS["env_steps_per_s"])),
            ("SpecDecodeToken-v0 steps/s", f"{f['env_token_steps_per_s']:,.0f}",
             _vs(f["env_token_steps_per_s"], TARGETS["env_steps_per_s"])),
        ])
    if "vector" in sections:
        f = bench_vector(workload)
        figures.update(f)
        _print(console, "vectorised replay (one process)", [
            ("rounds/s", f"{f['vector_rounds_per_s']:,.0f}", _vs(f["vector_rounds_per_s"], TARGETS["vector_rounds_per_s"]))])
    for name, hook in _extra_sections().items():
        if name in sections:
            figures.update(hook(args, workload, console))
    if args.json:
        from specgym.io import atomic_write_text

        atomic_write_text(args.json, json.dumps(figures, indent=2, default=float) + "\n", overwrite=True)
    return 0


def _extra_sections() -> dict[str, Callable]:
    """Sections implemented next to the code they measure (imported lazily)."""
    sections: dict[str, Callable] = {}
    for name, target in (
        ("controllers", "specgym.eval.bench_eval:bench_controllers_section"),
        ("eval", "specgym.eval.bench_eval:bench_eval_section"),
        ("policy", "specgym.agents.bench_policy:bench_policy_section"),
        ("live", "specgym.bench_live:bench_live_section"),
    ):
        module, func = target.split(":")

        def hook(args, workload, console, module=module, func=func):
            import importlib

            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                console.print(f"[yellow]section skipped: {exc}[/yellow]")
                return {}
            return getattr(mod, func)(args, workload, console)

        sections[name] = hook
    return sections

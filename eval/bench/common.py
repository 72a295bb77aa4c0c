"""What every benchmark section shares: the project's speed targets, a timer and the figure tables."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.table import Table

TARGETS = {
    "env_steps_per_s": 50_000,
    "vector_rounds_per_s": 5_000_000,
    "controller_us_rule": 5.0,
    "controller_us_speclane": 20.0,
    "policy_us": 20.0,
    "eval_10k_s": 60.0,
}


def timeit(fn: Callable[[], int], min_time: float = 0.5) -> float:
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


def print_table(console: Any, title: str, rows: list[tuple[str, str, str]]) -> None:
    """A ``figure / measured / target`` table."""
    table = Table(title=title, show_header=True, header_style="bold")
    for col in ("figure", "measured", "target"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    console.print(table)


def versus(value: float, target: float, higher_better: bool = True) -> str:
    """``>= 50,000 (4.4x met)``: a figure against its target, as a ratio."""
    ratio = value / target if higher_better else target / value
    ok = ratio >= 1.0
    return f"{'>=' if higher_better else '<='} {target:,.0f} ({ratio:.1f}x {'met' if ok else 'MISSED'})"

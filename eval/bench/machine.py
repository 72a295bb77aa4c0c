"""A one-line machine calibration for ``specgym bench``: absolute figures travel between machines only with it.

Machines of one kind differ by ~3x in absolute speed (measured: plain decoding 72 vs 149 tok/s, the test suite 9 min
vs 3.5 min on two 2-core EPYC VMs), so every absolute figure is named with its machine and the bench prints three
quick probes a reader can scale by: a float32 matrix multiply (compute), a large array copy (memory bandwidth) and
a pure-Python loop (interpreter speed, which bounds the per-decision cost of controllers). Ratios measured in one
run need no scaling.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from specgym.envs.engines.live.profiler import cpu_name


def _best_of(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def machine_calibration() -> dict[str, Any]:
    """CPU, cores and three probes: numpy float32 GFLOP/s (512x512 matmul), copy bandwidth GB/s (64 MiB), and
    millions of pure-Python loop iterations per second. Takes about half a second."""
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    gflops = 2 * 512**3 / _best_of(lambda: a @ a) / 1e9
    big = np.ones(16 * 2**20, dtype=np.float32)
    dst = np.empty_like(big)
    gbs = 2 * big.nbytes / _best_of(lambda: np.copyto(dst, big)) / 1e9

    def loop() -> None:
        s = 0
        for i in range(200_000):
            s += i

    py = 0.2 / _best_of(loop)
    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "numpy_gflops": round(gflops, 1),
            "copy_gb_s": round(gbs, 1), "python_mloops_s": round(py, 1)}


def machine_line(m: dict[str, Any]) -> str:
    """``machine: AMD EPYC (2 CPUs); numpy fp32 matmul 45.1 GFLOP/s, copy 9.8 GB/s, Python loop 31.0 M/s``."""
    return (f"machine: {m['cpu']} ({m['cpu_count']} CPUs); numpy fp32 matmul {m['numpy_gflops']} GFLOP/s, "
            f"copy {m['copy_gb_s']} GB/s, Python loop {m['python_mloops_s']} M iterations/s")

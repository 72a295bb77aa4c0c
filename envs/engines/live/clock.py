"""Device-agnostic timing: the one place that knows how to wait for an accelerator before reading a clock.

A GPU (CUDA, ROCm through torch's ``cuda``), Apple's MPS or Intel's XPU runs kernels asynchronously: a clock read
right after a forward measures the launch, not the work. :func:`synchronize` waits for the device's queue (a no-op
on the CPU), and :func:`timed` reads a clock after it; every place that times a round (the live engine, the
``generate()`` integration, the live bench, the profiler) goes through them.

Sampling never depends on the device: :func:`host_generator` is a CPU ``torch.Generator`` and
:func:`host_multinomial` draws on the host from probabilities computed anywhere, so one seed gives the same sampled
tokens on a GPU as on the CPU up to the float rounding of the probabilities themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def synchronize(device: Any) -> None:
    """Wait until ``device`` (a ``torch.device`` or its name) has finished its queued work (no-op on the CPU)."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "cpu":
        return
    import torch

    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    elif kind == "mps" and hasattr(torch, "mps"):
        torch.mps.synchronize()
    elif kind == "xpu" and hasattr(torch, "xpu"):
        torch.xpu.synchronize(device)


def syncer(device: Any) -> Callable[[], None]:
    """A no-argument :func:`synchronize` for ``device`` (the profiler's and the bench's ``sync`` callbacks)."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return (lambda: None) if kind == "cpu" else (lambda: synchronize(device))


def timed(device: Any, clock: Callable[[], float] = time.perf_counter) -> float:
    """``clock()`` once ``device`` is idle: the time every earlier kernel has finished by."""
    synchronize(device)
    return clock()


def host_generator(seed: int) -> Any:
    """A CPU ``torch.Generator`` seeded with ``seed``: the sampling stream of one request, on any device."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    return gen


def host_multinomial(probs: Any, generator: Any, n: int = 1) -> Any:
    """``torch.multinomial(probs, n, generator=generator)`` drawn on the generator's device (the host), returned on
    the device of ``probs``."""
    import torch

    gdev = getattr(generator, "device", None)
    if generator is None or gdev is None or gdev == probs.device:
        return torch.multinomial(probs, n, generator=generator)
    return torch.multinomial(probs.to(gdev, torch.float32), n, generator=generator).to(probs.device)


def host_uniform(generator: Any) -> float:
    """One ``U(0, 1)`` draw from ``generator`` (on its own device)."""
    import torch

    return float(torch.rand((), generator=generator, device=getattr(generator, "device", None) or "cpu"))

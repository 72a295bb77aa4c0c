"""A batched cost profile measured from vLLM's own steps (``specgym profile --engine vllm``).

For every batch size ``b`` on the grid and every ``K = 0..k_max`` the engine serves ``b`` requests at concurrency
``b`` with a fixed K (vLLM's Dynamic SD table, one range), and the hook logs every engine-core step. The step time of
a cell, ``S(b, K)``, is the median period (one step's start to the next) over its steady steps: all ``b`` sequences
decoding, no prefill in the step, each verifying ``K`` drafts. It includes everything vLLM does in a step: the
target forward over ``b * (K + 1)`` tokens, rejection sampling, the drafter (its first pass over the verified
tokens, then ``K - 1`` single-token passes), scheduling and output processing.

The profile stores the measured steps whole: ``verify_ms[b][K] = S(b, K)`` with ``draft_ms = overhead_ms = 0``, so
``step_time(b, K) = S(b, K)`` exactly (the drafter is not timed apart from the target: the hook sees engine steps).
``K = 0`` is the speculative engine's step without drafts (its drafter still runs its first pass, as vLLM's table
does at K = 0); plain decoding in an engine without speculation is ``hardware["plain_step_ms"]``
(:func:`plain_profile`). A new request's prefill adds to its step ``prefill_ms_per_request + prefill_ms_per_token *
prompt tokens`` (a least-squares line over the steps that carry prefills, beyond a steady step of the same batch
and drafts), stored in ``hardware`` too.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.engines.live.profiler import cpu_name
from specgym.envs.engines.serving.vllm_engine import VllmEngine, VllmEngineConfig, require_vllm
from specgym.errors import SpecgymError


@dataclass(frozen=True)
class PrefillCost:
    """The extra time of a step that prefills new requests: ``per_request * n + per_token * prompt tokens``."""

    per_request_ms: float = 0.0
    per_token_ms: float = 0.0

    def ms(self, prompt_lens: Sequence[int] | np.ndarray) -> float:
        """Total prefill time of requests with these prompt lengths."""
        lens = np.asarray(prompt_lens, dtype=np.float64)
        return float(len(lens) * self.per_request_ms + self.per_token_ms * lens.sum())

    @classmethod
    def of(cls, profile: BatchCostProfile) -> PrefillCost:
        """The prefill cost a vLLM-measured profile carries (zero for other profiles)."""
        hw = profile.hardware
        return cls(float(hw.get("prefill_ms_per_request", 0.0)), float(hw.get("prefill_ms_per_token", 0.0)))


#: The two clocks a step is timed with: wall (the period from one step's start to the next) and cpu (thread CPU time
#: of the engine core's scheduling plus the worker's forward and sampling: the step without waiting for a CPU).
CLOCKS = ("wall", "cpu")


def step_costs(log: dict[str, Any], clock: str = "wall") -> np.ndarray:
    """Per step of a run's log: its cost in ms by ``clock`` (NaN where unknown: the last step's period; every step
    when the worker's CPU times did not align)."""
    n = len(log["start_s"])
    if clock == "wall":
        out = np.full(n, np.nan)
        out[:-1] = np.diff(np.asarray(log["start_s"], dtype=np.float64)) * 1000.0
        return out
    worker = log.get("worker_cpu_ms") or []
    if len(worker) != n:
        return np.full(n, np.nan)
    return np.asarray(log["core_cpu_ms"], dtype=np.float64) + np.asarray(worker, dtype=np.float64)


def steady_steps(log: dict[str, Any], batch: int, k: int, clock: str = "wall") -> np.ndarray:
    """Costs (ms) of the steps of a fixed-K run at ``batch`` sequences, all decoding and verifying ``k`` drafts,
    without prefill."""
    cost = step_costs(log, clock)
    ok = ((np.asarray(log["batch"]) == batch) & (np.asarray(log["prefill_tokens"]) == 0)
          & (np.asarray(log["drafts"]) == batch * k) & np.isfinite(cost))
    return cost[ok]


def composition_ms(step_ms: dict[tuple[int, int], float], batch: int, drafts_per_seq: float) -> float | None:
    """The steady step cost of ``batch`` sequences verifying ``drafts_per_seq`` drafts each on average, interpolated
    between the measured K (the batch replay prices a mixed step the same way); ``None`` off the measured batches."""
    ks = sorted(k for b, k in step_ms if b == batch)
    if not ks:
        return None
    return float(np.interp(drafts_per_seq, ks, [step_ms[(batch, k)] for k in ks]))


def prefill_excess(log: dict[str, Any], step_ms: dict[tuple[int, int], float],
                   clock: str = "wall") -> list[tuple[int, int, float]]:
    """``(new requests, prompt tokens, excess ms)`` of every step that prefilled: its cost beyond a steady step of
    the same batch and drafts (:func:`composition_ms`: a prefill step drafts for its decoding sequences only, so
    the run's own K would overstate the baseline and understate the prefill)."""
    cost = step_costs(log, clock)
    out = []
    for i, c in enumerate(cost.tolist()):
        tokens, b = int(log["prefill_tokens"][i]), int(log["batch"][i])
        if not tokens or not np.isfinite(c):
            continue
        base = composition_ms(step_ms, b, int(log["drafts"][i]) / b)
        if base is not None:
            out.append((int(log["new_requests"][i]), tokens, c - base))
    return out


def fit_prefill(rows: Sequence[tuple[int, int, float]]) -> PrefillCost:
    """Least squares ``excess = per_request * n + per_token * tokens``, both >= 0 (a term that comes out negative
    is dropped and the other refitted alone)."""
    if len(rows) < 2:
        return PrefillCost()
    a = np.array([[n, t] for n, t, _ in rows], dtype=np.float64)
    y = np.array([e for *_, e in rows], dtype=np.float64)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    if (coef >= 0).all():
        return PrefillCost(float(coef[0]), float(coef[1]))
    keep = int(np.argmax(coef))
    one = max(float(a[:, keep] @ y / (a[:, keep] @ a[:, keep])), 0.0)
    return PrefillCost(one, 0.0) if keep == 0 else PrefillCost(0.0, one)


def build_profile(name: str, batch_sizes: Sequence[int], spec_ms: dict[tuple[int, int], float],
                  plain_ms: dict[int, float], k_max: int, prefill: PrefillCost, description: str,
                  hardware: dict[str, Any]) -> BatchCostProfile:
    """The profile of the module docstring from the cells' median step times."""
    missing: list[tuple[int, int | str]] = [(b, k) for b in batch_sizes for k in range(k_max + 1)
                                            if (b, k) not in spec_ms]
    missing += [(b, "plain") for b in batch_sizes if b not in plain_ms]
    if missing:
        raise SpecgymError(f"vLLM profile {name!r}: no steady steps measured for (batch, K) = {missing}; serve more "
                           "tokens per request")
    sizes = tuple(int(b) for b in batch_sizes)
    verify = tuple(tuple(float(spec_ms[(b, k)]) for k in range(k_max + 1)) for b in sizes)
    zeros = tuple(0.0 for _ in sizes)
    hw = {**hardware, "plain_step_ms": [float(plain_ms[b]) for b in sizes],
          "prefill_ms_per_request": prefill.per_request_ms, "prefill_ms_per_token": prefill.per_token_ms}
    return BatchCostProfile(name, sizes, zeros, verify, zeros, source="measured", description=description,
                            hardware=hw)


def step_profile(name: str, cells: dict[tuple[int, int], float], k_max: int, description: str,
                 hardware: dict[str, Any], line: bool = True) -> BatchCostProfile:
    """A batched profile from median step times per ``(batch, K)`` cell, K measured on a sparse grid (0, 1, 2, 4, ...):
    the steps of a proposer drafting exactly K per row (drafting inside ``verify_ms``, as :func:`build_profile`).

    With ``line``, each batch size's medians are replaced by their least-squares line in K (slope >= 0): on a machine
    that other jobs share one cell's median can be off by a third, and a rule that prices the step K by K would
    follow the noise. Between the measured K the line (or, without ``line``, linear interpolation) gives every
    ``K = 0..k_max``. The medians are kept in ``hardware`` (``measured_ks``, ``measured_step_ms``).

    Raises:
        SpecgymError: A batch size lacks a K of the grid, or the grid does not reach ``k_max``.
    """
    sizes = sorted({b for b, _ in cells})
    ks = sorted({k for _, k in cells})
    missing = [(b, k) for b in sizes for k in ks if (b, k) not in cells]
    if missing or not ks or ks[0] != 0 or ks[-1] < k_max:
        raise SpecgymError(f"step profile {name!r}: need every batch at K = 0 .. {k_max}'s grid; measured {ks}, "
                           f"missing (batch, K) = {missing}")
    raw = np.array([[float(cells[(b, k)]) for k in ks] for b in sizes])
    x, every = np.asarray(ks, dtype=np.float64), np.arange(k_max + 1, dtype=np.float64)
    if line and len(ks) > 1:
        slope = np.maximum(((raw - raw.mean(1, keepdims=True)) @ (x - x.mean())) / ((x - x.mean()) ** 2).sum(), 0)
        grid = raw.mean(1, keepdims=True) + slope[:, None] * (every - x.mean())
    else:
        grid = np.array([np.interp(every, x, row) for row in raw])
    grid = np.maximum(grid, 1e-6)
    hw = {**hardware, "measured_ks": ks, "measured_step_ms": raw.tolist(), "fit": "line in K" if line else "none"}
    zeros = tuple(0.0 for _ in sizes)
    return BatchCostProfile(name, tuple(sizes), zeros, tuple(tuple(r) for r in grid.tolist()), zeros,
                            source="measured", description=description, hardware=hw)


def plain_profile(profile: BatchCostProfile) -> BatchCostProfile:
    """The same profile with K = 0 priced as an engine without speculation (``hardware["plain_step_ms"]``)."""
    plain = profile.hardware.get("plain_step_ms")
    if plain is None:
        raise SpecgymError(f"profile {profile.name!r} has no plain_step_ms (not measured from vLLM)")
    verify = tuple((float(p), *row[1:]) for p, row in zip(plain, profile.verify_ms))
    return dataclasses.replace(profile, name=f"{profile.name}-plain", verify_ms=verify,
                               description=f"{profile.description} (K = 0: an engine without speculation)")


def vllm_hardware(version: str, eager: bool, threads: int | None = None) -> dict[str, Any]:
    """What a reader needs to compare vLLM profiles."""
    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform(), "engine": "vllm",
            "vllm": version, "enforce_eager": eager, "device": "cpu", "dtype": "float32", "clock": "wall",
            "omp_threads": threads}


@dataclass
class CellTimes:
    """Steady step costs per ``(batch, K)`` cell and the prefill rows of one engine's profiling runs, per clock."""

    steps: dict[str, dict[tuple[int, int], list[float]]] = dataclasses.field(
        default_factory=lambda: {c: {} for c in CLOCKS})
    prefill: dict[str, list[tuple[int, int, float]]] = dataclasses.field(
        default_factory=lambda: {c: [] for c in CLOCKS})

    def medians(self, clock: str = "wall") -> dict[tuple[int, int], float]:
        return {c: float(np.median(v)) for c, v in self.steps[clock].items() if v}

    def merged(self, other: CellTimes) -> CellTimes:
        """Both sets of profiling runs together (passes measured at different times of one benchmark)."""
        out = CellTimes()
        for clock in CLOCKS:
            for src in (self, other):
                for cell, v in src.steps[clock].items():
                    out.steps[clock].setdefault(cell, []).extend(v)
                out.prefill[clock].extend(src.prefill[clock])
        return out


def measure_cells(engine: Any, prompts: Sequence[Sequence[int]], batch_sizes: Sequence[int], ks: Sequence[int],
                  tokens: int, repeats: int = 1, proposer: Callable[[int], str] | None = None) -> CellTimes:
    """Serve ``b`` prompts at concurrency ``b`` with a fixed K for every cell (round-robin over the cells, so that a
    machine whose speed drifts hits every cell alike) and collect the steady step costs on both clocks.

    Args:
        engine: A :class:`~specgym.envs.engines.serving.vllm_engine.VllmEngine` (``ks`` = ``[0]`` without speculation).
        prompts: Prompt token ids to draw from (cycled).
        tokens: New tokens per request.
        proposer: A ``custom_class`` engine (specgym's proposer): the proposer spec that drafts exactly K per row
            (``fill:K``), instead of the Dynamic SD table.
    """
    out = CellTimes()
    spec = proposer is None and engine.config.k_max > 0
    runs: list[dict[str, Any]] = []
    offset = 0
    for _ in range(repeats):
        for b in batch_sizes:
            for k in ks:
                chosen = [prompts[(offset + i) % len(prompts)] for i in range(b)]
                offset += b
                if proposer is not None:
                    run = engine.serve(chosen, [tokens] * b, proposer=proposer(k), schedule=[(1e12, b)])
                else:
                    table = [k] * (engine.config.max_num_seqs + 1) if spec else None
                    run = engine.serve(chosen, [tokens] * b, table=table, schedule=[(1e12, b)])
                runs.append(run.log)
                for clock in CLOCKS:
                    out.steps[clock].setdefault((b, k), []).extend(steady_steps(run.log, b, k, clock).tolist())
    for clock in CLOCKS:
        medians = out.medians(clock)
        for log in runs:
            out.prefill[clock] += prefill_excess(log, medians, clock)
    return out


def measure_vllm_profile(target: str, draft: str, prompts: Sequence[Sequence[int]], batch_sizes: Sequence[int],
                         k_max: int, tokens: int, repeats: int = 1, eager: bool = False,
                         name: str = "batch-vllm-cpu-midpair", clock: str = "wall") -> BatchCostProfile:
    """Measure the profile of the module docstring: an engine without speculation (plain steps), then one with
    ``num_speculative_tokens = k_max`` (every K), one at a time."""
    version = require_vllm()
    sizes = tuple(int(b) for b in batch_sizes)
    base = dict(target=target, draft=draft, max_num_seqs=max(sizes), eager=eager)
    with VllmEngine(VllmEngineConfig(k_max=0, **base)) as eng:  # type: ignore[arg-type]
        plain = measure_cells(eng, prompts, sizes, [0], tokens, repeats)
    with VllmEngine(VllmEngineConfig(k_max=k_max, **base)) as eng:  # type: ignore[arg-type]
        spec = measure_cells(eng, prompts, sizes, range(k_max + 1), tokens, repeats)
    return profile_from_cells(name, sizes, spec, plain, k_max, tokens, version, eager, clock)


def profile_from_cells(name: str, batch_sizes: Sequence[int], spec: CellTimes, plain: CellTimes, k_max: int,
                       tokens: int, version: str, eager: bool, clock: str = "wall") -> BatchCostProfile:
    """The batched profile of the two engines' profiling runs, on one clock."""
    spec_ms = spec.medians(clock)
    plain_ms = {b: v for (b, _), v in plain.medians(clock).items()}
    prefill = fit_prefill(spec.prefill[clock] + plain.prefill[clock])
    what = ("median step period (wall clock)" if clock == "wall" else
            "median step CPU time (engine-core scheduling + worker forward and sampling, thread CPU time: the step "
            "without waiting for a CPU)")
    desc = (f"measured from vLLM {version} engine steps on this CPU (draft_model proposer): {what} at batch b x K "
            f"over steady decode steps, {tokens} new tokens per request, {'eager' if eager else 'torch.compile'}; "
            "drafting is inside verify_ms (steps are timed whole)")
    hw = {**vllm_hardware(version, eager), "clock": clock}
    return build_profile(name, batch_sizes, spec_ms, plain_ms, k_max, prefill, desc, hw)

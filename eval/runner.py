"""Run one controller over a set of requests of a replay engine and collect per-request totals.

Each request is decoded by :func:`~specgym.envs.core.request.drive`, the loop the live engine and the transformers
integration run too. Requests are served one at a time, in order, so controllers that keep state across requests
(the bandit) see them as a server would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from specgym.baselines.fixed import FixedK
from specgym.envs.core.acceptance_predictor import SignalSource
from specgym.envs.core.controller import Controller
from specgym.envs.core.request import drive
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.paths import MODEL_ROOTS


@dataclass
class RunResult:
    """Per-request totals of one controller on one set of requests (arrays aligned with ``requests``).

    Attributes:
        name: Controller name.
        requests: Workload indices of the requests, in serving order.
        tokens: Tokens produced per request (= N).
        time_ms: Total simulated time per request.
        rounds: Rounds per request.
        drafted: Draft tokens proposed per request.
        accepted: Draft tokens accepted per request.
        traces: For traced requests, ``{request_index: [(position, planned_k, drafted, accepted), ...]}``.
        notes: One-line notes on how the controller ran (an acceptance predictor's fallback: see
            :meth:`~specgym.envs.core.acceptance_predictor.AcceptancePredictor.for_source`).
    """

    name: str
    requests: np.ndarray
    tokens: np.ndarray
    time_ms: np.ndarray
    rounds: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray
    traces: dict[int, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def grouped_notes(results: Iterable[RunResult]) -> list[str]:
    """Every distinct note of ``results``, once, prefixed with the rows it concerns."""
    rows: dict[str, list[str]] = {}
    for res in results:
        for note in res.notes:
            names = rows.setdefault(note, [])
            if res.name not in names:
                names.append(res.name)
    return [f"{', '.join(names)}: {note}" for note, names in rows.items()]


def bind_to_workload(controller: object, workload: object) -> list[str]:
    """Fit a predictor-reading controller to the workload it is about to serve (its ``bind_signals``); the note of
    a fallback, as a list (empty when there is none or the controller reads no predictor)."""
    bind = getattr(controller, "bind_signals", None)
    note = bind(SignalSource.of_workload(workload, MODEL_ROOTS)) if bind is not None else None
    return [note] if note else []


def concat_runs(name: str, parts: Sequence[RunResult]) -> RunResult:
    """Runs over consecutive request sets (shards) as one, requests numbered in serving order."""
    def cat(field: str) -> np.ndarray:
        return np.concatenate([getattr(p, field) for p in parts])

    tokens = cat("tokens")
    return RunResult(name, np.arange(len(tokens)), tokens, cat("time_ms"), cat("rounds"), cat("drafted"),
                     cat("accepted"))


def run_fixed_vectorised(engine: TraceEngine, requests: np.ndarray, k: int, name: str | None = None) -> RunResult:
    """Fixed K over all requests at once (identical results to the scalar loop; tested)."""
    v = VectorReplay(engine, requests)
    v.run_fixed(k)
    return RunResult(name or f"fixed:{k}", requests, v.pos - v.start, v.time_ms.copy(), v.rounds.copy(),
                     v.drafted_total.copy(), v.accepted_total.copy())


def run_plan_vectorised(engine: TraceEngine, requests: np.ndarray, choice: np.ndarray, offsets: np.ndarray,
                        name: str) -> RunResult:
    """Play a per-position K table (an oracle's policy) over all requests at once, with the engine's draws.

    Args:
        engine: Replay engine (workload, profile, seed): the same common random numbers as every controller.
        requests: Workload request indices.
        choice: Flat K per position of the requests' subset (``Workload.subset(requests)`` order).
        offsets: ``(len(requests)+1,)`` boundaries of ``choice`` per request.
        name: Row name.
    """
    v = VectorReplay(engine, requests)
    base = np.asarray(offsets[:-1], dtype=np.int64) - v.start  # global position -> index into `choice`
    last = max(len(choice) - 1, 0)
    while v.active.any():
        v.step(choice[np.minimum(v.pos + base, last)])  # finished requests' entries are ignored
    return RunResult(name, v.requests, v.pos - v.start, v.time_ms.copy(), v.rounds.copy(), v.drafted_total.copy(),
                     v.accepted_total.copy())


class FixedRuns(Protocol):
    """Fixed-K runs already made on the same requests and draws (:class:`~specgym.eval.references.References`)."""

    def fixed_run(self, k: int, name: str) -> RunResult: ...


def run_controller(
    engine: TraceEngine,
    requests: np.ndarray,
    controller: Controller,
    trace: Iterable[int] = (),
    on_request: Callable[[], None] | None = None,
    fixed: FixedRuns | None = None,
) -> RunResult:
    """Serve ``requests`` one at a time with ``controller`` (each through :func:`~specgym.envs.core.request.drive`).

    A plain :class:`FixedK` (not a subclass) is the one controller with a shortcut, taken here only: it *is* the
    fixed-K run of ``fixed`` when given (the evaluation's references: same requests, same draws; no per-round
    trace, its choice is K every round), else the vectorised replay when nothing is traced.

    Args:
        engine: Replay engine (workload, profile, seed).
        requests: Workload request indices, served in this order.
        controller: Any :class:`Controller`.
        trace: Request indices whose round-by-round choices are kept (for plots).
        on_request: Called after each request (progress bars).
        fixed: The fixed-K runs of these requests, if already made.
    """
    requests = np.asarray(requests, dtype=np.int64)
    trace = set(int(t) for t in trace)
    notes = bind_to_workload(controller, engine.workload)
    if type(controller) is FixedK and (fixed is not None or not trace):
        k = min(controller.k, engine.k_max)
        result = fixed.fixed_run(k, controller.name) if fixed is not None else \
            run_fixed_vectorised(engine, requests, k, controller.name)
        if on_request is not None:
            for _ in requests:
                on_request()
        return result
    return serve_one_by_one(controller.name, requests, lambda r, on_round: drive(controller, engine.start(r), on_round),
                            trace, on_request, notes)


def serve_one_by_one(name: str, requests: np.ndarray, play: Callable[[int, Any], Any], trace: set[int],
                     on_request: Callable[[], None] | None = None, notes: list[str] | None = None) -> RunResult:
    """Serve ``requests`` in order, one request's rounds at a time, and sum them into a :class:`RunResult`.

    Args:
        name: The row's name.
        requests: Workload request indices.
        play: ``play(request, on_round)`` runs one request's rounds (calling ``on_round(outcome)`` after each when
            given) and returns its totals (``tokens``, ``time_ms``, ``rounds``, ``drafted``, ``accepted``).
        trace: Request indices whose rounds are kept.
        on_request: Called after each request (progress bars).
        notes: The controller's notes for the report.
    """
    n = len(requests)
    tokens = np.zeros(n, np.int64)
    time_ms = np.zeros(n)
    rounds = np.zeros(n, np.int64)
    drafted = np.zeros(n, np.int64)
    accepted = np.zeros(n, np.int64)
    traces: dict[int, list[tuple[int, int, int, int]]] = {}
    for idx, r in enumerate(requests.tolist()):
        on_round = None
        if r in trace:
            rec = traces[r] = []
            on_round = lambda o, rec=rec: rec.append((o.position, o.planned_k, o.drafted, o.accepted))  # noqa: E731
        tot = play(r, on_round)
        tokens[idx], time_ms[idx], rounds[idx], drafted[idx], accepted[idx] = (
            tot.tokens, tot.time_ms, tot.rounds, tot.drafted, tot.accepted)
        if on_request is not None:
            on_request()
    return RunResult(name, requests, tokens, time_ms, rounds, drafted, accepted, traces, notes or [])

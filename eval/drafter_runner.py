"""Run a drafter-choice controller (or the clairvoyant drafter choice) over requests of a replay engine.

Results are :class:`~specgym.eval.runner.RunResult` records, so drafter-choice rows sit in the same table as the
chains (``drafted`` / ``accepted`` summed over whichever drafter proposed). A plain :class:`FixedDrafter` replays
all requests at once (:class:`~specgym.envs.engines.replay.trace_engine.VectorReplay` with its drafter: the same figures
as the round loop, tested); every other controller runs round by round through
:func:`~specgym.envs.core.drafter_choice.drive_drafters`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from specgym.baselines.drafter_fixed import FixedDrafter
from specgym.baselines.drafter_oracle import drafter_oracle_times, round_choice
from specgym.envs.core.drafter_choice import DrafterController, drive_drafters
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.eval.runner import RunResult, bind_to_workload, serve_one_by_one


def run_drafter_controller(engine: TraceEngine, requests: np.ndarray, ctrl: DrafterController,
                           trace: Iterable[int] = (), on_request: Callable[[], None] | None = None) -> RunResult:
    """Serve ``requests`` one at a time with ``ctrl`` (its ``prepare`` on the workload first, and a predictor it reads
    fitted to the workload, :func:`~specgym.eval.runner.bind_to_workload`: another pair's is refused; the notes of
    both, on how the controller fits this workload, go in the row's notes)."""
    requests = np.asarray(requests, dtype=np.int64)
    drafters = engine.workload.drafter_names
    notes = list(ctrl.prepare(engine.workload, engine.profile)) + bind_to_workload(ctrl, engine.workload)
    trace = set(int(t) for t in trace)
    if type(ctrl) is FixedDrafter and not trace:
        engine.workload.drafter_info(ctrl.drafter)  # an unknown drafter: one line
        v = VectorReplay(engine, requests, drafter=ctrl.drafter)
        v.run_fixed(min(ctrl.k, engine.k_max))
        if on_request is not None:
            for _ in requests:
                on_request()
        return RunResult(ctrl.name, requests, v.pos - v.start, v.time_ms.copy(), v.rounds.copy(),
                         v.drafted_total.copy(), v.accepted_total.copy(), notes=notes)
    return serve_one_by_one(ctrl.name, requests,
                            lambda r, on_round: drive_drafters(ctrl, engine.start(r), drafters, on_round), trace,
                            on_request, notes=notes)


#: The per-round clairvoyant's row (:func:`specgym.baselines.drafter_oracle.round_choice`); ``drafter-oracle`` is
#: the planning one.
ROUND_ORACLE = "round-oracle"


def run_drafter_oracle(engine: TraceEngine, requests: np.ndarray, name: str = "drafter-oracle") -> RunResult:
    """The clairvoyant drafter and K of every round of every request (:mod:`specgym.baselines.drafter_oracle`: the
    plan of least total time, or with ``name`` :data:`ROUND_ORACLE` the best rate of each round on its own), played
    back on the engine so its row carries rounds and drafts as well as time."""
    requests = np.asarray(requests, dtype=np.int64)
    wl = engine.workload
    offsets = np.concatenate([[0], np.cumsum(wl.lengths[requests])]).astype(np.int64)
    drafters = wl.drafter_names
    flat = [engine.runs(d) for d in drafters]
    idx = np.concatenate([np.arange(wl.offsets[r], wl.offsets[r + 1]) for r in requests.tolist()]) \
        if len(requests) else np.zeros(0, np.int64)
    runs = [f[idx] for f in flat]
    tables = [engine.table_for(d) for d in drafters]
    kv0 = wl.prompt_len[requests]
    per_round = name == ROUND_ORACLE
    if per_round:
        choice = round_choice(runs, tables, offsets, engine.k_max, kv0)
        times = np.zeros(len(requests))
    else:
        choice = (np.zeros(len(idx), np.int64), np.zeros(len(idx), np.int64))
        times = drafter_oracle_times(runs, tables, offsets, engine.k_max, kv0, choice)
    n = len(requests)
    cols = {k: np.zeros(n, np.int64) for k in ("tokens", "rounds", "drafted", "accepted")}
    for j in range(n):
        lo, hi = int(offsets[j]), int(offsets[j + 1])
        i, spent = 0, 0.0
        while i < hi - lo:
            d, k = int(choice[0][lo + i]), int(choice[1][lo + i])
            spent += float(tables[d].base[k] + tables[d].per_kv[k] * (kv0[j] + i))
            acc = min(int(runs[d][lo + i]), k)
            cols["rounds"][j] += 1
            cols["drafted"][j] += k
            cols["accepted"][j] += acc
            i += acc + 1
        cols["tokens"][j] = hi - lo
        if per_round:
            times[j] = spent
    return RunResult(name, requests, cols["tokens"], times, cols["rounds"], cols["drafted"], cols["accepted"])

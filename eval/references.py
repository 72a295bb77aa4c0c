"""The reference runs every figure of an evaluation is measured against.

On one set of requests under one engine's common random numbers: fixed K = 0..k_max (vectorised; the best fixed K is
the fastest of 1..k_max), the clairvoyant oracle (knows the draws) and the informed oracle (knows each position's
acceptance probability, never the draws; played with the same draws). They are computed once per evaluation and
reused: a ``fixed:K`` controller row *is* the reference run (:meth:`References.fixed_run`), validation and the
generalisation suite take them without the report around them, and a sharded evaluation concatenates the
references of its shards (:meth:`References.concat`).

With a context term in the profile a plain step's time depends on the KV cache, so the AR baseline of a request is
its fixed K = 0 run (``ar_ms``), not ``N * t_AR``; the oracles price every position at its cache. On a per-start
trace (no ``p_accept``: deterministic runs) the informed oracle is the clairvoyant one: its row plays the
clairvoyant policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from specgym.baselines.informed_oracle import InformedPlan, informed_plan
from specgym.baselines.oracle import oracle_plan, oracle_times
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.eval.runner import RunResult, concat_runs, run_fixed_vectorised, run_plan_vectorised

INFORMED = "oracle:informed"  # the informed oracle's row name (the clairvoyant one's is "oracle")

#: a round of a trace: (position, K, drafted, accepted)
Round = tuple[int, int, int, int]


@dataclass(frozen=True)
class References:
    """Reference runs on one set of requests (arrays aligned with ``requests``, in serving order).

    Attributes:
        requests: Workload indices of the requests.
        lengths: Tokens of each request (N).
        t_ar_ms: Time of one plain decoding step (AR baseline: ``N * t_ar_ms`` per request).
        k_max: Largest draft cap.
        fixed: ``{K: run}`` for K = 0..k_max.
        oracle_ms: The clairvoyant oracle's time per request.
        informed: The informed oracle's run under the replayed draws.
        informed_expected_ms: The informed oracle's expected total time (its own objective).
        traces: For traced requests, ``{request: {"oracle": rounds, "informed": rounds}}``.
        ar_ms: Per-request time of plain decoding when it depends on the position (a context term), else ``None``
            (``N * t_ar_ms``).
    """

    requests: np.ndarray
    lengths: np.ndarray
    t_ar_ms: float
    k_max: int
    fixed: dict[int, RunResult]
    oracle_ms: np.ndarray
    informed: RunResult
    informed_expected_ms: float
    traces: dict[int, dict[str, list[Round]]] = field(default_factory=dict)
    ar_ms: np.ndarray | None = None

    @property
    def tokens(self) -> int:
        """Tokens produced over all requests."""
        return int(self.lengths.sum())

    @property
    def best_k(self) -> int:
        """The fastest fixed K of 1..k_max on these requests and draws (ties: the smallest)."""
        return min(range(1, self.k_max + 1), key=lambda k: self.t_fixed(k))

    @property
    def k4(self) -> int:
        """The K of the ``vs K=4`` column (k_max below 4)."""
        return min(4, self.k_max)

    def t_fixed(self, k: int) -> float:
        """Total time of fixed K."""
        return float(self.fixed[k].time_ms.sum())

    @property
    def t_best(self) -> float:
        """Total time of the best fixed K."""
        return self.t_fixed(self.best_k)

    @property
    def t_oracle(self) -> float:
        """Total time of the clairvoyant oracle."""
        return float(self.oracle_ms.sum())

    @property
    def t_informed(self) -> float:
        """Total time of the informed oracle under the replayed draws."""
        return float(self.informed.time_ms.sum())

    def fixed_run(self, k: int, name: str) -> RunResult:
        """The fixed-K reference run under a row name (a ``fixed:K`` controller is this very run)."""
        return replace(self.fixed[min(k, self.k_max)], name=name, traces={})

    def ratio_references(self) -> dict[str, np.ndarray]:
        """Per-request reference times of every paired ratio a report carries an interval for."""
        ar = self.lengths * self.t_ar_ms if self.ar_ms is None else self.ar_ms
        return {"speedup_vs_ar": ar, "speedup_vs_k4": self.fixed[self.k4].time_ms,
                "speedup_vs_best_fixed": self.fixed[self.best_k].time_ms, "oracle_ratio": self.oracle_ms,
                "informed_ratio": self.informed.time_ms}

    @staticmethod
    def concat(parts: Sequence[References]) -> References:
        """The references of consecutive request sets (shards) as one, requests numbered in serving order."""
        if not parts:
            raise ValueError("no references to concatenate")

        first = parts[0]
        lengths = np.concatenate([p.lengths for p in parts])
        return References(
            requests=np.arange(len(lengths)), lengths=lengths, t_ar_ms=first.t_ar_ms, k_max=first.k_max,
            fixed={k: concat_runs(f"fixed:{k}", [p.fixed[k] for p in parts]) for k in first.fixed},
            oracle_ms=np.concatenate([p.oracle_ms for p in parts]),
            informed=concat_runs(INFORMED, [p.informed for p in parts]),
            informed_expected_ms=float(sum(p.informed_expected_ms for p in parts)),
            ar_ms=None if first.ar_ms is None else np.concatenate([p.ar_ms for p in parts if p.ar_ms is not None]))


def references(engine: TraceEngine, requests: np.ndarray, trace: Iterable[int] = ()) -> References:
    """Compute the references of ``requests`` under ``engine`` (its workload, profile, seed and k_max).

    Args:
        engine: The replay engine every controller of the evaluation runs on.
        requests: Workload request indices, in serving order.
        trace: Requests whose oracle rounds are kept (the K-over-time plot).
    """
    wl, k_max = engine.workload, engine.k_max
    requests = np.asarray(requests, dtype=np.int64)
    fixed = {k: run_fixed_vectorised(engine, requests, k) for k in range(0, k_max + 1)}
    all_runs = engine.runs()
    if np.array_equal(requests, np.arange(wl.n_requests)):  # the whole workload (a shard): no copy
        sub, sub_runs = wl, all_runs
    else:
        sub = wl.subset(requests)
        sub_runs = np.concatenate([all_runs[wl.span(r)] for r in requests.tolist()])
    costs = engine.table if engine.has_context else engine.round_times
    kv0 = sub.prompt_len if engine.has_context else None
    per_start = engine.workload.drafter_info(engine.drafter)["runs"] == "per-start"
    oracle_choice = np.zeros(len(sub_runs), dtype=np.int64) if per_start else None
    oracle_ms = oracle_times(sub_runs, sub.offsets, costs, k_max, kv0=kv0, choice=oracle_choice)
    if oracle_choice is not None:  # deterministic runs: the informed oracle knows the outcome
        plan = InformedPlan(oracle_choice, oracle_ms)
    else:
        plan = informed_plan(sub.require("p_accept", "the informed oracle"), sub.offsets, costs, k_max, kv0=kv0)
    informed = run_plan_vectorised(engine, requests, plan.choice, sub.offsets, INFORMED)
    served = {r: m for m, r in enumerate(requests.tolist())}
    traces = {}
    for r in dict.fromkeys(int(t) for t in trace):
        run = all_runs[wl.span(r)]
        traces[r] = {"oracle": _oracle_rounds(run, engine, int(wl.prompt_len[r])),
                     "informed": _plan_rounds(run, plan.choice[sub.span(served[r])])}
    return References(requests=requests, lengths=sub.lengths.astype(np.int64), t_ar_ms=float(engine.t_ar),
                      k_max=k_max, fixed=fixed, oracle_ms=oracle_ms, informed=informed,
                      informed_expected_ms=float(plan.expected_ms.sum()), traces=traces,
                      ar_ms=fixed[0].time_ms.copy() if engine.has_context else None)


def _oracle_rounds(run: np.ndarray, engine: TraceEngine, kv0: int) -> list[Round]:
    """The clairvoyant oracle's rounds on one request."""
    out, i = [], 0
    costs = engine.table if engine.has_context else engine.round_times
    for k in oracle_plan(run, costs, engine.k_max, kv0):
        acc = min(int(run[i]), k)
        out.append((i, k, k, acc))
        i += acc + 1
    return out


def _plan_rounds(run: np.ndarray, choice: np.ndarray) -> list[Round]:
    """A per-position K table's rounds on one request under the replayed draws."""
    out, i = [], 0
    while i < len(run):
        k = int(choice[i])
        acc = min(int(run[i]), k)
        out.append((i, k, k, acc))
        i += acc + 1
    return out

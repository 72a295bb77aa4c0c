"""The censored-data oracle bound of an imported vLLM-metrics workload (:mod:`specgym.envs.workloads.vllm_metrics`).

vLLM's per-step metrics say how many drafted tokens were accepted, not how many more would have been: a step that
accepted everything it drafted leaves its bonus position censored. The stored runs count such a position as a
rejection (the **known** runs), so the evaluation's clairvoyant oracle row is the limit on the known runs. This
module computes the other side: the same clairvoyant dynamic programme (:func:`specgym.baselines.oracle.oracle_times`,
same engine costs, ``k_max`` and requests) on the **optimistic** runs, where every censored position counts as
accepted.

What it bounds: under the per-position model (the drafter's agreement with the target at a position does not
depend on where the round started), the true runs lie between the known and the optimistic runs at every position,
and the oracle's time can only fall as runs grow. So the bound's time is a lower bound (its throughput an upper
bound) on what any chain controller (one K per round, token-level stops included, causal or clairvoyant) could
achieve on these completions under the evaluation's cost profile; the true clairvoyant limit lies between this
bound and the known-runs oracle. It says nothing about tokens outside the recorded steps (not in the workload).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specgym.baselines.oracle import oracle_times
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.vllm_metrics import match_flags, optimistic_runs, steps_of
from specgym.errors import SpecgymError


def censored_bound(engine: TraceEngine, requests: np.ndarray, known_oracle_ms: float) -> dict[str, Any] | None:
    """The bound on ``requests`` of ``engine``'s workload (None when it is not a vLLM-metrics import).

    Args:
        engine: The evaluation's replay engine (its workload, costs and ``k_max``).
        requests: Workload request indices, in serving order.
        known_oracle_ms: The clairvoyant oracle's total time on the known runs (the report's oracle row).
    """
    wl = engine.workload
    steps = steps_of(wl)
    if steps is None:
        return None
    flags = [match_flags(*steps[r]) for r in requests.tolist()]
    runs = np.concatenate([optimistic_runs(f) for f in flags])
    lengths = np.array([len(f) for f in flags], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    if not np.array_equal(lengths, wl.lengths[requests]):
        raise SpecgymError(f"workload {wl.name!r}: metadata extra.vllm_metrics.steps do not match its lengths")
    costs = engine.table if engine.has_context else engine.round_times
    kv0 = wl.prompt_len[requests] if engine.has_context else None
    bound_ms = float(oracle_times(runs, offsets, costs, engine.k_max, kv0=kv0).sum())
    tokens = int(lengths.sum())
    censored = int(sum(int((f == -1).sum()) for f in flags))
    return {
        "throughput_tok_s": tokens / bound_ms * 1000.0,
        "time_ms": bound_ms,
        "known_oracle_tok_s": tokens / known_oracle_ms * 1000.0,
        "censored_positions": censored,
        "positions": tokens,
        "bounds": "every chain controller on these completions under this cost profile, if a position's acceptance "
                  "does not depend on where the round started",
    }


def bound_note(bound: dict[str, Any]) -> str:
    """One line for the report's notes."""
    return (f"censored-data oracle bound: {bound['throughput_tok_s']:.1f} tok/s with the "
            f"{bound['censored_positions']:,} censored positions (of {bound['positions']:,}) counted as accepted; "
            f"the oracle row ({bound['known_oracle_tok_s']:.1f} tok/s) counts them as rejected. No controller "
            f"exceeds the bound on these completions and costs (per-position model: "
            f"docs/guides/vllm-engine-traces.md)")

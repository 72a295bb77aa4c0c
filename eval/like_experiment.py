"""The SpecDecode-Bench simulator's "like experiment", replayed through specgym's engine and cost objects.

The published table of "Speculative Decoding: Performance or Illusion?" (arXiv:2601.11580) comes from the
reference simulator's like-experiment (``SpecDecode-Bench/simulator``, ``simulate_like_experiment``): a batch is
``bs`` copies of one request; its latency is

* a prefill: one target forward over ``bs * len(prompt_token_ids)`` tokens with an empty cache, then one overhead;
* plain decoding: ``N`` steps, each ``forward(kv, bs) + overhead``;
* speculative decoding: rounds until the request is done, each ``forward(kv, bs * (K + 1)) + draft(kv, K + 1) +
  overhead``, producing ``min(run, K) + 1`` tokens;

the KV cache (over the batch) growing by ``bs`` times the tokens produced, and the figure is the mean over requests
of SD throughput over the mean of plain throughput, a request's throughput being its tokens *including the first*
(``N + 1``) over its latency. Its semantics differ from specgym's ordinary replay in three ways, kept here on
purpose: K is never clipped to the tokens left (the last round may overshoot, and pays for it), the oracle drafts
exactly what will be accepted (``K = run``, so a round whose first draft is rejected drafts 0 tokens) and pays the
draft phase on every round including those, and the prefill counts.

specgym's implementation reads the runs from :meth:`~specgym.envs.engines.replay.trace_engine.TraceEngine.runs` and
prices
every round with the profile's cost form (:meth:`CostProfile.copies` for ``bs`` sequences in lockstep,
:class:`~specgym.envs.core.cost.RoundTable` with its ``spec0`` entry for a speculative round without drafts,
:meth:`CostProfile.batch_step_ms` for the prefill), all requests at once. The KV cache of a round at completion
position ``i`` is ``bs * (prompt_len + i)`` (specgym's ``prompt_len`` counts the prefill's first token,
:mod:`specgym.envs.workloads.specdecode`), exactly the reference's.

:func:`harness_speedup` gives specgym's ordinary figure beside it: the ratio of total tokens to total decode time
(prefill excluded) of the ordinary replay (K clipped to the room, K = 0 a plain step, the clairvoyant oracle the
DP of :mod:`specgym.baselines.oracle`), priced by the same ``copies(bs)`` profile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specgym.baselines.oracle import oracle_times
from specgym.envs.core.cost import CostProfile
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.errors import SpecgymError
from specgym.eval.runner import run_fixed_vectorised

POLICIES = ("fixed:1", "fixed:3", "fixed:5", "oracle")
BATCH_SIZES = (1, 8, 32, 128)


@dataclass(frozen=True)
class LikeResult:
    """Per-request latencies of one (policy, bs) cell, in ms (arrays aligned with the workload's requests).

    Attributes:
        policy: ``fixed:K`` or ``oracle``.
        bs: Copies of each request in its batch.
        tokens: Tokens of each request, the prefill's first one included (``N + 1``).
        plain_ms: Plain decoding latency (prefill included).
        sd_ms: Speculative decoding latency (prefill included).
    """

    policy: str
    bs: int
    tokens: np.ndarray
    plain_ms: np.ndarray
    sd_ms: np.ndarray

    @property
    def speedup(self) -> float:
        """Mean over requests of SD throughput / mean of plain throughput (the published figure)."""
        return float(np.mean(self.tokens / self.sd_ms) / np.mean(self.tokens / self.plain_ms))


def _policy_k(policy: str) -> int | None:
    """K of ``fixed:K``; ``None`` for the oracle."""
    if policy == "oracle":
        return None
    name, _, k = policy.partition(":")
    if name != "fixed" or not k.isdigit() or int(k) < 1:
        raise SpecgymError(f"like experiment: policy must be fixed:K (K >= 1) or oracle, got {policy!r}")
    return int(k)


def like_experiment(engine: TraceEngine, profile: CostProfile, bs: int, policy: str,
                    drafter: str | None = None) -> LikeResult:
    """Every request of ``engine``'s workload as a batch of ``bs`` copies under ``policy`` (module docstring).

    Args:
        engine: The replay engine (its workload and runs; its own profile is not used).
        profile: A published linear profile (``h100-llama31-8b``).
        bs: Copies per batch.
        policy: ``fixed:K`` or ``oracle``.
        drafter: The drafter (``None``: the engine's).
    """
    wl = engine.workload
    runs = engine.runs(drafter)
    name = profile.pricing_drafter(engine.drafter if drafter is None else drafter,
                                   engine.workload.drafter_info(drafter)["kind"])
    k = _policy_k(policy)
    batch = profile.copies(bs)
    table = batch.round_table(int(runs.max()) if k is None else k, name)
    base, per_kv = table.base, table.per_kv
    spec0_base, spec0_per_kv = table.spec0
    start = wl.offsets[:-1].astype(np.int64)
    end = wl.offsets[1:].astype(np.int64)
    kv0 = wl.prompt_len.astype(np.int64) - start  # per-sequence KV = kv0 + flat position
    prefill = np.asarray(profile.batch_step_ms(0, bs * (wl.prompt_len.astype(np.int64) - 1), 0, name,
                                               speculative=False), dtype=np.float64)
    pos = start.copy()
    sd = prefill.copy()
    act = np.flatnonzero(pos < end)
    while len(act):
        p = pos[act]
        run = runs[p]
        kv = kv0[act] + p
        if k is None:  # draft exactly what will be accepted: K = run (0 = a round whose first draft is rejected)
            d = run
            t = np.where(d > 0, base[d] + per_kv[d] * kv, spec0_base + spec0_per_kv * kv)
        else:
            d = np.minimum(run, k)
            t = base[k] + per_kv[k] * kv
        sd[act] += t
        pos[act] = p + d + 1
        act = act[pos[act] < end[act]]
    n = (end - start).astype(np.float64)
    # plain decoding: N steps at KV kv0 + position, i.e. sum of base[0] + per_kv[0] * (prompt_len + i), i < N
    plain = prefill + n * base[0] + per_kv[0] * (n * wl.prompt_len + n * (n - 1) / 2.0)
    return LikeResult(policy, bs, n + 1.0, plain, sd)


def harness_speedup(engine_at: TraceEngine, policy: str) -> float:
    """specgym's ordinary figure of ``policy``: plain decode time / the policy's decode time over every request
    (equal tokens), on an engine priced by ``profile.copies(bs)`` (prefill excluded; K clipped to the room; the
    oracle is the clairvoyant DP over K = 0..k_max)."""
    requests = np.arange(engine_at.workload.n_requests)
    plain = float(run_fixed_vectorised(engine_at, requests, 0).time_ms.sum())
    k = _policy_k(policy)
    if k is not None:
        return plain / float(run_fixed_vectorised(engine_at, requests, k).time_ms.sum())
    wl = engine_at.workload
    costs = engine_at.table if engine_at.has_context else engine_at.round_times
    t = oracle_times(engine_at.runs(), wl.offsets, costs, engine_at.k_max, kv0=wl.prompt_len)
    return plain / float(t.sum())

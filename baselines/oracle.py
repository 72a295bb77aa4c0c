"""Oracle: the clairvoyant lower bound on a request's time Not a controller.

Knowing every acceptance outcome of a request in advance, the fastest schedule of draft lengths follows from
dynamic programming over the position ``i`` of the next token (N = completion length):

    V(N) = 0
    V(i) = min_{K in [0, min(k_max, N - i - 1)]}  time(K) + V(i + min(run_i, K) + 1)

``run_i`` = number of consecutive accepted positions starting at ``i`` (within the request), ``time(K)`` = the
cost of a round that drafts K tokens (``CostProfile.round_times(k_max)[K]``; ``time(0) = t_AR``). At ``i = N - 1``
only K = 0 is possible (drafting past the end is useless). V(0) is the physical limit of that (draft, target,
hardware, workload) combination under the replayed acceptance draws; no causal controller can beat it.

The oracle drafts exactly K tokens (no token-level stop is needed: it knows where the first rejection is).
Ties between K values go to the smallest K.

**Costs.** ``round_times`` is the classic array (``time(K)`` at every position) or a
:class:`~specgym.envs.core.cost.RoundTable` with a context term: then ``time(K)`` at position ``i`` of request ``r``
is ``base[K] + per_kv[K] * (kv0[r] + i)``, ``kv0`` = the request's KV cache at position 0 (its ``prompt_len``);
the DP is the same. Runs come from the engine (:meth:`~specgym.envs.engines.replay.trace_engine.TraceEngine.runs`):
per-position draws or a per-start trace's stored runs, which may exceed the room left (K is clipped to it).
"""

from __future__ import annotations

import numpy as np

from specgym.envs.core.cost import RoundTable
from specgym.envs.core.replay import run_lengths  # noqa: F401  (re-exported: the oracle plans over run lengths)
from specgym.errors import SpecgymError

Costs = np.ndarray | RoundTable
"""A classic ``round_times`` array or a :class:`RoundTable` (module docstring)."""


def _check(round_times: Costs, k_max: int) -> np.ndarray:
    rt = np.asarray(round_times.base if isinstance(round_times, RoundTable) else round_times, dtype=np.float64)
    if k_max < 0 or rt.ndim != 1 or rt.size < k_max + 1:
        raise SpecgymError(f"oracle: round_times needs k_max+1 = {k_max + 1} entries (d = 0..k_max), got {rt.shape}")
    return rt[: k_max + 1]


def context_terms(round_times: Costs, k_max: int, kv0: np.ndarray | None, n_requests: int) -> tuple[
        np.ndarray | None, np.ndarray | None]:
    """``(per_kv, kv0)`` of a context-aware table, or ``(None, None)`` when the costs do not depend on the cache."""
    if not isinstance(round_times, RoundTable) or not round_times.has_context:
        return None, None
    if kv0 is None:
        raise SpecgymError("oracle: a cost table with a context term needs kv0 (each request's prompt_len)")
    kv0 = np.asarray(kv0, dtype=np.float64)
    if kv0.shape != (n_requests,):
        raise SpecgymError(f"oracle: kv0 needs one entry per request ({n_requests}), got {kv0.shape}")
    return np.asarray(round_times.per_kv[: k_max + 1], dtype=np.float64), kv0


def oracle_times(run: np.ndarray, offsets: np.ndarray, round_times: Costs, k_max: int,
                 kv0: np.ndarray | None = None, choice: np.ndarray | None = None) -> np.ndarray:
    """Optimal total time of every request, all requests at once.

    Positions are processed from the longest request's end down to 0; at each ``i`` all requests longer than
    ``i`` are updated together (requests are sorted by length so the active set is a prefix).

    Args:
        run: Flat run lengths over all requests (see :func:`run_lengths`).
        offsets: ``(R+1,)`` request boundaries, ``offsets[0] == 0``, ``offsets[-1] == len(run)``.
        round_times: ``round_times[d]`` = time of a round drafting d tokens, d = 0..k_max, or a
            :class:`RoundTable` (a context term is priced at ``kv0[r] + i``).
        k_max: Largest draft length.
        kv0: ``(R,)`` each request's KV cache at position 0 (needed with a context term).
        choice: Optional flat int64 array (``len(run)``) that receives the optimal K at every position (the
            policy; ties to the smallest K).

    Returns:
        ``(R,)`` float64 array of per-request optimal times (ms if ``round_times`` is in ms).
    """
    rt = _check(round_times, k_max)
    run = np.asarray(run, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != run.size:
        raise SpecgymError("oracle: offsets must be (R+1,) with offsets[0] == 0 and offsets[-1] == len(run)")
    lengths = np.diff(offsets)
    if (lengths < 0).any():
        raise SpecgymError("oracle: offsets must be non-decreasing")
    n_req = lengths.size
    if n_req == 0:
        return np.zeros(0)
    per_kv, kv0_r = context_terms(round_times, k_max, kv0, n_req)
    order = np.argsort(-lengths, kind="stable")
    len_s = lengths[order]
    start_s = offsets[:-1][order]  # first position of each (sorted) request in `run`
    vbase_s = start_s + order  # V(r, i) lives at V[offsets[r] + r + i]; V(r, N_r) = 0
    values = np.zeros(run.size + n_req, dtype=np.float64)
    n_longest = int(len_s[0])
    n_active = np.searchsorted(-len_s, -np.arange(n_longest), side="left")  # requests with N > i: a prefix
    kv0_s = None if kv0_r is None else kv0_r[order]
    for i in range(n_longest - 1, -1, -1):
        m = int(n_active[i])
        vb = vbase_s[:m] + (i + 1)
        r_i = run[start_s[:m] + i]
        room = len_s[:m] - (i + 1)  # N - i - 1: the largest useful K
        if kv0_s is None:
            rt_i = rt
            best = rt[0] + values[vb]
        else:  # the round costs at this position's KV cache: (m, k_max + 1)
            assert per_kv is not None
            rt_i = rt[None, :] + per_kv[None, :] * (kv0_s[:m, None] + i)
            best = rt_i[:, 0] + values[vb]
        arg = np.zeros(m, dtype=np.int64) if choice is not None else None
        for k in range(1, k_max + 1):
            kk = np.minimum(room, k)  # K beyond the room duplicates K = room: no mask needed
            step = rt[kk] if kv0_s is None else rt_i[np.arange(m), kk]
            cost = step + values[vb + np.minimum(r_i, kk)]
            if arg is not None:
                arg[(cost < best) & (room >= k)] = k
            np.minimum(best, cost, out=best)
        values[vb - 1] = best
        if choice is not None:
            choice[start_s[:m] + i] = arg
    out = np.empty(n_req, dtype=np.float64)
    out[order] = values[vbase_s]
    return out


def _values_one(run: np.ndarray, round_times: Costs, k_max: int, kv0: float = 0.0) -> tuple[list[float], list[int]]:
    rt = _check(round_times, k_max)
    per_kv, _ = context_terms(round_times, k_max, np.array([kv0]), 1)
    n = len(run)
    v = [0.0] * (n + 1)
    choice = [0] * n
    for i in range(n - 1, -1, -1):
        t = rt if per_kv is None else rt + per_kv * (kv0 + i)
        best, best_k = t[0] + v[i + 1], 0
        r_i = int(run[i])
        for k in range(1, min(k_max, n - i - 1) + 1):
            c = t[k] + v[i + min(r_i, k) + 1]
            if c < best:
                best, best_k = c, k
        v[i] = best
        choice[i] = best_k
    return v, choice


def oracle_plan(run: np.ndarray, round_times: Costs, k_max: int, kv0: float = 0.0) -> list[int]:
    """The optimal sequence of K for one request (for plots), following the DP's argmin from position 0.

    Args:
        run: Run lengths of one request (length N).
        round_times: ``round_times[d]`` for d = 0..k_max, or a :class:`RoundTable`.
        k_max: Largest draft length.
        kv0: The request's KV cache at position 0 (a context term).
    """
    _, choice = _values_one(run, round_times, k_max, kv0)
    plan, i = [], 0
    while i < len(run):
        k = choice[i]
        plan.append(k)
        i += min(int(run[i]), k) + 1
    return plan


def oracle_time_one(run: np.ndarray, round_times: Costs, k_max: int, kv0: float = 0.0) -> float:
    """Optimal total time of one request (plain-Python DP; reference for :func:`oracle_times`)."""
    return _values_one(run, round_times, k_max, kv0)[0][0]

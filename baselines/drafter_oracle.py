"""The clairvoyant drafter choice: the fastest (drafter, K) of every round, knowing every drafter's runs. Not a
controller (the ``drafter-oracle`` report row).

The oracle of :mod:`specgym.baselines.oracle`, with the drafter as a second choice per round (``D`` drafters, each
with its runs ``run_d`` and its round costs ``time_d(K, kv)``):

    V(N) = 0
    V(i) = min( time(0, kv_i) + V(i + 1),
                min_{d, K in [1, min(k_max, N - i - 1)]}  time_d(K, kv_i) + V(i + min(run_d[i], K) + 1) )

``kv_i = kv0 + i`` (the request's prompt length plus the position). A plain step (``K = 0``) costs the same whatever
the drafter (no draft phase runs). Ties go to the plain step, then to the earlier drafter, then to the smaller K. On
a per-start trace this is the exact limit of any per-round drafter choice.

**The per-round clairvoyant** (:func:`round_choice`, the ``round-oracle`` row) knows each round's runs but not what
its choice does to the rounds after it: at every round it plays the (drafter, K) of the largest rate of *that*
round, ``(min(run_d[i], K) + 1) / time_d(K, kv_i)`` (the plain step: ``1 / time(0, kv_i)``), with the same ties.
It is the limit of a rule that maximises each round's expected rate (``drafter-marginal``, ``marginal``) given a
perfect prediction of the round. The gap between it and the DP above is what choosing *where the next round starts*
is worth: on a per-start trace a short round can land on a start whose run is long, and only a controller that
predicts the runs of the starts it may land on can take it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specgym.envs.core.cost import RoundTable
from specgym.errors import SpecgymError


def _check(runs: Sequence[np.ndarray], tables: Sequence[RoundTable], offsets: np.ndarray, k_max: int) -> None:
    if not runs or len(runs) != len(tables):
        raise SpecgymError("drafter oracle: one runs array and one cost table per drafter are needed")
    size = int(offsets[-1]) if len(offsets) else 0
    for run, table in zip(runs, tables):
        if len(run) != size:
            raise SpecgymError(f"drafter oracle: runs of length {len(run)}, offsets end at {size}")
        if table.k_max < k_max:
            raise SpecgymError(f"drafter oracle: a cost table prices K up to {table.k_max}, k_max is {k_max}")


def drafter_oracle_times(runs: Sequence[np.ndarray], tables: Sequence[RoundTable], offsets: np.ndarray, k_max: int,
                         kv0: np.ndarray, choice: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Optimal total time of every request (all requests at once, from the longest one's end down to 0).

    Args:
        runs: Per drafter, flat runs over the requests (``offsets`` boundaries).
        tables: Per drafter, its :class:`RoundTable` (d = 0..k_max).
        offsets: ``(R+1,)`` request boundaries, ``offsets[0] == 0``.
        k_max: Largest draft cap.
        kv0: ``(R,)`` each request's KV cache at position 0 (its ``prompt_len``).
        choice: Optional ``(drafter_index, K)`` flat int64 arrays that receive the optimal decision per position.

    Returns:
        ``(R,)`` per-request optimal times.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    _check(runs, tables, offsets, k_max)
    lengths = np.diff(offsets)
    n_req = lengths.size
    if n_req == 0:
        return np.zeros(0)
    order = np.argsort(-lengths, kind="stable")
    len_s = lengths[order]
    start_s = offsets[:-1][order]
    vbase_s = start_s + order  # V(r, i) at V[offsets[r] + r + i]
    values = np.zeros(int(offsets[-1]) + n_req)
    kv_s = np.asarray(kv0, dtype=np.float64)[order]
    runs64 = [np.asarray(r, dtype=np.int64) for r in runs]
    base = [t.base[: k_max + 1] for t in tables]
    per_kv = [t.per_kv[: k_max + 1] for t in tables]
    n_active = np.searchsorted(-len_s, -np.arange(int(len_s[0])), side="left")
    for i in range(int(len_s[0]) - 1, -1, -1):
        m = int(n_active[i])
        vb = vbase_s[:m] + (i + 1)
        kv = kv_s[:m] + i
        room = len_s[:m] - (i + 1)
        best = base[0][0] + per_kv[0][0] * kv + values[vb]
        arg_d = np.zeros(m, np.int64) if choice is not None else None
        arg_k = np.zeros(m, np.int64) if choice is not None else None
        for d, run in enumerate(runs64):
            r_i = run[start_s[:m] + i]
            for k in range(1, k_max + 1):
                kk = np.minimum(room, k)
                cost = base[d][kk] + per_kv[d][kk] * kv + values[vb + np.minimum(r_i, kk)]
                if arg_d is not None and arg_k is not None:
                    better = (cost < best) & (room >= k)
                    arg_d[better] = d
                    arg_k[better] = k
                np.minimum(best, np.where(room >= k, cost, best), out=best)
        values[vb - 1] = best
        if choice is not None and arg_d is not None and arg_k is not None:
            choice[0][start_s[:m] + i] = arg_d
            choice[1][start_s[:m] + i] = arg_k
    out = np.empty(n_req)
    out[order] = values[vbase_s]
    return out


def drafter_oracle_one(runs: Sequence[np.ndarray], tables: Sequence[RoundTable], k_max: int,
                       kv0: float) -> tuple[float, list[tuple[int, int]]]:
    """One request's optimal time and its plan ``[(drafter_index, K), ...]`` (plain Python: the reference of
    :func:`drafter_oracle_times`, and the rounds of a report's trace)."""
    n = len(runs[0])
    v = [0.0] * (n + 1)
    best_dk = [(0, 0)] * n
    for i in range(n - 1, -1, -1):
        kv = kv0 + i
        best, arg = float(tables[0].base[0] + tables[0].per_kv[0] * kv) + v[i + 1], (0, 0)
        for d, (run, t) in enumerate(zip(runs, tables)):
            for k in range(1, min(k_max, n - i - 1) + 1):
                c = float(t.base[k] + t.per_kv[k] * kv) + v[i + min(int(run[i]), k) + 1]
                if c < best:
                    best, arg = c, (d, k)
        v[i] = best
        best_dk[i] = arg
    plan, i = [], 0
    while i < n:
        d, k = best_dk[i]
        plan.append((d, k))
        i += (min(int(runs[d][i]), k) if k else 0) + 1
    return v[0], plan


def round_choice(runs: Sequence[np.ndarray], tables: Sequence[RoundTable], offsets: np.ndarray, k_max: int,
                 kv0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The per-round clairvoyant's ``(drafter_index, K)`` at every position (module docstring), all at once.

    Args:
        runs, tables, offsets, k_max, kv0: As :func:`drafter_oracle_times`.

    Returns:
        Flat int64 ``(drafter_index, K)`` per position (``K = 0``: a plain step, drafter index 0).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    _check(runs, tables, offsets, k_max)
    lengths = np.diff(offsets)
    req = np.repeat(np.arange(len(lengths)), lengths)
    pos = np.arange(int(offsets[-1])) - offsets[:-1][req]
    kv = np.asarray(kv0, dtype=np.float64)[req] + pos
    room = lengths[req] - (pos + 1)
    best = 1.0 / (tables[0].base[0] + tables[0].per_kv[0] * kv)
    arg_d = np.zeros(len(pos), np.int64)
    arg_k = np.zeros(len(pos), np.int64)
    for d, (run, t) in enumerate(zip(runs, tables)):
        run = np.asarray(run, dtype=np.int64)
        for k in range(1, k_max + 1):
            rate = (np.minimum(run, k) + 1) / (t.base[k] + t.per_kv[k] * kv)
            better = (rate > best) & (room >= k)
            best = np.where(better, rate, best)
            arg_d[better] = d
            arg_k[better] = k
    return arg_d, arg_k

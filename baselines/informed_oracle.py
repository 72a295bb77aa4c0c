"""Informed oracle: the best K schedule in expectation, knowing every position's acceptance probability. Not a
controller.

The clairvoyant oracle (:mod:`specgym.baselines.oracle`) knows the replayed acceptance draws; the informed one knows
only the trace's true per-position acceptance probabilities ``p[i]`` (``p_accept``), never the draws ``u[i]``. It
picks K at every position by dynamic programming on the *expected* remaining time of the request (N = completion
length):

    V(N) = 0
    V(i) = min_{K in [0, min(k_max, N - i - 1)]}  time(K) + sum_{a=0..K} P_i(a) * V(i + a + 1)

with ``P_i(a) = p[i] ... p[i+a-1] * (1 - p[i+a])`` for ``a < K`` (the first rejection at draft token a + 1) and
``P_i(K) = p[i] ... p[i+K-1]`` (all K accepted); a round that accepts ``a`` tokens produces ``a + 1``. The draws
of different positions are independent and a round only reveals draws before the next position, so the position is
a sufficient state: the policy ``K*(i)`` is optimal among all schedules that do not see the draws. It is then
*played* on the replay engine with the same common random numbers as every controller
(:func:`specgym.eval.runner.run_plan_vectorised`), so its row is directly comparable.

It is an upper bound on any controller that has to predict acceptance (it also knows the probabilities of the
whole round ahead), and never faster than the clairvoyant oracle on the same draws. On greedy traces (``p`` in
{0, 1}) the expectation is the outcome and the two oracles coincide. Ties between K values go to the smallest K.

A per-start trace (format v3) has no ``p_accept``: its runs are deterministic (what the recorded drafter accepts
from each start), so knowing them is knowing the outcome and the informed oracle *is* the clairvoyant one
(:func:`specgym.eval.references.references` plays the clairvoyant policy as its row). Costs as in
:mod:`specgym.baselines.oracle` (an array or a context-aware :class:`~specgym.envs.core.cost.RoundTable` with
``kv0``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specgym.baselines.oracle import Costs, _check, context_terms
from specgym.errors import SpecgymError


@dataclass
class InformedPlan:
    """The informed oracle's policy over a set of requests (flat arrays aligned with the trace's positions).

    Attributes:
        choice: ``(n_positions,)`` draft length K*(i) to play at each position.
        expected_ms: ``(R,)`` expected total time of each request under that policy, V(0).
    """

    choice: np.ndarray
    expected_ms: np.ndarray


def _check_offsets(offsets: np.ndarray, n: int) -> np.ndarray:
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != n:
        raise SpecgymError("informed oracle: offsets must be (R+1,) with offsets[0] == 0 and offsets[-1] == len(p)")
    if (np.diff(offsets) < 0).any():
        raise SpecgymError("informed oracle: offsets must be non-decreasing")
    return offsets


def informed_plan(p_accept: np.ndarray, offsets: np.ndarray, round_times: Costs, k_max: int,
                  kv0: np.ndarray | None = None) -> InformedPlan:
    """The expected-time-optimal K at every position of every request, all requests at once.

    Positions are processed from the longest request's end down to 0; at each ``i`` all requests longer than ``i``
    are updated together (sorted by length, the active set is a prefix), and the expectation of drafting K is built
    incrementally over K (the probability that the first K drafts are accepted, and the expected value of the
    earlier rejections): ``O(N_max * k_max)`` numpy operations over the active requests.

    Args:
        p_accept: Flat per-position acceptance probabilities of all requests, in [0, 1].
        offsets: ``(R+1,)`` request boundaries, ``offsets[0] == 0``, ``offsets[-1] == len(p_accept)``.
        round_times: ``round_times[d]`` = time of a round drafting d tokens, d = 0..k_max (or a RoundTable).
        k_max: Largest draft length.
        kv0: ``(R,)`` each request's KV cache at position 0 (needed with a context term).

    Returns:
        The policy (K per position) and each request's expected time (ms if ``round_times`` is in ms).
    """
    rt = _check(round_times, k_max)
    p = np.asarray(p_accept, dtype=np.float64)
    if p.ndim != 1 or not np.all((p >= 0.0) & (p <= 1.0)):
        raise SpecgymError("informed oracle: p_accept must be a flat array of probabilities in [0, 1]")
    offsets = _check_offsets(offsets, p.size)
    lengths = np.diff(offsets)
    n_req = lengths.size
    choice = np.zeros(p.size, dtype=np.int64)
    if n_req == 0 or p.size == 0:
        return InformedPlan(choice, np.zeros(n_req))
    per_kv, kv0_r = context_terms(round_times, k_max, kv0, n_req)
    order = np.argsort(-lengths, kind="stable")
    kv0_s = None if kv0_r is None else kv0_r[order]
    len_s = lengths[order]
    start_s = offsets[:-1][order]
    vbase_s = start_s + order  # V(r, i) lives at values[offsets[r] + r + i]; V(r, N_r) = 0
    values = np.zeros(p.size + n_req + k_max + 1)  # padded: reads past a request's end are masked below
    p_pad = np.concatenate([p, np.zeros(k_max + 1)])
    n_longest = int(len_s[0])
    n_active = np.searchsorted(-len_s, -np.arange(n_longest), side="left")  # requests with N > i: a prefix
    for i in range(n_longest - 1, -1, -1):
        m = int(n_active[i])
        vb = vbase_s[:m] + (i + 1)  # index of V(i + 1)
        pi = start_s[:m] + i  # flat index of p[i]
        room = len_s[:m] - (i + 1)  # N - i - 1: the largest useful K
        kv = None if kv0_s is None or per_kv is None else kv0_s[:m] + i
        best = rt[0] + values[vb] if kv is None or per_kv is None else rt[0] + per_kv[0] * kv + values[vb]
        arg = np.zeros(m, dtype=np.int64)
        all_acc = np.ones(m)  # P(first k drafts accepted)
        early = np.zeros(m)  # sum over a < k of P_i(a) * V(i + a + 1)
        for k in range(1, min(k_max, int(room[0])) + 1):  # room[0] is the largest room (sorted by length)
            pk = p_pad[pi + k - 1]
            early += all_acc * (1.0 - pk) * values[vb + k - 1]
            all_acc *= pk
            cost = (rt[k] if kv is None or per_kv is None else rt[k] + per_kv[k] * kv) + early + all_acc * values[
                vb + k]
            better = (cost < best) & (room >= k)
            best = np.where(better, cost, best)
            arg[better] = k
        values[vb - 1] = best
        choice[pi] = arg
    expected = np.empty(n_req)
    expected[order] = values[vbase_s]
    return InformedPlan(choice, expected)


def informed_value_one(p_accept: np.ndarray, round_times: Costs, k_max: int, kv0: float = 0.0) -> tuple[float,
                                                                                                      list[int]]:
    """Expected time and K per position of one request (plain-Python DP; reference for :func:`informed_plan`)."""
    rt0 = _check(round_times, k_max)
    per_kv, _ = context_terms(round_times, k_max, np.array([kv0]), 1)
    p = [float(x) for x in p_accept]
    n = len(p)
    v = [0.0] * (n + 1)
    choice = [0] * n
    for i in range(n - 1, -1, -1):
        rt = rt0 if per_kv is None else rt0 + per_kv * (kv0 + i)
        best, best_k = float(rt[0]) + v[i + 1], 0
        for k in range(1, min(k_max, n - i - 1) + 1):
            exp, all_acc = 0.0, 1.0
            for a in range(k):
                exp += all_acc * (1.0 - p[i + a]) * v[i + a + 1]
                all_acc *= p[i + a]
            c = float(rt[k]) + exp + all_acc * v[i + k + 1]
            if c < best:
                best, best_k = c, k
        v[i], choice[i] = best, best_k
    return v[0], choice

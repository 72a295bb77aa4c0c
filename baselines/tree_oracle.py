"""Clairvoyant tree oracle: the physical limit of tree drafts for a node budget. Not a controller.

Knowing the target's rank at every position, the cheapest tree that captures the realised path to depth ``d``
from position ``i`` is the path itself with the lower-ranked siblings a rank-closed tree needs:
``nodes(i, d) = sum_{e<d} (target_rank[i + e] + 1)`` (allowed while ``<= node_budget``). Dynamic programming over
positions:

    V(N) = 0
    V(i) = min( t_AR + V(i + 1),  min_{d = 1..min(max_depth, N-i-1)} d * draft_ms + vmin(nodes(i, d)) + overhead
                                                                       + V(i + d + 1) )

with ``vmin(n) = min_{n <= n' <= budget} verify_nodes(n' + 1)`` (a measured profile need not be monotone: padding
a tree with unused nodes is allowed). Any tree round at ``i`` that accepts ``a`` tokens has depth ``>= a`` and holds
the path's nodes, so it costs at least the oracle's ``d = a`` option: no tree controller (static or dynamic)
beats ``V(0)`` under the same budget.

Round costs are the profile's general form (:func:`~specgym.envs.core.cost.step_cost`: the tree's forward, ``d``
draft steps of the default drafter, the overheads), priced at the request's KV cache (``prompt_len + i``) when the
profile has a context term; for a classic profile that is the formula above exactly.
"""

from __future__ import annotations

import numpy as np

from specgym.envs.core.cost import step_cost
from specgym.envs.engines.replay.tree_engine import TreeEngine


def tree_oracle_request(engine: TreeEngine, r: int) -> tuple[float, int, int, int]:
    """(time_ms, rounds, nodes, accepted) of the optimal schedule of request ``r``."""
    prof, budget = engine.profile, engine.node_budget
    v = [prof.verify_nodes(n + 1) for n in range(budget + 1)]
    vmin = np.minimum.accumulate(np.asarray(v)[::-1])[::-1].tolist()
    sl = engine.workload.span(r)
    ranks = engine.ranks[sl].tolist()
    n = len(ranks)
    t_ar, dc, over, step = engine.t_ar, prof.draft_cost(), prof.round_overhead_ms, prof.step_overhead_ms
    kv0 = int(engine.workload.prompt_len[r]) if prof.has_context else 0
    V = [0.0] * (n + 1)
    choice = [(0, 0)] * n
    for i in range(n - 1, -1, -1):
        kv = kv0 + i
        best, pick = (t_ar + prof.context_ms * kv if kv0 else t_ar) + V[i + 1], (0, 0)
        nodes = 0
        for d in range(1, min(engine.max_depth, n - i - 1) + 1):
            nodes += ranks[i + d - 1] + 1
            if nodes > budget:
                break
            base, per_kv = step_cost(vmin[nodes], prof.context_ms, d, dc, over, step)
            c = (base + per_kv * kv if kv0 else base) + V[i + d + 1]
            if c < best:
                best, pick = c, (d, nodes)
        V[i] = best
        choice[i] = pick
    rounds = nodes_total = acc = 0
    i = 0
    while i < n:
        d, k = choice[i]
        rounds += 1
        nodes_total += k
        acc += d
        i += d + 1
    return V[0], rounds, nodes_total, acc

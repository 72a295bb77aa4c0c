"""EAGLE-2-style dynamic trees: expand by path confidence, rerank, verify the top ``m`` (approximate in replay).

EAGLE-2 (Li et al. 2024) grows the tree depth by depth: the ``beam`` nodes of the last depth with the highest
*path confidence* (the product of the draft's probabilities along the node's path) each expand their top-``beam``
children; after ``depth`` expansions every generated node is reranked by path confidence and the top ``m`` are
verified. Products of probabilities never grow along a path and the draft's probabilities are sorted by rank, so
the kept set is closed under ancestors and lower-ranked siblings: a rank-defined tree, played on the exact walk.

**The replay model (approximate).** Choosing the nodes needs the draft's distribution at every frontier node; the
trace holds only the correct-prefix one. The model: every node at depth ``d`` has the correct-prefix top-8
probabilities of position ``i + d - 1`` (``draft_topk``), so a node's path confidence is the product of
``draft_topk[i + e - 1][r_e]`` along its ranks ``r_e < 8``; the true-path node's own score is then exact while its
ranks are < 8, the off-path scores are modelled. The draft pays ``depth`` forwards whatever the reranking keeps.
Results of this rule are labelled approximate wherever shown.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specgym.envs.core.signals import TOPK
from specgym.envs.core.tree import TreeController, TreeRoundOutcome, TreeShape
from specgym.errors import SpecgymError


def eagle_tree(topk: np.ndarray, beam: int, budget: int) -> TreeShape:
    """The EAGLE-2 tree for rows ``topk[d - 1]`` = the draft's top-8 probabilities at depth ``d``.

    Args:
        topk: ``(depth, 8)`` probabilities, each row descending.
        beam: Nodes expanded per depth and children per expanded node (``<= 8``).
        budget: Nodes kept after reranking (``m``).
    """
    rows = np.asarray(topk, dtype=np.float64)[:, :beam].tolist()
    nodes: list[tuple[float, int, tuple[int, ...]]] = []  # (score, depth, rank path)
    frontier: list[tuple[float, tuple[int, ...]]] = [(1.0, ())]
    for d, row in enumerate(rows, start=1):
        gen = [(s * row[r], path + (r,)) for s, path in frontier for r in range(beam)]
        nodes += [(s, d, path) for s, path in gen]
        gen.sort(key=lambda x: (-x[0], x[1]))
        frontier = gen[:beam]
    nodes.sort(key=lambda x: (-x[0], x[1], x[2]))  # ties: shallower first, then lower ranks: closed
    kept = {path for _, _, path in nodes[:budget]}
    counts: list[int] = []
    queue: list[tuple[int, ...]] = [()]
    while queue:
        path = queue.pop(0)
        c = 0
        while path + (c,) in kept:
            c += 1
        counts.append(c)
        queue += [path + (r,) for r in range(c)]
    return TreeShape.from_children(counts, "eagle")


class EagleTree(TreeController):
    """EAGLE-2's dynamic tree per round (modelled from ``draft_topk``; approximate).

    Args:
        depth: Expansion depth ``D``.
        beam: Top-k of each expansion (EAGLE-2's ``top_k``).
        budget: Nodes verified (EAGLE-2's ``total_token`` minus the root).
    """

    approximate = True

    def __init__(self, depth: int = 5, beam: int = 4, budget: int = 16):
        if not (1 <= beam <= TOPK and depth >= 1 and budget >= 1):
            raise SpecgymError(f"tree-eagle needs depth >= 1, 1 <= beam <= {TOPK}, budget >= 1")
        self.depth, self.beam, self.budget = depth, beam, budget
        self.name = "tree-eagle" if (depth, beam, budget) == (5, 4, 16) else f"tree-eagle:{depth}:{beam}:{budget}"

    def propose_tree(self) -> TreeShape:
        """Not used: the tree depends on the round's draft probabilities (see :meth:`tree_for`)."""
        raise SpecgymError("tree-eagle builds its tree from the round's draft probabilities: call tree_for(topk)")

    def tree_for(self, topk: np.ndarray) -> TreeShape:
        """The round's tree from the draft's top-8 rows of its ``depth`` positions."""
        return eagle_tree(topk, self.beam, self.budget)

    def play(self, req: Any) -> TreeRoundOutcome:
        """One replayed round: the tree from the trace's top-8 rows of the next ``depth`` positions (zeros past the
        request's end or without the column), played as modelled (approximate)."""
        o = req.play(self.tree_for(req.draft_topk(self.depth)), draft_depth=self.depth, approximate=True)
        self.observe(o)
        return o

    def play_live(self, req: Any) -> TreeRoundOutcome:
        """One live round: the tree from the draft's real frontier probabilities (exact)."""
        o = req.play_eagle(self.depth, self.beam, self.budget)
        self.observe(o)
        return o

"""Static trees: a fixed shape every round, and the best one found by Sequoia's dynamic program.

**Sequoia** (Chen et al. 2024): with ``p[r]`` = the probability that the target's token has rank ``r`` in the
draft's order given its parent was accepted (measured on the train split: the share of positions whose
``target_rank`` is ``r``; the same vector at every depth), the expected tokens a rank-closed tree accepts is the
sum over its nodes of the product of ``p`` along the node's rank path. The program

    G(D, n) = H_D(0, n)             best expected accepted nodes with <= n nodes and depth <= D below a node
    H_D(r, n) = max(0, max_{m=1..n} p[r] * (1 + G(D - 1, m - 1)) + H_D(r + 1, n - m))   (children of ranks r, r+1..)

finds, for every depth and node budget, the best tree; the rule keeps the one that maximises expected tokens per
unit time ``(1 + G) / tree_round_time(depth, nodes)`` under the profile (plain decoding, ``1 / t_AR``, included).
The tree is then static: every round plays it (exact in greedy replay).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specgym.envs.core.cost import TREE_NODE_LIMIT, CostProfile
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.core.tree import TreeController, TreeShape
from specgym.errors import SpecgymError

#: Ranks the program considers (p[r] for r >= this is dropped: a child of rank 16 is never worth its node).
MAX_RANK = 16


def rank_acceptance(workload: Any, split: str | None = "train", max_rank: int = MAX_RANK) -> np.ndarray:
    """``p[r]`` = share of the split's positions whose target token has draft rank ``r`` (``r < max_rank``)."""
    if workload.target_rank is None:
        raise SpecgymError(f"workload {workload.name!r} has no 'target_rank' column: Sequoia needs the ranks")
    idx = workload.split_indices(split)
    ranks = np.concatenate([workload.target_rank[workload.span(r)] for r in idx.tolist()])
    return np.bincount(np.minimum(ranks, max_rank), minlength=max_rank + 1)[:max_rank] / max(len(ranks), 1)


def _children_to_shape(tree: list, name: str) -> TreeShape:
    """A nested list of children (``tree[r]`` = the rank-r child's own list) as a breadth-first TreeShape."""
    counts, queue = [], [tree]
    while queue:
        node = queue.pop(0)
        counts.append(len(node))
        queue += node
    return TreeShape.from_children(counts, name)


def sequoia_values(p: np.ndarray, node_budget: int, max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """``G[D, n]`` (expected accepted nodes) and the split table ``take[D, r, n]`` (nodes given to the rank-r
    child's subtree, 0 = no child of rank r or above) for ``D <= max_depth``, ``n <= node_budget``."""
    p = np.asarray(p, dtype=np.float64)
    R, B = len(p), node_budget
    G = np.zeros((max_depth + 1, B + 1))
    take = np.zeros((max_depth + 1, R + 1, B + 1), dtype=np.int64)
    for D in range(1, max_depth + 1):
        H = np.zeros((R + 1, B + 1))
        for r in range(R - 1, -1, -1):
            gain = p[r] * (1.0 + G[D - 1, :B])  # gain[m - 1]: the rank-r child with m - 1 nodes below it
            for n in range(1, B + 1):
                cand = gain[:n] + H[r + 1, n - 1 :: -1][:n]  # m = 1..n: gain[m-1] + H[r+1, n-m]
                m = int(np.argmax(cand))
                if cand[m] > 0.0:
                    H[r, n], take[D, r, n] = cand[m], m + 1
        G[D] = H[0]
    return G, take


def _build(take: np.ndarray, D: int, n: int) -> list:
    children, r = [], 0
    while D > 0 and n > 0 and r < take.shape[1] - 1 and take[D, r, n] > 0:
        m = int(take[D, r, n])
        children.append(_build(take, D - 1, m - 1))
        n -= m
        r += 1
    return children


def sequoia_tree(p: np.ndarray, profile: CostProfile, node_budget: int = TREE_NODE_LIMIT,
                 max_depth: int = DEFAULT_K_MAX) -> tuple[TreeShape, float]:
    """The tree maximising expected tokens per ms, and that rate (tokens/ms)."""
    G, take = sequoia_values(p, node_budget, max_depth)
    best, best_rate = TreeShape.from_widths(()), 1.0 / profile.t_ar_ms
    for D in range(1, max_depth + 1):
        for n in range(1, node_budget + 1):
            tree = _children_to_shape(_build(take, D, n), "sequoia")
            if tree.nodes == 0:
                continue
            rate = (1.0 + G[D, n]) / profile.tree_round_time(tree.depth, tree.nodes)
            if rate > best_rate + 1e-12:
                best, best_rate = tree, rate
    return best, best_rate


def expected_accepted(tree: TreeShape, p: np.ndarray) -> float:
    """Sum over the tree's nodes of the product of ``p`` along their rank paths (Sequoia's objective)."""
    prob = np.zeros(tree.nodes + 1)
    prob[0] = 1.0
    for v in range(tree.nodes + 1):
        for r, c in enumerate(tree.child[v]):
            if c >= 0:
                prob[c] = prob[v] * (p[r] if r < len(p) else 0.0)
    return float(prob[1:].sum())


class StaticTree(TreeController):
    """Play the same tree every round.

    Args:
        tree: The tree (``TreeShape.from_widths((2, 2, 1))``...).
        name: Display name (default ``tree-static:<widths>``).
    """

    def __init__(self, tree: TreeShape, name: str | None = None):
        self.tree = tree
        self.name = name or f"tree-static:{tree.name}"

    def propose_tree(self) -> TreeShape:
        """The fixed tree."""
        return self.tree

    def static_shape(self) -> TreeShape:
        """The fixed tree (the replay serves every request at once)."""
        return self.tree


class SequoiaTree(StaticTree):
    """The static tree of Sequoia's program, fitted on the workload's train split in :meth:`prepare`.

    Args:
        node_budget: Most draft nodes.
        max_depth: Deepest tree.
    """

    def __init__(self, node_budget: int = TREE_NODE_LIMIT, max_depth: int = DEFAULT_K_MAX):
        super().__init__(TreeShape.from_widths(()), "tree-sequoia" if node_budget == TREE_NODE_LIMIT
                         else f"tree-sequoia:{node_budget}")
        self.node_budget = node_budget
        self.max_depth = max_depth
        self.rate = 0.0

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """Measure ``p[r]`` on the fit split (:attr:`Workload.fit_split`) and solve the program under ``profile``."""
        p = rank_acceptance(workload, workload.fit_split)
        self.tree, self.rate = sequoia_tree(p, profile, self.node_budget, self.max_depth)
        return []

"""Tree drafts: the shape of a tree round, its outcome record and the tree-controller interface.

A **tree round** at completion position ``i`` drafts a tree of candidate continuations instead of one chain and
verifies every node in one target forward with tree attention. Trees here are **rank-defined**: every node's
children are its draft distribution's top-``c`` tokens (ranks ``0..c-1``), ``c`` chosen per node. Two ways to
choose them:

* a **shape** (SpecInfer's expansion config, Sequoia's static trees): :meth:`TreeShape.from_widths` with per-depth
  widths ``(w_1, .., w_D)`` (every node at depth ``d - 1`` expands its top-``w_d`` children), or any rank-closed
  tree (:meth:`TreeShape.from_children`);
* a **node set chosen by path confidence** (EAGLE-2): expand the best nodes by the product of draft probabilities
  along their path, rerank, keep the top ``m`` (the verification budget). Closed under ancestors and lower-ranked
  siblings, so it is again a rank-defined tree (:mod:`specgym.baselines.tree_eagle`).

**Acceptance** (greedy): the target's token at depth ``d`` of the true path has rank ``target_rank[i + d - 1]`` in
the draft's order at the correct prefix; it is in the tree iff its true-path parent is and that parent has more
than ``target_rank[i + d - 1]`` children. ``accepted`` = the depth of the deepest true-path node in the tree, the
round produces ``accepted + 1`` tokens (the target's own token after it). Off-path subtrees never change greedy
acceptance, which is why rank-defined trees replay exactly. **Cost**: one draft forward per depth (batched over
the frontier) and one verify over ``nodes + 1`` tokens (:meth:`CostProfile.tree_round_time`). A chain of K is the
width-1 tree ``(1,) * K``: same acceptance, same time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from specgym.envs.core.controller import Prepared
from specgym.envs.core.cost import TREE_NODE_LIMIT
from specgym.envs.core.kinds import HEAD_DRAFTER
from specgym.envs.core.rounds import TOKEN_FEATURES, RequestContext
from specgym.errors import SpecgymError


def head_tree_context(ctx: RequestContext) -> RequestContext:
    """What a controller of trees drafted by the draft head knows of a request: its rounds priced as the head's
    (:meth:`CostProfile.led_by`) and no per-token features along its spine (:data:`TOKEN_FEATURES`: a recording
    holds the head's ranks and top-8 rows, not what its spine reports), the same in replay and live."""
    return replace(ctx, profile=ctx.profile.led_by(HEAD_DRAFTER, "model"), lacks=ctx.lacks | TOKEN_FEATURES)


class TreeShape:
    """A rank-defined draft tree: node 0 is the root (the last verified token), ``child[v, r]`` is the child of
    node ``v`` holding its rank-``r`` token (-1 = none; children always hold ranks ``0..c-1``).

    Attributes:
        child: ``(nodes + 1, max_children)`` int32 child table.
        depth_of: ``(nodes + 1,)`` depth of each node (root 0).
        depth: Deepest node's depth.
        nodes: Draft nodes (root excluded).
        nodes_upto: ``nodes_upto[d]`` = nodes at depth ``<= d`` (``d = 0..depth``): the tree clipped to depth d.
        name: Display name (the widths for shapes, e.g. ``2-2-1``).
    """

    __slots__ = ("child", "depth_of", "depth", "nodes", "nodes_upto", "name", "_child_list")

    def __init__(self, child: np.ndarray, name: str):
        child = np.asarray(child, dtype=np.int32)
        if child.ndim != 2 or child.shape[0] < 1:
            raise SpecgymError(f"tree {name!r}: child table must be (nodes + 1, max_children)")
        n = child.shape[0] - 1
        if n > TREE_NODE_LIMIT:
            raise SpecgymError(f"tree {name!r}: {n} nodes, above the limit {TREE_NODE_LIMIT}")
        depth_of = np.zeros(n + 1, dtype=np.int64)
        seen = np.zeros(n + 1, dtype=bool)
        seen[0] = True
        for v in range(n + 1):  # children are numbered after their parents (breadth-first)
            if not seen[v]:
                raise SpecgymError(f"tree {name!r}: node {v} has no parent before it")
            row = child[v]
            kids = row[row >= 0]
            if not np.array_equal(row[: len(kids)], kids) or (kids <= v).any() or seen[kids].any():
                raise SpecgymError(f"tree {name!r}: children of node {v} must hold ranks 0..c-1, numbered after it")
            seen[kids] = True
            depth_of[kids] = depth_of[v] + 1
        self.child = child
        self.depth_of = depth_of
        self.depth = int(depth_of.max())
        self.nodes = n
        self.nodes_upto = np.array([int((depth_of[1:] <= d).sum()) for d in range(self.depth + 1)], dtype=np.int64)
        self.name = name
        self._child_list = child.tolist()

    @classmethod
    def from_widths(cls, widths: tuple[int, ...] | list[int]) -> TreeShape:
        """The static tree where every node at depth ``d - 1`` expands its top-``widths[d-1]`` children."""
        w = [int(x) for x in widths]
        if any(x < 1 for x in w):
            raise SpecgymError(f"tree widths must be >= 1, got {tuple(widths)}")
        total = int(sum(np.prod(w[: d + 1]) for d in range(len(w))))
        if total > TREE_NODE_LIMIT:
            raise SpecgymError(f"tree widths {tuple(w)}: {total} nodes, above the limit {TREE_NODE_LIMIT}")
        table = np.full((total + 1, max(w, default=1)), -1, dtype=np.int32)
        frontier, nxt = [0], 1
        for width in w:
            new = []
            for v in frontier:
                table[v, :width] = np.arange(nxt, nxt + width)
                new += list(range(nxt, nxt + width))
                nxt += width
            frontier = new
        return cls(table, "-".join(map(str, w)) if w else "ar")

    @classmethod
    def chain(cls, k: int) -> TreeShape:
        """The chain of ``k`` draft tokens: widths ``(1,) * k``."""
        return cls.from_widths((1,) * k)

    @classmethod
    def from_children(cls, counts: list[int], name: str = "tree") -> TreeShape:
        """A rank-closed tree from the child count of each node in breadth-first order (root first)."""
        table = np.full((len(counts), max(max(counts, default=1), 1)), -1, dtype=np.int32)
        nxt = 1
        for v, c in enumerate(counts):
            table[v, :c] = np.arange(nxt, nxt + c)
            nxt += c
        if nxt != len(counts):
            raise SpecgymError(f"tree {name!r}: child counts give {nxt} nodes, listed {len(counts)}")
        return cls(table, name)

    def accepted(self, ranks: list[int], room: int) -> int:
        """Depth of the deepest true-path node: ``ranks[d-1]`` is the target's rank at depth ``d``; the walk stops
        at depth ``room`` (the tree clipped to the request's end)."""
        child = self._child_list
        v, a = 0, 0
        limit = min(self.depth, room)
        width = len(child[0])
        while a < limit:
            r = ranks[a]
            if r >= width:
                break
            v = child[v][r]
            if v < 0:
                break
            a += 1
        return a

    def __repr__(self) -> str:
        return f"TreeShape({self.name!r}, depth={self.depth}, nodes={self.nodes})"


@dataclass(slots=True)
class TreeRoundOutcome:
    """Result of one verified tree round (the accepted/produced/time fields of a chain round).

    Attributes:
        position: Completion position ``i`` at the start of the round.
        depth: Depth of the tree after clipping to ``N - i - 1`` (draft forwards run).
        nodes: Draft nodes verified (the root excluded).
        accepted: Depth of the deepest true-path node in the tree (tokens accepted).
        produced: ``accepted + 1``.
        time_ms: Cost of the round (:meth:`CostProfile.tree_round_time`).
        done: True when the request's completion is finished after this round.
        approximate: True when acceptance came from a modelled (confidence-chosen) tree, not an exact replay.
    """

    position: int
    depth: int
    nodes: int
    accepted: int
    produced: int
    time_ms: float
    done: bool = False
    approximate: bool = False


class TreeController(Prepared, ABC):
    """Chooses the draft tree of each round (the tree counterpart of :class:`~specgym.envs.core.controller.Controller`).

    Lifecycle: ``prepare(workload, profile)`` once before serving (rules fitted on the train split do it here),
    then per request ``reset(ctx)`` and per round :meth:`play` (replay) or :meth:`play_live` (the live tree
    engine): by default ``propose_tree()`` -> the engine plays it -> ``observe(outcome)``. A controller whose tree
    depends on the round itself (EAGLE-2's draft probabilities, a spine grown token by token, a chain controller's
    token-level stops) overrides them: the controller says how it plays, the runner only loops. One that plays
    the same tree every round says so with :meth:`static_shape` (the replay then serves all requests at once).

    Attributes:
        name: Display name; tree controllers' names start with ``tree``.
        approximate: True when its replayed results are modelled, not exact (shown in reports).
        drafter: Who drafts its trees live: ``None`` the draft model, ``"head"`` the pair's draft head
            (``TREE_SPEC@head``).
    """

    name: str = "tree"
    approximate: bool = False
    drafter: str | None = None
    ctx: RequestContext

    def static_shape(self) -> TreeShape | None:
        """The one tree played every round, or ``None`` for a controller whose trees vary."""
        return None

    def check_live(self) -> None:  # noqa: B027  (optional hook)
        """Raise one line unless the live tree engine can drive this controller (default: it can)."""

    def play(self, req: Any) -> TreeRoundOutcome:
        """One replayed round of ``req`` (a tree replay request): propose, play, observe."""
        o = req.play(self.propose_tree())
        self.observe(o)
        return o

    def play_live(self, req: Any) -> TreeRoundOutcome:
        """One live round of ``req`` (a live tree request): propose, play, observe."""
        o = req.play_tree(self.propose_tree())
        self.observe(o)
        return o

    def reset(self, ctx: RequestContext) -> None:
        """Start a new request."""
        self.ctx = ctx

    @abstractmethod
    def propose_tree(self) -> TreeShape:
        """The tree of the next round."""

    def observe(self, outcome: TreeRoundOutcome) -> None:  # noqa: B027  (optional hook)
        """Update state from a verified round (default: nothing)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

"""EAGLE-2's parameters fitted on the workload's fit split (``tree-eagle:fit[@DRAFTER]``).

EAGLE-2's depth, beam and node budget were tuned for a GPU, where a wider verify is nearly free. On another machine
and pair the best are others, so :class:`FittedEagleTree` replays a grid of ``(depth, beam, budget)`` on the fit split
(never the test split) with the drafter's own columns (the head's per-start ranks and top-8 rows for ``@head``, the
draft model's ``target_rank`` / ``draft_topk`` otherwise), all positions and combinations at once
(:func:`replay_grid`: equal to the scalar replay of :class:`~specgym.baselines.tree_eagle.EagleTree` to the last bit),
and plays the fastest. Approximate as the rule's replay is (:mod:`specgym.baselines.tree_eagle`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.baselines.tree_eagle import EagleTree
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.core.signals import TOPK
from specgym.envs.core.tree import TreeRoundOutcome
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.envs.workloads.workload import HEAD_TOPK_SCALE
from specgym.errors import SpecgymError

#: The beams (EAGLE-2's ``top_k``) and node budgets the fit replays; depths run from 1 to the engine's deepest tree.
FIT_BEAMS = (1, 2, 3, 4)
FIT_BUDGETS = tuple(range(1, 17))


@dataclass(frozen=True)
class EagleFit:
    """The fitted EAGLE-2 parameters and what they were fitted on.

    Attributes:
        depth: Expansion depth ``D``.
        beam: Top-k of each expansion.
        budget: Nodes verified.
        time_ms: Their replayed time on the fit split.
        split: The split fitted on.
        candidates: How many ``(D, beam, budget)`` were replayed (a budget above the nodes a ``(D, beam)`` grows is
            the same tree as keeping them all, and is not replayed twice).
    """

    depth: int
    beam: int
    budget: int
    time_ms: float
    split: str
    candidates: int


@dataclass
class _Positions:
    """Every position of the fitted requests, flat (local index ``l``), with what a round starting there reads."""

    rows: np.ndarray  # (P, depth, 8) float64: the top-8 rows a round starting there sees (as replay builds them)
    ranks: np.ndarray  # (P, depth) the target's rank at each depth of a round starting there
    rem: np.ndarray  # (P,) tokens after this one in its request (the room before the tree's depth clips it)
    kv: np.ndarray  # (P,) cached tokens when a round starts there (prompt + position)


def _positions(engine: Any, reqs: np.ndarray, depth: int) -> _Positions:
    """What :class:`TreeReplayRequest` reads at every position of ``reqs`` (its ``draft_topk(depth)`` and
    ``ranks``), all at once and bit for bit: the head's per-start rows, or the draft model's per-position ones."""
    wl = engine.workload
    starts, ends = wl.offsets[reqs].astype(np.int64), wl.offsets[reqs + 1].astype(np.int64)
    g = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
    i = g - np.repeat(starts, ends - starts)
    left = np.repeat(ends, ends - starts) - g  # tokens from here to the end, this one included
    d = np.arange(depth)
    rows = np.zeros((len(g), depth, TOPK), np.float32)
    if engine.rank_rows is not None:
        if wl.topk_head is None:
            raise SpecgymError(f"workload {wl.name!r} has no 'topk_head' column (the draft head's top-8 probabilities "
                               "per start), which EAGLE-2 on the head needs in replay")
        head = wl.topk_head[g].reshape(len(g), -1, TOPK).astype(np.float32) / HEAD_TOPK_SCALE
        j = min(depth, head.shape[1])
        rows[:, :j] = head[:, :j]
        ranks = np.zeros((len(g), depth), np.int64)
        ranks[:, :j] = engine.rank_rows[g, :j]
    else:
        if wl.draft_topk is not None:
            rows[:] = wl.draft_topk[np.minimum(g[:, None] + d, len(wl.draft_topk) - 1)]
        ranks = engine.ranks[np.minimum(g[:, None] + d, len(engine.ranks) - 1)]
    rows[d[None, :] >= left[:, None]] = 0.0  # past the request's end: zero rows, as draft_topk gives
    return _Positions(rows.astype(np.float64), ranks, left - 1, wl.prompt_len[np.repeat(reqs, ends - starts)] + i)


def _grow(rows: np.ndarray, beam: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """EAGLE-2's expansion (:func:`eagle_tree`) at every position at once: ``(score, path, depth)`` of every node
    generated, depth by depth (``path``: the node's ranks in base ``beam``; the frontier kept by score, then path)."""
    n, depth, _ = rows.shape
    f_score, f_path = np.ones((n, 1)), np.zeros((n, 1), np.int64)
    scores, paths, depths = [], [], []
    for d in range(depth):
        score = (f_score[:, :, None] * rows[:, None, d, :beam]).reshape(n, -1)
        path = (f_path[:, :, None] * beam + np.arange(beam)).reshape(n, -1)
        scores.append(score)
        paths.append(path)
        depths.append(np.full(score.shape[1], d + 1))
        keep = np.lexsort((path, -score), axis=1)[:, :beam]
        f_score, f_path = np.take_along_axis(score, keep, 1), np.take_along_axis(path, keep, 1)
    return np.concatenate(scores, 1), np.concatenate(paths, 1), np.concatenate(depths)


def _outcomes(engine: Any, pts: _Positions, beam: int, grid: list[tuple[int, int, int]]) -> tuple[list, list]:
    """Per ``(D, beam, budget)`` of ``beam``: accepted tokens and round time of a round at every position, as
    :meth:`EagleTree.play` replays it (the kept nodes are the first ``budget`` by score, depth, path: a closed set,
    so the true path is accepted down to its first node not kept, clipped to the request's end)."""
    score, path, depth = _grow(pts.rows, beam)
    n, max_depth = pts.ranks.shape
    reached = np.cumprod(pts.ranks < beam, axis=1).astype(bool)  # every rank down to this depth below the beam
    true_path = np.zeros(n, np.int64)
    true_col = np.full((n, max_depth), -1)
    for d in range(max_depth):  # the column of the true path's node at depth d + 1, where it was generated
        true_path = true_path * beam + np.minimum(pts.ranks[:, d], beam - 1)
        cols = np.flatnonzero(depth == d + 1)
        hit = (path[:, cols] == true_path[:, None]) & reached[:, d : d + 1]
        true_col[:, d] = np.where(hit.any(1), cols[hit.argmax(1)], -1)
    prof, per_kv = engine.profile, engine.per_kv
    times = np.array([[prof.tree_round_time(d, k) for k in range(max(FIT_BUDGETS) + 1)] for d in range(max_depth + 1)])
    top = max(FIT_BUDGETS)  # only the first `top` nodes by rank can be kept
    accs, tms = [], []
    full = np.lexsort((path, np.broadcast_to(depth, path.shape), -score), axis=1)  # every node, by EAGLE-2's rerank
    for big_d in sorted({g[0] for g in grid}):
        m = int(np.sum(depth <= big_d))
        within = depth[full] <= big_d  # a depth-D tree reranks the nodes down to D: the same order, the rest left out
        nth = np.cumsum(within, axis=1, dtype=np.int16) - 1
        rows, cols = np.nonzero(within & (nth < top))
        order = np.empty((n, min(m, top)), np.int64)
        order[rows, nth[rows, cols]] = full[rows, cols]
        ranked = depth[order]  # (n, <= top): the depth of the nodes kept first
        deepest = np.maximum.accumulate(ranked, axis=1)
        upto = np.zeros((big_d + 1, n, ranked.shape[1] + 1), np.int16)  # upto[e, :, k]: of the first k, depth <= e
        for e in range(1, big_d + 1):
            np.cumsum(ranked <= e, axis=1, out=upto[e, :, 1:])
        col = true_col[:, :big_d, None]
        hit = (order[:, None, :] == col) & (col >= 0)
        true_place = np.where(hit.any(2), hit.argmax(2), top)  # where the true path's node ranks, else past them
        worst = np.maximum.accumulate(true_place, axis=1)  # the true path is kept to depth d iff worst[d] < budget
        budgets = np.array([g[2] for g in grid if g[0] == big_d])  # every budget of this depth at once: (n, budgets)
        room = np.minimum(pts.rem[:, None], deepest[:, np.minimum(budgets, m) - 1])
        acc = np.minimum(np.sum(worst[:, :, None] < budgets, axis=1), room)
        tm = times[room, upto[room, np.arange(n)[:, None], np.minimum(budgets, m)]]
        if per_kv is not None:
            tm = tm + np.asarray(per_kv)[np.minimum(room, 1)] * pts.kv[:, None]
        extra = np.where(room > 0, np.maximum(np.minimum(big_d, pts.rem)[:, None] - room, 0), 0)
        accs += list(acc.T)
        tms += list((tm + extra * prof.draft_ms).T)
    return accs, tms


def replay_grid(workload: Any, profile: CostProfile, k_max: int, drafter: str | None,
                split: str) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """Every ``(depth, beam, budget)`` of the fit's grid and its total replayed time on ``split``: depths ``1..k_max``
    (at most the recorded head depth), :data:`FIT_BEAMS`, :data:`FIT_BUDGETS`, each played on every request at once
    with :meth:`EagleTree.play`'s semantics, for trees drafted by ``drafter`` (``None`` the draft model, ``head``)."""
    engine = TreeEngine(workload, profile, k_max, drafter=drafter)
    reqs = workload.split_indices(split)
    pts = _positions(engine, reqs, engine.max_depth)
    lengths = workload.lengths[reqs].astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    grid: list[tuple[int, int, int]] = []
    totals: list[np.ndarray] = []
    for beam in FIT_BEAMS:  # one beam's tables at a time (a few bytes per position and combination)
        sub = [(d, beam, b) for d in range(1, engine.max_depth + 1) for b in FIT_BUDGETS
               if b <= (d if beam == 1 else beam + (d - 1) * beam * beam)]  # more than it grows: keeps them all
        acc, tm = _outcomes(engine, pts, beam, sub)
        grid += sub
        totals.append(walk_totals(np.stack(acc).astype(np.int8), np.stack(tm), starts, lengths))
    return grid, np.concatenate(totals)


def walk_totals(acc: np.ndarray, tm: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Total time of each combination (rows of ``acc``/``tm``: accepted tokens and time of a round at each local
    position) over the requests at ``starts``, every (combination, request) round by round at once."""
    n_combo, n_req = len(acc), len(starts)
    combo = np.repeat(np.arange(n_combo), n_req)
    pos, end = np.tile(starts, n_combo), np.tile(starts + lengths, n_combo)
    total = np.zeros(len(pos))
    live = np.arange(len(pos))
    while len(live):
        p, c = pos[live], combo[live]
        total[live] += tm[c, p]
        pos[live] = p + acc[c, p] + 1
        live = live[pos[live] < end[live]]
    return total.reshape(n_combo, n_req).sum(axis=1)


def fit_eagle(workload: Any, profile: CostProfile, k_max: int, drafter: str | None = None,
              split: str | None = None) -> EagleFit:
    """EAGLE-2's ``(depth, beam, budget)`` of least replayed time on ``split`` (default: the workload's fit split,
    never another) among :func:`replay_grid`'s, for trees drafted by ``drafter`` (its modelled trees: approximate);
    ties go to the narrowest beam, then the shallowest, then the smallest budget."""
    split = split or workload.fit_split
    grid, per_candidate = replay_grid(workload, profile, k_max, drafter, split)
    best = int(np.argmin(per_candidate))
    d, b, m = grid[best]
    return EagleFit(d, b, m, float(per_candidate[best]), split, len(grid))


class FittedEagleTree(EagleTree):
    """``tree-eagle:fit[@DRAFTER]``: EAGLE-2's rule with ``(depth, beam, budget)`` fitted in :meth:`prepare` on the
    workload's fit split, for the drafter that drafts its trees (its own columns: the head's per-start ranks and
    top-8 rows for ``@head``), then played as :class:`EagleTree`.

    Args:
        k_max: The deepest tree the fit tries.
    """

    #: Fits on the columns of the drafter it plays with (so its ``@head`` trees replay; :func:`run_tree`).
    fits_on_drafter = True

    def __init__(self, k_max: int = DEFAULT_K_MAX) -> None:
        super().__init__()
        self.k_max = k_max
        self.fitted: EagleFit | None = None
        self.name = "tree-eagle:fit"

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """Fit ``(depth, beam, budget)`` on the workload's fit split under ``profile`` (:func:`fit_eagle`)."""
        fit = fit_eagle(workload, profile, self.k_max, self.drafter)
        self.fitted, self.depth, self.beam, self.budget = fit, fit.depth, fit.beam, fit.budget
        on = f"@{self.drafter}" if self.drafter else ""
        return [f"fitted on {workload.name}'s {fit.split} split: tree-eagle:{fit.depth}:{fit.beam}:{fit.budget}{on} "
                f"(depth, beam, budget; {fit.candidates} combinations replayed, approximate)"]

    def _fitted(self) -> None:
        if self.fitted is None:
            raise SpecgymError(f"{self.name}: call prepare(workload, profile) first (it fits depth, beam and budget on "
                               "the workload's fit split)")

    def play(self, req: Any) -> TreeRoundOutcome:
        """One replayed round with the fitted parameters."""
        self._fitted()
        return super().play(req)

    def play_live(self, req: Any) -> TreeRoundOutcome:
        """One live round with the fitted parameters."""
        self._fitted()
        return super().play_live(req)


def eagle_outcomes(engine: TreeEngine, reqs: np.ndarray, depth: int, beam: int,
                   budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Accepted tokens and time of one :class:`EagleTree` round ``(depth, beam, budget)`` started at every position
    of ``reqs`` (flat, request after request), all at once, as its scalar replay plays each (what a rule that
    plays the tree between other rounds fits on: :mod:`specgym.baselines.tree_hybrid`)."""
    depth = min(depth, engine.max_depth)
    acc, tm = _outcomes(engine, _positions(engine, np.asarray(reqs, np.int64), depth), beam, [(depth, beam, budget)])
    return acc[0].astype(np.int64), tm[0]

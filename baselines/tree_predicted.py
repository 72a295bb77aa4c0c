"""A dynamic tree from predicted acceptance (``tree-predicted:NAME``): a spine of the draft's top-1 tokens, grown
depth by depth while it pays, with side leaves where the target's token is likely a lower rank.

The marginal rule (:mod:`specgym.baselines.marginal`) of ``predicted:NAME`` made tree-shaped. Per round:

1. **Spine.** The draft drafts its top-1 continuation (the chain), one forward per depth. After forward ``d`` the
   draft's distribution at the spine node of depth ``d - 1`` is known, so are the predictor's acceptance
   ``a_d = P(target's token = its top-1)`` (:class:`~specgym.envs.core.acceptance_predictor.AcceptancePredictor`
   over the draft's top-8, the context lookup...) and, from its top-8 probabilities, ``s_{d,r} = P(target's token
   = its rank r)`` (``r = 1..7``; a calibration table fitted on the train split: ``(1 - a_d)`` times the share of
   rank ``r`` among non-top-1 positions whose ``q_r / (1 - q_0)`` falls in the same bin).
2. **Nodes of depth d.** With ``S`` = P(the true path is on the spine down to depth ``d - 1``) (the product of the
   spine's ``a``), the spine child adds ``S a_d`` expected accepted tokens, the rank-``r`` side leaf ``S s_{d,r}``;
   each is kept (spine first, then ranks 1, 2, ..) while it raises the round's expected rate
   ``(1 + E) / tree_round_time(depth, nodes)`` — the verify slope prices every node. No spine child: stop.
3. **One more forward?** Run forward ``d + 1`` iff the spine child's next token, accepted with ``S a_d a_next``,
   raises the rate with its forward and node paid; ``a_next`` is known before that forward: a train-split table of
   the next position's top-1 acceptance by the current ``a_d`` (10 bins) and the next position's context-lookup
   match length (computed on the drafted prefix, before the draft runs). Before forward 1, ``a_next`` is the
   request's running per-token acceptance (:class:`FeatureTracker`'s ``alpha_hat``).

Every decision uses what a deployed draft has before it is taken (no target rank, no later position's draft
distribution), the same signals ``predicted:NAME`` reads per draft token. **Replay**: acceptance is the exact walk
of the ranks (:meth:`TreeReplayRequest.play`); the spine's signals are the trace's correct-prefix ones, as the chain
replay's for draft tokens after the first rejection: where the true path has already left the spine they only
decide how much more is drafted (cost), never what is accepted (docs/kinds/tree.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.envs.core.acceptance_predictor import AcceptancePredictor, SignalSource, design_matrix
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.features import FeatureTracker
from specgym.envs.core.lookup import LOOKUP_MAX_N
from specgym.envs.core.rounds import DEFAULT_K_MAX, RequestContext
from specgym.envs.core.signals import TOPK
from specgym.envs.core.tree import TreeController, TreeRoundOutcome, TreeShape
from specgym.errors import SpecgymError
from specgym.paths import MODEL_ROOTS

#: Bins of ``q_r / (1 - q_0)`` (side-rank table) and of ``a_d`` (next-acceptance table).
SIDE_BINS = 20
ACCEPT_BINS = 10
_PRIOR_WEIGHT = 5.0  # pseudo-counts pulling sparse table cells to the split's mean


def spine_tree(widths: list[int]) -> TreeShape:
    """The tree whose spine node at depth ``d - 1`` has ``widths[d-1]`` children (rank 0 = the next spine node,
    ranks 1.. = leaves)."""
    counts: list[int] = []
    for d, w in enumerate(widths):
        counts.append(w)
        if d > 0:
            counts += [0] * (widths[d - 1] - 1)
    if widths:
        counts += [0] * widths[-1]
    return TreeShape.from_children(counts, "spine") if widths else TreeShape.from_widths(())


@dataclass
class SpineTables:
    """The train-split calibration of the rule (numpy arrays; JSON-able with :meth:`to_dict`).

    Attributes:
        side: ``(TOPK - 1, SIDE_BINS)`` P(rank = r | rank != 0, bin of ``q_r / (1 - q_0)``), ``r = 1..7``.
        next_accept: ``(ACCEPT_BINS, LOOKUP_MAX_N + 1)`` P(next position's rank = 0 | bin of ``a_d``, next lookup
            length).
    """

    side: np.ndarray
    next_accept: np.ndarray

    def side_probs(self, topk: np.ndarray, accept: float) -> np.ndarray:
        """``s_r`` for ``r = 1..7`` of one draft distribution's top-8 row and its predicted top-1 acceptance."""
        q = np.asarray(topk, dtype=np.float64)
        ratio = q[1:] / max(1.0 - q[0], 1e-6)
        b = np.minimum((ratio * SIDE_BINS).astype(np.int64), SIDE_BINS - 1)
        return (1.0 - accept) * self.side[np.arange(TOPK - 1), b]

    def next_accept_of(self, accept: float, next_lookup_len: int) -> float:
        """``a_next`` from the current acceptance and the next position's lookup match length."""
        b = min(int(accept * ACCEPT_BINS), ACCEPT_BINS - 1)
        return float(self.next_accept[b, min(max(int(next_lookup_len), 0), LOOKUP_MAX_N)])


def predicted_accept(workload: Any, predictor: AcceptancePredictor) -> np.ndarray:
    """The predictor's top-1 acceptance at every position of ``workload`` (one vectorised pass; the model of the
    predictor's chain the workload feeds: :meth:`AcceptancePredictor.for_source`)."""
    pos = np.concatenate([np.arange(n) for n in workload.lengths.tolist()]) if workload.n_requests else \
        np.zeros(0, np.int64)
    temp = np.repeat(np.asarray(workload.temperature, np.float64), workload.lengths)
    what = f"predictor {predictor.name!r}"
    conf, ent = workload.require("draft_conf", what), workload.require("draft_entropy", what)
    x = design_matrix(predictor.groups, conf, ent, pos, temp, workload.draft_topk, workload.lookup_len,
                      workload.lookup_agree, workload.hidden_sketch)
    if x is None or x.shape[1] != len(predictor.mean):
        raise SpecgymError(f"workload {workload.name!r} lacks the signals predictor {predictor.name!r} reads "
                           f"({', '.join(predictor.groups)})")
    return predictor.predict_matrix(x)


def calibrated_confidence(workload: Any, split: str = "train", bins: int = 20) -> np.ndarray:
    """The draft's top-1 confidence mapped to the acceptance rate observed at that confidence on ``split``'s
    positions (equal-width bins, each shrunk toward the split's mean by one pseudo-position): the acceptance a
    predictor-less tree prices with."""
    conf = np.clip(np.asarray(workload.require("draft_conf", "calibrated confidence"), np.float64), 0.0, 1.0)
    accept = np.asarray(workload.require("p_accept", "calibrated confidence"), np.float64)
    rows = np.concatenate([np.arange(workload.offsets[r], workload.offsets[r + 1])
                           for r in workload.split_indices(split).tolist()] or [np.zeros(0, np.int64)])
    if not len(rows):
        raise SpecgymError(f"workload {workload.name!r}: its {split!r} split is empty: tree-predicted fits on it")
    which = np.minimum((conf * bins).astype(np.int64), bins - 1)
    mean = float(accept[rows].mean())
    total = np.bincount(which[rows], weights=accept[rows], minlength=bins)
    count = np.bincount(which[rows], minlength=bins)
    table = (total + mean) / (count + 1.0)
    return table[which].astype(np.float64)


def fit_tables(workload: Any, accept: np.ndarray, split: str = "train") -> SpineTables:
    """Fit :class:`SpineTables` on ``split``'s positions (``accept`` = :func:`predicted_accept`)."""
    if workload.target_rank is None or workload.draft_topk is None or workload.lookup_len is None:
        raise SpecgymError(f"workload {workload.name!r} needs target_rank, draft_topk and lookup_len (trace format "
                           f"v2) to fit tree-predicted")
    rows = np.concatenate([np.arange(workload.offsets[r], workload.offsets[r + 1])
                           for r in workload.split_indices(split).tolist()] or [np.zeros(0, np.int64)])
    if not len(rows):
        raise SpecgymError(f"workload {workload.name!r}: its {split!r} split is empty: tree-predicted fits on it")
    ranks = workload.target_rank.astype(np.int64)
    topk = workload.draft_topk[rows].astype(np.float64)
    off = ranks[rows] != 0
    ratio = topk[:, 1:] / np.maximum(1.0 - topk[:, :1], 1e-6)
    bins = np.minimum((ratio * SIDE_BINS).astype(np.int64), SIDE_BINS - 1)[off]
    side = np.zeros((TOPK - 1, SIDE_BINS))
    for r in range(1, TOPK):
        hit = (ranks[rows][off] == r).astype(np.float64)
        cnt = np.bincount(bins[:, r - 1], minlength=SIDE_BINS)
        got = np.bincount(bins[:, r - 1], weights=hit, minlength=SIDE_BINS)
        side[r - 1] = (got + _PRIOR_WEIGHT * hit.mean()) / (cnt + _PRIOR_WEIGHT) if len(hit) else 0.0
    last = np.zeros(len(ranks), bool)
    last[workload.offsets[1:] - 1] = True
    rows = rows[~last[rows]]  # pairs (p, p + 1) inside one request
    b = np.minimum((accept[rows] * ACCEPT_BINS).astype(np.int64), ACCEPT_BINS - 1)
    ll = np.clip(workload.lookup_len[rows + 1].astype(np.int64), 0, LOOKUP_MAX_N)
    key = b * (LOOKUP_MAX_N + 1) + ll
    hit = (ranks[rows + 1] == 0).astype(np.float64)
    size = ACCEPT_BINS * (LOOKUP_MAX_N + 1)
    cnt, got = np.bincount(key, minlength=size), np.bincount(key, weights=hit, minlength=size)
    mean = hit.mean() if len(hit) else 0.0
    nxt = ((got + _PRIOR_WEIGHT * mean) / (cnt + _PRIOR_WEIGHT)).reshape(ACCEPT_BINS, LOOKUP_MAX_N + 1)
    return SpineTables(side, nxt)


class SpineRound:
    """The decisions of one round, depth by depth (deployment and replay share it).

    Usage: ``before_forward(a_next)`` -> run the draft forward -> ``take(a, sides)`` -> widths... ; ``widths`` is
    the round's spine tree, ``forwards`` the draft forwards paid.

    Args:
        profile: Prices rounds.
        max_depth: Deepest spine (the round's room).
    """

    __slots__ = ("profile", "max_depth", "expected", "on_spine", "nodes", "forwards", "widths", "_time")

    def __init__(self, profile: CostProfile, max_depth: int):
        self.profile = profile
        self.max_depth = max_depth
        self.expected = 0.0  # expected accepted tokens of the tree so far
        self.on_spine = 1.0  # P(the true path is on the spine down to the last included depth)
        self.nodes = 0
        self.forwards = 0
        self.widths: list[int] = []
        self._time = profile.t_ar_ms  # time of the round as it stands (no forward yet: a plain step)

    def _rate(self, gain: float, time_ms: float) -> float:
        return (1.0 + self.expected + gain) / time_ms

    def before_forward(self, next_accept: float) -> bool:
        """Run one more draft forward? (It pays iff its spine child, accepted with ``on_spine * next_accept``, raises
        the expected rate with the forward and the node paid.)"""
        if self.forwards >= self.max_depth or len(self.widths) < self.forwards:
            return False
        t = self.profile.tree_round_time(self.forwards + 1, self.nodes + 1)
        if self._rate(self.on_spine * next_accept, t) <= self._rate(0.0, self._time):
            return False
        self.forwards += 1
        self._time = self.profile.tree_round_time(self.forwards, self.nodes) if self.nodes else \
            self.profile.t_ar_ms + self.forwards * self.profile.draft_ms
        return True

    def take(self, accept: float, sides: np.ndarray) -> int:
        """After a forward: keep the spine child (acceptance ``accept``) and side leaves (``sides[r-1]`` for rank
        ``r``) while each raises the rate; returns the width kept (0 = the spine stops here)."""
        w = 0
        d = self.forwards
        for v in [accept, *sides.tolist()]:
            gain = self.on_spine * v
            t = self.profile.tree_round_time(d, self.nodes + 1)
            if self._rate(gain, t) <= self._rate(0.0, self._time):
                break
            self.expected += gain
            self.nodes += 1
            self._time = t
            w += 1
        if w:
            self.widths.append(w)
            self.on_spine *= accept
        return w

    def tree(self) -> TreeShape:
        """The round's tree."""
        return spine_tree(self.widths)


class PredictedTree(TreeController):
    """``tree-predicted:NAME``: the spine tree of :class:`SpineRound` over an acceptance predictor.

    Args:
        predictor: The acceptance predictor (a shipped name's or a file's).
        name: Display name.
        k_max: Deepest spine.
    """

    def __init__(self, predictor: AcceptancePredictor, name: str, k_max: int = DEFAULT_K_MAX):
        self.predictor = predictor
        self.active: AcceptancePredictor | None = predictor
        self.name = name
        self.k_max = int(k_max)
        self.tables: SpineTables | None = None
        self.tracker = FeatureTracker(self.k_max)
        self._accept: np.ndarray | None = None
        self._workload: Any = None
        self.signal_note: str | None = None

    def bind_signals(self, src: SignalSource) -> str | None:
        """The model of the predictor's chain that ``src`` feeds (the same check and fallback as ``predicted:``);
        where none fits, the tree's acceptance is the draft's confidence calibrated on the train split (as
        ``predicted:`` falls back to calibrated confidence), with the same note."""
        active, note = self.predictor.for_source(src)
        self.active, self.signal_note = active, note  # None: calibrated confidence, as predicted: falls back to
        return note

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """Predict the acceptance at every position and fit the tables on the fit split (the predictor fitted
        to the workload first: :meth:`bind_signals`; its note is kept in :attr:`signal_note`)."""
        self.bind_signals(SignalSource.of_workload(workload, MODEL_ROOTS))
        self._accept = predicted_accept(workload, self.active) if self.active is not None else \
            calibrated_confidence(workload, workload.fit_split)
        self.tables = fit_tables(workload, self._accept, workload.fit_split)
        self._workload = workload
        return []

    def reset(self, ctx: RequestContext) -> None:
        """Start a request (the running acceptance estimate of the first forward's decision)."""
        self.ctx = ctx
        self.tracker.reset(ctx)

    def propose_tree(self) -> TreeShape:
        """Not used: the tree grows with the round's draft signals (see :meth:`play`)."""
        raise SpecgymError("tree-predicted grows its tree depth by depth: drive it with play(req)")

    def check_live(self) -> None:
        """It grows its tree from the trace's per-position signals: replay only."""
        raise SpecgymError(f"{self.name}: grows its tree from the trace's per-position signals, so it runs in replay "
                           "only; live tree controllers: tree-static, tree-sequoia, tree-eagle, tree-chain:SPEC, "
                           "tree-ppo")

    def play(self, req: Any) -> TreeRoundOutcome:
        """One replayed round: the spine's signals from the trace (correct prefix), the exact walk."""
        if self.tables is None or self._accept is None or req.engine.workload is not self._workload:
            raise SpecgymError("tree-predicted: call prepare(workload, profile) on the replayed workload first")
        wl = self._workload
        i = req.position
        base = int(wl.offsets[req.r]) + i
        room = req.length - i - 1
        rnd = SpineRound(self.ctx.profile, min(self.k_max, room))
        a_next = self.tracker.alpha_hat
        while rnd.before_forward(a_next):
            p = base + rnd.forwards - 1
            a = float(self._accept[p])
            if not rnd.take(a, self.tables.side_probs(wl.draft_topk[p], a)):
                break
            a_next = self.tables.next_accept_of(a, int(wl.lookup_len[p + 1]))  # p + 1 < the request's end
        tree = rnd.tree()
        o = req.play(tree, draft_depth=rnd.forwards if rnd.forwards > tree.depth else None)
        if rnd.forwards and not tree.nodes:  # forwards ran, nothing kept: a plain step plus the forwards
            o.time_ms += rnd.forwards * req.engine.profile.draft_ms
        self.tracker.update(req.as_round(o))
        return o

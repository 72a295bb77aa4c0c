"""Tree replay: plays tree rounds (:mod:`specgym.envs.core.tree`) over a greedy trace that carries ranks.

Exact for greedy rank-defined trees: at position ``i`` the true-path node at depth ``d`` is in the tree iff its
true-path parent is and that parent has more than ``target_rank[i + d - 1]`` children (for a shape of widths
``w``: ``target_rank[i + d - 1] < w_d`` at every depth up to ``d``). ``target_rank`` is the true rank of the
target's token in the draft's distribution at the correct prefix (trace format v2), and off-path subtrees never
change greedy acceptance, so nothing else is needed. The tree is clipped to depth ``N - i - 1`` near the end of a
request (its nodes below are dropped from the verify cost). Cost: :meth:`CostProfile.tree_round_time`.

Confidence-chosen trees (EAGLE-2, :mod:`specgym.baselines.tree_eagle`) are played on the same walk, but choosing
them needs the draft's probabilities at off-path nodes, which the trace does not hold: they are modelled from
``draft_topk`` and their results are labelled approximate.

Refused, with a one-line error: traces without ``target_rank`` (format v1, synthetic presets) and sampled traces
(temperature > 0): tree rejection sampling accepts a node with a probability that depends on the draft and target
distributions at off-path nodes, which the trace does not record, so no replay of it would be exact.

**Trees drafted by the draft head** (``drafter="head"``, ``TREE_SPEC@head``): a head's rank depends on where the
round started (its feature there is its own prediction), so they play from the recording's per-start column
``ranks_head`` (``ranks_head[g, j]``: the rank of token ``g + j`` among the head's scores ``j + 1`` steps after the
start ``g``, capped at 64, :mod:`~specgym.envs.workloads.trace_format`): a round at ``i`` accepts
``tree.accepted(ranks_head[i], room)``, exact for greedy rank-defined trees as above. EAGLE-2 on the head is modelled
from ``topk_head[i]`` (the head's top-8 probabilities at each depth from that start) as the draft model's from
``draft_topk``, approximate alike. Rounds are priced with the profile's ``head`` drafter
(:meth:`CostProfile.led_by`), as the live head trees are. Trees deeper than the column's depth are refused, and so
are controllers that observe the spine's confidences (the recording holds none of the head's): one line each.

**Prompt-lookup chains between trees** (:meth:`TreeReplayRequest.play_lookup`, the hybrid
:mod:`~specgym.baselines.tree_hybrid`): a round may instead draft a chain by context lookup, played as the chain
replay plays it (the recorded lookup drafter's run from that start, its cap clipped to the request's end, no match:
a plain step; priced by that drafter's round table and context term) and reported as a width-1 tree round. As in
the chain replay, a proposal's length is modelled as its cap: live, a match whose continuation runs into the end of
the context proposes fewer tokens (the same accepted run, a narrower verify).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specgym.envs.core.cost import TREE_NODE_LIMIT, CostProfile
from specgym.envs.core.kinds import HEAD_DRAFTER, IMPLICIT_DRAFTER
from specgym.envs.core.rounds import DEFAULT_K_MAX, RequestContext, RoundOutcome, RoundStart
from specgym.envs.core.signals import TOPK
from specgym.envs.core.tree import TreeRoundOutcome, TreeShape, head_tree_context
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.trace_format import Workload
from specgym.envs.workloads.workload import HEAD_TOPK_SCALE
from specgym.errors import SpecgymError

#: The column that holds the draft head's per-start ranks (what the replay of ``@head`` trees reads).
HEAD_RANKS_COLUMN = "ranks_head"


def check_tree_workload(workload: Workload, drafter: str | None = None) -> None:
    """Raise unless ``workload`` can be tree-replayed for ``drafter`` (``None``/``draft``: the draft model, needing
    ``target_rank``; ``head``: the draft head, needing ``ranks_head``): greedy, with the ranks."""
    if drafter not in (None, IMPLICIT_DRAFTER, HEAD_DRAFTER):
        raise SpecgymError(f"tree replay plays trees drafted by the draft model or the {HEAD_DRAFTER!r}, not "
                           f"{drafter!r}")
    if drafter == HEAD_DRAFTER:
        if workload.ranks_head is None:
            raise SpecgymError(f"workload {workload.name!r} has no {HEAD_RANKS_COLUMN!r} column (the draft head's "
                               f"per-start ranks, written by specgym record for a pair with a head): tree replay of "
                               f"@head trees needs it")
    elif workload.target_rank is None:
        raise SpecgymError(f"workload {workload.name!r} has no 'target_rank' column (trace format v2, recorded): "
                           "tree replay needs the ranks")
    if (np.asarray(workload.temperature) > 0).any():
        raise SpecgymError(f"workload {workload.name!r} is sampled (temperature > 0): tree replay is exact only for "
                           "greedy traces and refuses sampled ones")


class TreeEngine:
    """Replays tree rounds over one greedy workload under one cost profile.

    Args:
        workload: A greedy trace with ``target_rank`` (``ranks_head`` for the head; :func:`check_tree_workload`).
        profile: Cost profile; defaults to the workload's own.
        max_depth: Deepest tree accepted (``k_max`` of the chain engine; the profile must price it as a chain; for
            the head at most the depth of ``ranks_head``).
        node_budget: Most draft nodes a tree may have (at most :data:`TREE_NODE_LIMIT`).
        drafter: Who drafts the trees: ``None`` the draft model, ``"head"`` the draft head (module docstring).
    """

    def __init__(self, workload: Workload, profile: CostProfile | None = None, max_depth: int = DEFAULT_K_MAX,
                 node_budget: int = TREE_NODE_LIMIT, drafter: str | None = None):
        check_tree_workload(workload, drafter)
        if not 1 <= node_budget <= TREE_NODE_LIMIT:
            raise SpecgymError(f"node_budget must be in [1, {TREE_NODE_LIMIT}], got {node_budget}")
        self.chain = TraceEngine(workload, profile, max_depth, seed=0)  # contexts and draft features
        self.workload = workload
        self.drafter = HEAD_DRAFTER if drafter == HEAD_DRAFTER else None
        self.profile = self.chain.profile
        self.max_depth = self.chain.k_max
        self.node_budget = int(node_budget)
        self.t_ar = self.chain.t_ar
        table = self.chain.table
        #: ``(n, J)`` per-start ranks of the head (``None`` for the draft model, whose ranks are per position)
        self.rank_rows: np.ndarray | None = None
        if self.drafter == HEAD_DRAFTER:
            assert workload.ranks_head is not None
            self.rank_rows = workload.ranks_head.astype(np.int64)
            self.max_depth = min(self.max_depth, self.rank_rows.shape[1])
            self.profile = self.profile.led_by(HEAD_DRAFTER, "model")
            table = self.profile.round_table(self.chain.k_max)
            self.ranks = self.rank_rows[:, 0]  # the first draft token's rank of each start
        else:
            assert workload.target_rank is not None
            self.ranks = workload.target_rank.astype(np.int64)
        self._ranks_list: list[int] = self.ranks.tolist()
        self._times: dict[TreeShape, list[float]] = {}
        # a context term: a tree round at depth d >= 1 costs per_kv[1] per cached token, a plain step per_kv[0]
        self.per_kv = (float(table.per_kv[0]), float(table.per_kv[1])) if table.has_context else None
        lookups = self.chain.lookup_drafters()
        #: The recorded lookup drafter whose chains :meth:`TreeReplayRequest.play_lookup` plays (``None``: none)
        self.lookup_drafter: str | None = lookups[0] if lookups and workload.lookup_len is not None else None

    def lookup_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
        """What a lookup chain reads, flat: ``(lookup_len, runs, caps, base, per_kv)`` (the context lookup's match
        length and the lookup drafter's runs and proposal caps per start; its round table's base and context
        columns by draft tokens); one line when the workload records no lookup drafter or no context lookup."""
        name = self.lookup_drafter
        if name is None:
            raise SpecgymError(f"workload {self.workload.name!r} has no prompt-lookup drafter with per-start runs and "
                               f"'lookup_len' column: a tree round cannot give way to a lookup chain in replay")
        assert self.workload.lookup_len is not None
        table = self.chain.table_for(name)
        return (self.workload.lookup_len.astype(np.int64), self.chain.runs(name), self.chain.proposal_caps(name),
                table.base, table.per_kv)

    def check(self, tree: TreeShape) -> None:
        """Raise if ``tree`` is deeper or larger than this engine allows."""
        if tree.depth > self.max_depth or tree.nodes > self.node_budget:
            column = (f" (the recording's {HEAD_RANKS_COLUMN!r} holds {self.max_depth} depths)"
                      if self.rank_rows is not None and self.max_depth < self.chain.k_max else "")
            raise SpecgymError(f"tree {tree.name!r} (depth {tree.depth}, {tree.nodes} nodes) exceeds this engine's "
                               f"max_depth {self.max_depth} / node_budget {self.node_budget}{column}")

    def times(self, tree: TreeShape) -> list[float]:
        """``times[d]`` = time of ``tree`` clipped to depth ``d`` (cached per tree object)."""
        t = self._times.get(tree)
        if t is None:
            self.check(tree)
            t = self._times[tree] = [self.profile.tree_round_time(d, int(tree.nodes_upto[d]))
                                     for d in range(tree.depth + 1)]
        return t

    def context(self, r: int) -> RequestContext:
        """What a controller may know about request ``r`` (for head trees :func:`head_tree_context`: the head's
        costs, without the spine's per-token features, which the recording does not hold)."""
        ctx = self.chain.context(r)
        return ctx if self.drafter is None else head_tree_context(ctx)

    def start(self, r: int) -> TreeReplayRequest:
        """Begin replaying request ``r`` from position 0."""
        return TreeReplayRequest(self, r)

    # ------------------------------------------------------------------------------------------ vectorised
    def accepted(self, pos: np.ndarray, end: np.ndarray, tree: TreeShape) -> tuple[np.ndarray, np.ndarray]:
        """Accepted depth and clipped depth of ``tree`` played at flat positions ``pos`` (requests ending at
        ``end``), all at once."""
        pos = np.asarray(pos, dtype=np.int64)
        room = np.minimum(np.asarray(end, dtype=np.int64) - pos - 1, tree.depth)
        node = np.zeros(len(pos), dtype=np.int64)
        acc = np.zeros(len(pos), dtype=np.int64)
        alive = room > 0
        width = tree.child.shape[1]
        last = len(self.ranks) - 1
        for d in range(tree.depth):
            alive &= d < room
            r = self.ranks[np.minimum(pos + d, last)] if self.rank_rows is None else \
                self.rank_rows[np.minimum(pos, last), d]
            alive &= r < width
            nxt = tree.child[node, np.minimum(r, width - 1)]
            alive &= nxt >= 0
            node = np.where(alive, nxt, 0)
            acc += alive
        return acc, np.maximum(room, 0)

    def run_static(self, requests: Sequence[int] | np.ndarray, tree: TreeShape) -> dict[str, np.ndarray]:
        """Replay ``tree`` every round of every request, all requests at once.

        Returns:
            Per request: ``tokens``, ``time_ms``, ``rounds``, ``nodes`` (verified draft nodes), ``accepted``.
        """
        times = np.asarray(self.times(tree))
        upto = tree.nodes_upto
        req = np.asarray(requests, dtype=np.int64)
        start = self.workload.offsets[req].astype(np.int64)
        end = self.workload.offsets[req + 1].astype(np.int64)
        pos = start.copy()
        n = len(req)
        out = {"time_ms": np.zeros(n), "rounds": np.zeros(n, np.int64), "nodes": np.zeros(n, np.int64),
               "accepted": np.zeros(n, np.int64)}
        act = np.flatnonzero(pos < end)
        kv0 = self.workload.prompt_len[req].astype(np.int64) - start
        per_kv = None if self.per_kv is None else np.asarray(self.per_kv)
        while len(act):
            acc, depth = self.accepted(pos[act], end[act], tree)
            out["time_ms"][act] += times[depth] if per_kv is None else \
                times[depth] + per_kv[np.minimum(depth, 1)] * (kv0[act] + pos[act])
            out["rounds"][act] += 1
            out["nodes"][act] += upto[depth]
            out["accepted"][act] += acc
            pos[act] += acc + 1
            act = act[pos[act] < end[act]]
        out["tokens"] = pos - start
        return out


class TreeReplayRequest:
    """Scalar tree replay of one request: call :meth:`play` until :attr:`done`.

    Attributes:
        context: The request's :class:`RequestContext`.
        position: Next completion position ``i``.
        length: Completion length ``N``.
        done: True once ``position == N``.
    """

    __slots__ = ("engine", "r", "context", "position", "length", "done", "_ranks", "_rows", "_topk", "_conf", "_ent",
                 "_base", "_kv0")

    def __init__(self, engine: TreeEngine, r: int):
        wl = engine.workload
        sl = wl.span(r)
        self.engine = engine
        self.r = r
        self.context = engine.context(r)
        self.position = 0
        self.length = sl.stop - sl.start
        self.done = False
        self._ranks = engine._ranks_list
        rows = engine.rank_rows
        self._rows: list[list[int]] | None = None if rows is None else rows[sl].tolist()  # the head's, per start
        self._topk = None if rows is None or wl.topk_head is None else \
            wl.topk_head[sl].reshape(sl.stop - sl.start, -1, TOPK).astype(np.float32) / HEAD_TOPK_SCALE
        self._conf = wl.require("draft_conf", "tree replay")[sl]
        self._ent = wl.require("draft_entropy", "tree replay")[sl]
        self._base = sl.start
        self._kv0 = int(wl.prompt_len[r])

    def seek(self, position: int) -> None:
        """Move to completion position ``position`` (a fit that replays one round from every position)."""
        if not 0 <= position < self.length:
            raise SpecgymError(f"position {position} outside the request's completion of {self.length} tokens")
        self.position, self.done = int(position), False

    def lookup_len(self) -> int:
        """The context lookup's match length at the next position (what a lookup switch reads before the round)."""
        return int(self.engine.lookup_columns()[0][self._base + self.position])

    def round_start(self) -> RoundStart:
        """What a drafter-choice rule knows before the next round (as the chain replay's request gives it)."""
        found = self.engine.workload.lookup_len
        i = self.position
        return RoundStart(i, self._kv0 + i, -1 if found is None else int(found[self._base + i]))

    def choice_round(self, o: TreeRoundOutcome, drafter: str | None, start: RoundStart) -> RoundOutcome:
        """A played round as a drafter-choice rule observes it: a chain round of ``drafter`` (``None``: a plain
        step) with ``drafted = depth`` along the true path and no per-token features, and the recorded lookup
        drafter's run from its start where it did not play, censored at the tokens produced (what the chain
        replay reports as its counterfactual)."""
        nan = np.full(o.depth, np.nan, np.float32)
        seen: tuple[tuple[str, int], ...] = ()
        name = self.engine.lookup_drafter
        if name is not None and drafter != name:
            _, runs, caps, _, _ = self.engine.lookup_columns()
            g = self._base + start.position
            if caps is None or caps[g] > 0:
                seen = ((name, min(int(runs[g]), o.produced)),)
        return RoundOutcome(o.position, o.depth, o.depth, o.accepted, o.produced, o.time_ms, nan, nan, o.done, None,
                            drafter if o.depth else None, seen)

    def play_lookup(self, k: int) -> TreeRoundOutcome:
        """One round drafting a chain of up to ``k`` tokens by prompt lookup (module docstring), as a width-1 tree."""
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        found, runs, caps, base, per_kv = self.engine.lookup_columns()
        i = self.position
        g = self._base + i
        drafted = max(0, min(int(k), self.length - i - 1, len(base) - 1, self.length if caps is None else int(caps[g])))
        accepted = min(int(runs[g]), drafted)
        time_ms = float(base[drafted] + per_kv[drafted] * (self._kv0 + i))
        self.position = i + accepted + 1
        self.done = self.position >= self.length
        return TreeRoundOutcome(i, drafted, drafted, accepted, accepted + 1, time_ms, self.done)

    def ranks(self, n: int) -> list[int]:
        """The target's ranks at the next ``n`` positions (what a clairvoyant controller knows); for the head its
        ranks at depths ``1..n`` of a round starting here (at most the recorded depth)."""
        if self._rows is not None:
            return self._rows[self.position][:n]
        b = self._base + self.position
        return self._ranks[b : b + n]

    def draft_topk(self, n: int) -> np.ndarray:
        """The draft's top-8 probabilities at the next ``n`` positions, ``(n, 8)`` (zero rows past the request's end
        or where the trace has no ``draft_topk``); for the head, at depths ``1..n`` of a round starting here
        (``topk_head``; zero rows past the recorded depth)."""
        rows = np.zeros((n, TOPK), np.float32)
        if self._rows is not None:
            if self._topk is None:
                raise SpecgymError(f"workload {self.engine.workload.name!r} has no 'topk_head' column (the draft "
                                   "head's top-8 probabilities per start), which EAGLE-2 on the head needs in replay")
            got = self._topk[self.position][: min(n, self.length - self.position)]
            rows[: len(got)] = got
            return rows
        topk = self.engine.workload.draft_topk
        if topk is not None:
            b = self._base + self.position
            got = topk[b : b + min(n, self.length - self.position)]
            rows[: len(got)] = got
        return rows

    def play(self, tree: TreeShape, draft_depth: int | None = None, approximate: bool = False) -> TreeRoundOutcome:
        """Play one round with ``tree`` (clipped to the request's end).

        Args:
            tree: The round's tree.
            draft_depth: Draft forwards run when more than the tree's depth (EAGLE-2 expands ``D`` depths, then
                may drop the deepest nodes at reranking); default the clipped tree's depth.
            approximate: Label the outcome approximate (a modelled, confidence-chosen tree).
        """
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        i = self.position
        times = self.engine.times(tree)
        room = min(self.length - i - 1, tree.depth)
        b = self._base + i
        accepted = tree.accepted(self._ranks[b : b + room] if self._rows is None else self._rows[i][:room], room)
        nodes = int(tree.nodes_upto[room])
        time_ms = times[room]
        if self.engine.per_kv is not None:
            time_ms += self.engine.per_kv[min(room, 1)] * (self._kv0 + i)
        if draft_depth is not None and room > 0:
            extra = min(draft_depth, self.length - i - 1) - room
            time_ms += max(extra, 0) * self.engine.profile.draft_ms
        produced = accepted + 1
        self.position = i + produced
        self.done = self.position >= self.length
        return TreeRoundOutcome(i, room, nodes, accepted, produced, time_ms, self.done, approximate)

    def _no_head_features(self) -> None:
        if self._rows is not None:
            raise SpecgymError(f"workload {self.engine.workload.name!r}: a tree controller that observes the spine's "
                               "confidences cannot replay @head trees (the recording holds the head's ranks and top-8 "
                               "probabilities, not its confidences along the spine): run it live")

    def draft_features(self, position: int) -> tuple[float, float]:
        """(draft_conf, draft_entropy) of the true-path draft token for ``position`` (the draft model's; refused for
        the head)."""
        self._no_head_features()
        return float(self._conf[position]), float(self._ent[position])

    def as_round_unsignalled(self, o: TreeRoundOutcome) -> RoundOutcome:
        """The tree round as a chain :class:`RoundOutcome` without its spine's per-token features (NaN confidence
        and entropy, :data:`~specgym.envs.core.rounds.TOKEN_FEATURES`): what a policy learning on head trees observes,
        in replay as live."""
        nan = np.full(o.depth, np.nan, np.float32)
        return RoundOutcome(o.position, o.depth, o.depth, o.accepted, o.produced, o.time_ms, nan, nan, o.done)

    def as_round(self, o: TreeRoundOutcome) -> RoundOutcome:
        """The tree round as a chain :class:`RoundOutcome` for the shared features: ``planned_k = drafted =
        depth`` (the true path's draft tokens; their confidences are the trace's correct-prefix ones; refused for
        the head)."""
        self._no_head_features()
        i = o.position
        return RoundOutcome(i, o.depth, o.depth, o.accepted, o.produced, o.time_ms,
                            self._conf[i : i + o.depth], self._ent[i : i + o.depth], o.done)

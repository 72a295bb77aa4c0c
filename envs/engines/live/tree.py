"""Live tree verification: a rank-defined draft tree per round, every node verified in one target forward.

A :class:`LiveTreeRequest` plays the tree rounds of :mod:`specgym.envs.core.tree` on a real pair (greedy, GPT-2 and
Llama-family models through the lean forward, :mod:`~specgym.envs.engines.live.lean_forward`). One round with a
:class:`TreeShape` clipped to depth ``D = min(depth, N - i - 1)``:

* **draft, one batched forward per depth**: the draft's cache first catches up with the accepted sequence (its last
  row is the root's distribution); the root's top-``c`` tokens are its children. For ``d = 1 .. D - 1`` the nodes of
  depth ``d`` go in as the rows of one forward, at positions ``prefix_len + d`` (``prefix_len`` = the accepted
  sequence without its last token, the root), each attending to the committed prefix and its own ancestors (a tree
  attention mask); each row's top-``c`` tokens are that node's children. Children of a node hold its ranks
  ``0..c-1`` exactly as the tree replay defines them (ties of equal logits aside);
* **verify, one forward**: the target reads ``[root, node_1 .. node_n]`` (breadth-first order) over its KV cache,
  each row at position ``prefix_len + depth`` attending to the prefix and its ancestors;
* **greedy acceptance**: walk from the root, at each node following the child whose token is the target's argmax
  there; ``accepted`` = the depth reached, and the target's argmax at the last node reached is the bonus token
  (``produced = accepted + 1``). This is the longest true-path prefix inside the tree, so the output equals plain
  greedy decoding token for token (tests);
* **KV caches keep the accepted path only**: node ``v``'s keys/values sit at slot ``prefix_len + v`` in both caches;
  :meth:`KVCache.compact` copies the accepted nodes' entries into consecutive slots after the root and drops the
  rest (the draft cache holds the accepted nodes it was fed, depths ``< D``; it catches up next round).

Node ``v``'s slot is ``prefix_len + v`` because :class:`TreeShape` numbers nodes breadth-first, so each depth is a
contiguous block. Refused with one line: sampling (``temperature > 0``: tree rejection sampling is not implemented here,
the replay refuses it too) and models the lean forward does not run (neither GPT-2 nor the Llama family). Timing as the
chain engine: measured, or priced by :meth:`CostProfile.tree_round_time` when the engine's ``timing`` is a profile.

**EAGLE-2 live** (:meth:`LiveTreeRequest.play_eagle`): the dynamic tree chosen from the draft's real probabilities
at every frontier node (exact; the replay of the same rule models off-path scores and is approximate). Only the
``beam`` best frontier nodes of each depth are fed, so draft-cache slots follow the feeding order (recorded per
node), and the verified tree is the top-``budget`` generated nodes renumbered breadth-first.

**Trees drafted by the draft head** (``drafter="head"``, :mod:`~specgym.envs.engines.live.head_tree`): the same
rounds, static and EAGLE-2, with each depth's frontier expanded by one batched step of the engine's draft head from
its own features (no draft cache, no mask: a head node's feature holds its path); the verify forward also returns
the target's hidden states, and the one at the last accepted node is the head's next feature. The draft model's
cache is then left as it is (it catches up whenever the draft model drafts again). Priced, under a profile, as the
profile's ``head`` drafter (:meth:`CostProfile.led_by`).

**Prompt-lookup chains between trees** (:meth:`LiveTreeRequest.play_lookup`, the hybrid
:mod:`~specgym.baselines.tree_hybrid`): a round may draft a chain by context lookup instead (vLLM's ``ngram``, as the
chain engine's prompt lookup), verified as a width-1 tree in the same forward path (a chain needs no mask), so the
head's feature and the caches stay where the tree rounds expect them. Priced, under a profile, as the lookup drafter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.kinds import HEAD_DRAFTER, IMPLICIT_DRAFTER, NGRAM_DRAFTER
from specgym.envs.core.ngram_proposer import ngram_propose
from specgym.envs.core.rounds import RoundOutcome, RoundStart
from specgym.envs.core.tree import TreeController, TreeRoundOutcome, TreeShape
from specgym.envs.engines.live.draft_stats import draft_stats
from specgym.envs.engines.live.engine import LiveEngine, LiveRequest
from specgym.envs.engines.live.head_tree import grow_head_eagle, grow_head_tree
from specgym.errors import SpecgymError


@dataclass
class LiveTreeResult:
    """A request decoded with tree rounds.

    Attributes:
        tokens: The completion token ids.
        rounds: One :class:`TreeRoundOutcome` per round.
        time_ms: Total decode time (sum of round times), excluding the prompt prefill.
        prefill_ms: Prompt prefill time of both models.
    """

    tokens: list[int]
    rounds: list[TreeRoundOutcome] = field(default_factory=list)
    time_ms: float = 0.0
    prefill_ms: float = 0.0

    @property
    def drafted(self) -> int:
        """Draft nodes verified (the replay's ``drafted`` of tree rows)."""
        return sum(r.nodes for r in self.rounds)

    @property
    def accepted(self) -> int:
        """Accepted tokens."""
        return sum(r.accepted for r in self.rounds)


def tree_parents(tree: TreeShape, nodes: int) -> list[int]:
    """``parent[v]`` of nodes ``1..nodes`` (``parent[0] = -1``) from the child table."""
    parent = [-1] * (nodes + 1)
    for v, row in enumerate(tree.child[: nodes + 1].tolist()):
        for c in row:
            if 0 <= c <= nodes:
                parent[c] = v
    return parent


def ancestor_matrix(parent: list[int]) -> np.ndarray:
    """``anc[v, u]`` = node ``u`` is ``v`` or one of its ancestors (root included), for breadth-first ``parent``."""
    n = len(parent)
    anc = np.eye(n, dtype=bool)
    for v in range(1, n):
        anc[v] |= anc[parent[v]]
    return anc


def tree_mask(anc: np.ndarray, lo: int, hi: int, prefix: int, device) -> object:
    """Attention mask of nodes ``lo..hi-1`` fed after ``prefix + lo`` cached tokens: every row sees the ``prefix``
    committed tokens before the root and, of the tree, its ancestors and itself (bool ``(hi - lo, prefix + hi)``)."""
    import torch

    m = np.ones((hi - lo, prefix + hi), dtype=bool)
    m[:, prefix:] = anc[lo:hi, :hi]
    return torch.from_numpy(m).to(device)


class LiveTreeRequest(LiveRequest):
    """One greedy request decoded with tree rounds: call :meth:`play_tree` until :attr:`done`.

    Args:
        engine: The live engine (both models through the lean forward; with ``drafter="head"`` the target only).
        prompt_ids: The prompt's token ids.
        max_new_tokens: The completion length.
        stop_at_eos: End the completion at the target's EOS token.
        request_id: The request's name in its context.
        category: Its category label.
        drafter: Who drafts the trees: the draft model (``None`` or ``draft``) or the engine's draft head (``head``,
            :mod:`~specgym.envs.engines.live.head_tree`).
        temperature: Must be 0 (greedy); above 0 refused in one line (tree speculative sampling is not implemented).

    Attributes:
        tree_result: The :class:`LiveTreeResult` so far.
        drafter: The drafter of every round (``draft`` or ``head``).
        spine_conf, spine_entropy: After a round played with ``stats=True``, the draft confidence and entropy of
            the rank-0 spine's nodes (for a chain, of every drafted token: what a chain controller observes).
    """

    def __init__(self, engine: LiveEngine, prompt_ids: Sequence[int], max_new_tokens: int, stop_at_eos: bool = False,
                 request_id: str = "live", category: str = "live", drafter: str | None = None,
                 temperature: float = 0.0):
        self.drafter = check_tree_drafter(engine, drafter, temperature)
        super().__init__(engine, prompt_ids, max_new_tokens, 0.0, 0, stop_at_eos, request_id, category)
        draft, target = engine._lean.get(id(engine.draft)), engine._lean.get(id(engine.target))
        assert target is not None  # check_tree_drafter
        self.runners = (draft, target)
        self.tree_result = LiveTreeResult(tokens=[], prefill_ms=self.result.prefill_ms)
        self.spine_conf = np.zeros(0, np.float32)
        self.spine_entropy = np.zeros(0, np.float32)

    def play_tree(self, tree: TreeShape, stats: bool = False) -> TreeRoundOutcome:
        """Play one round with ``tree`` (clipped to the request's end); ``stats`` also computes the rank-0 spine's
        draft confidence and entropy (:attr:`spine_conf`)."""
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        if tree.depth > self.k_max:
            raise SpecgymError(f"tree {tree.name!r} has depth {tree.depth}, above the engine's k_max {self.k_max}")
        with self.engine._torch.inference_mode():
            return self._play_tree(tree, stats)

    def lookup_len(self) -> int:
        """The context lookup's match length of the sequence so far (what a lookup switch reads before the round)."""
        return self.round_start().lookup_len

    def choice_round(self, o: TreeRoundOutcome, drafter: str | None, start: RoundStart) -> RoundOutcome:
        """A played round as a drafter-choice rule observes it (the replay's
        :meth:`~specgym.envs.engines.replay.tree_engine.TreeReplayRequest.choice_round`): a chain round of
        ``drafter`` along the true path, no per-token features, prompt lookup's run from the verified tokens where it
        did not play (``start.kv``: the sequence's length when the round started)."""
        nan = np.full(o.depth, np.nan, np.float32)
        rnd = RoundOutcome(o.position, o.depth, o.depth, o.accepted, o.produced, o.time_ms, nan, nan, o.done, None,
                           drafter if o.depth else None)
        return self._with_counterfactual(rnd, start.kv)

    def play_lookup(self, k: int) -> TreeRoundOutcome:
        """One round drafting a chain of up to ``k`` tokens by prompt lookup (none without a match: a plain step),
        verified as a width-1 tree; the draft model's cache, if any, is left to catch up when it drafts again."""
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        with self.engine._torch.inference_mode():
            r0 = self.engine._clock()
            cap = max(0, min(int(k), self.k_max, self.length - self.position - 1))
            drafts = ngram_propose(self.seq, cap, *self.engine.ngram_n) if cap else []
            n = len(drafts)
            self._check_room("lookup chain", n)
            return self._verify_commit([self.seq[-1], *drafts], list(range(-1, n)), list(range(n + 1)),
                                       [-1] * (n + 1), r0, 0, n, n, priced_as=NGRAM_DRAFTER)

    def _draft_tree(self, tree: TreeShape, room: int, nodes: int, anc: np.ndarray, stats: bool) -> list[int]:
        """Tokens of nodes ``0..nodes`` (node 0 = the root, the last accepted token), one draft forward per depth."""
        eng, torch, seq = self.engine, self.engine._torch, self.seq
        draft = self.runners[0]
        assert draft is not None  # check_tree_drafter: a draft-model tree has its lean forward
        prefix = len(seq) - 1
        tokens = [0] * (nodes + 1)
        tokens[0] = seq[-1]
        child = tree.child
        upto = tree.nodes_upto
        logits = draft(seq[self.dcache.length:], self.dcache)[-1:, : eng.vocab]  # catch up: the root's row
        confs: list[float] = []
        ents: list[float] = []
        for d in range(1, room + 1):
            lo = int(upto[d - 2]) + 1 if d > 1 else 0  # parents: the nodes of depth d - 1 (lo..hi-1), one row each
            hi = int(upto[d - 1]) + 1
            kids = child[lo:hi]
            width = int((kids >= 0).sum(axis=1).max()) if len(kids) else 0
            if stats:  # the rank-0 spine's parent is the first row of each depth
                st = draft_stats(logits[:1], 0.0)
                confs.append(float(st.conf[0]))
                ents.append(float(st.entropy[0]))
            if width > 0:
                top = torch.topk(logits, width, dim=-1).indices.tolist()
                for ks, toks in zip(kids.tolist(), top):
                    for r, c in enumerate(ks):
                        if 0 < c <= nodes:
                            tokens[c] = int(toks[r])
            if d < room:  # feed depth d's nodes (one batched forward) for the next depth's children
                a, b = int(upto[d - 1]) + 1, int(upto[d]) + 1
                pos = [prefix + d] * (b - a)
                logits = draft(tokens[a:b], self.dcache, positions=pos,
                               mask=tree_mask(anc, a, b, prefix, eng.device))[:, : eng.vocab]
        self.spine_conf = np.asarray(confs, np.float32)
        self.spine_entropy = np.asarray(ents, np.float32)
        return tokens

    def _play_tree(self, tree: TreeShape, stats: bool) -> TreeRoundOutcome:
        seq = self.seq
        room = min(tree.depth, self.length - self.position - 1)
        nodes = int(tree.nodes_upto[room])
        prefix = len(seq) - 1
        self._check_room(tree.name, nodes)
        r0 = self.engine._clock()
        if room == 0 or (self.drafter == HEAD_DRAFTER and self.feature is None):  # no feature yet: a 1-token prompt
            self.spine_conf = self.spine_entropy = np.zeros(0, np.float32)
            return self._verify_commit([seq[-1]], [-1], [0], [-1], r0, 0, 0, 0)
        parent, depth_of, anc = _layout(tree, nodes)
        if self.drafter == HEAD_DRAFTER:
            tokens, self.spine_conf, self.spine_entropy = grow_head_tree(self.engine.head, self.feature, seq[-1],
                                                                         tree, room, stats)
            return self._verify_commit(tokens, parent, depth_of, [-1] * (nodes + 1), r0, room, room, nodes, anc)
        tokens = self._draft_tree(tree, room, nodes, anc, stats)
        dslots = [prefix + v if 0 < v and depth_of[v] < room else -1 for v in range(nodes + 1)]
        return self._verify_commit(tokens, parent, depth_of, dslots, r0, room, room, nodes, anc)

    def _check_room(self, name: str, nodes: int) -> None:
        if len(self.seq) + nodes > self.engine.context:
            raise SpecgymError(f"tree {name!r}: {nodes} nodes after {len(self.seq)} tokens exceed the models' "
                               f"context of {self.engine.context}")

    def _verify_commit(self, tokens: list[int], parent: list[int], depth_of: list[int], dslots: list[int], r0: float,
                       draft_depth: int, room: int, nodes: int, anc: np.ndarray | None = None,
                       priced_as: str | None = None) -> TreeRoundOutcome:
        """Verify nodes ``0..n`` (breadth-first; node 0 the root) in one target forward, walk the greedy path, keep
        its cache entries (``dslots[v]``: node ``v``'s draft-cache slot, -1 = not fed), record the round. With a
        draft head, the target's hidden state at the last accepted node becomes the head's next feature.
        ``priced_as``: the drafter whose costs price the round under a profile (default: the request's; a lookup
        chain's, ``ngram``). A chain (every node the child of the one before) is verified without a mask."""
        eng, torch, seq = self.engine, self.engine._torch, self.seq
        i = self.position
        prefix = len(seq) - 1
        target = self.runners[1]
        chain = parent == list(range(-1, len(tokens) - 1))
        positions, mask = (None, None) if chain else (
            [prefix + d for d in depth_of],
            tree_mask(ancestor_matrix(parent) if anc is None else anc, 0, len(tokens), prefix, eng.device))
        out = target(tokens, self.tcache, hidden=eng.head is not None, positions=positions, mask=mask)
        tlogits, hidden = out if eng.head is not None else (out, None)
        targ = torch.argmax(tlogits[:, : eng.vocab], -1).tolist()
        kids: list[list[int]] = [[] for _ in tokens]
        for v in range(1, len(tokens)):
            kids[parent[v]].append(v)
        v, path = 0, []
        while True:
            nxt = next((c for c in kids[v] if tokens[c] == targ[v]), -1)
            if nxt < 0:
                break
            path.append(nxt)
            v = nxt
        extra = int(targ[v])
        if hidden is not None:
            self.feature = hidden[v]
        # keep the accepted path's keys/values, moved next to the root; drop the rest of the tree
        self.tcache.compact(prefix + 1, [prefix + u for u in path])
        if draft_depth > 0 and self.drafter != HEAD_DRAFTER:  # the draft caught up with the root this round
            fed = [dslots[u] for u in path]  # (else, or when the head drafted, it still lags: left as it is)
            self.dcache.compact(prefix + 1, fed[: fed.index(-1)] if -1 in fed else fed)
        new, accepted, produced, measured_ms = self._commit([tokens[u] for u in path] + [extra], 0, r0)
        if isinstance(eng.timing, CostProfile):
            if priced_as == NGRAM_DRAFTER:
                prof = eng.timing.led_by(NGRAM_DRAFTER, "lookup")
            else:
                prof = eng.timing.led_by(HEAD_DRAFTER, "model") if self.drafter == HEAD_DRAFTER else eng.timing
            time_ms = prof.tree_round_time(room, nodes) + max(draft_depth - room, 0) * prof.draft_ms
        else:
            time_ms = measured_ms
        outcome = TreeRoundOutcome(i, room, nodes, accepted, produced, time_ms, self.done)
        self._record(self.tree_result, new, outcome, time_ms)
        return outcome

    def play_eagle(self, depth: int, beam: int, budget: int) -> TreeRoundOutcome:
        """One EAGLE-2 round, live (exact: the drafter's real probabilities at every frontier node; the draft model's
        or, with ``drafter="head"``, the draft head's).

        Per depth the ``beam`` generated nodes with the highest path confidence (product of draft probabilities
        along the path) go into one batched draft forward and each expands its top-``beam`` children; after
        ``depth`` expansions (clipped to ``N - i - 1``) every generated node is ranked by path confidence (ties:
        shallower, then generated first) and the top ``budget`` are verified. Their parents score at least as high,
        so the kept set is a tree. The round's ``depth`` is the kept tree's; the draft forwards run are ``depth``.
        """
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        if not (1 <= beam <= 64 and 1 <= depth <= self.k_max and 1 <= budget):
            raise SpecgymError(f"tree-eagle live needs 1 <= depth <= k_max {self.k_max}, beam >= 1, budget >= 1")
        with self.engine._torch.inference_mode():
            return self._play_eagle(depth, beam, budget)

    def _play_eagle(self, depth: int, beam: int, budget: int) -> TreeRoundOutcome:
        eng, seq = self.engine, self.seq
        D = min(depth, self.length - self.position - 1)
        r0 = eng._clock()
        if D == 0 or (self.drafter == HEAD_DRAFTER and self.feature is None):
            return self._verify_commit([seq[-1]], [-1], [0], [-1], r0, 0, 0, 0)
        self._check_room("tree-eagle", max(budget, beam * D))
        if self.drafter == HEAD_DRAFTER:
            g = grow_head_eagle(eng.head, self.feature, seq[-1], D, beam)
            score, dep, tok, par, slot = g.score, g.depth, g.token, g.parent, [-1] * len(g.score)
        else:
            score, dep, tok, par, slot = self._draft_eagle(D, beam)
        kept = set(sorted(range(1, len(score)), key=lambda g: (-score[g], dep[g], g))[:budget])
        kept = {g for g in kept if all(a in kept or a == 0 for a in _ancestors(par, g))}
        order = [0] + sorted(kept, key=lambda g: (dep[g], g))  # breadth-first
        index = {g: v for v, g in enumerate(order)}
        parent = [-1] + [index[par[g]] for g in order[1:]]
        depth_of = [dep[g] for g in order]
        dslots = [-1] + [slot[g] for g in order[1:]]
        return self._verify_commit([tok[g] for g in order], parent, depth_of, dslots, r0, D, max(depth_of),
                                   len(order) - 1)

    def _draft_eagle(self, D: int, beam: int) -> tuple[list[float], list[int], list[int], list[int], list[int]]:
        """EAGLE-2's expansion with the draft model: the generated nodes' score, depth, token, parent (index in
        generation order, 0 = the root) and draft-cache slot (-1 = not fed)."""
        eng, torch, seq = self.engine, self.engine._torch, self.seq
        prefix = len(seq) - 1
        draft = self.runners[0]
        assert draft is not None  # check_tree_drafter
        score, dep, tok, par, slot = [1.0], [0], [seq[-1]], [-1], [prefix]
        logits = draft(seq[self.dcache.length:], self.dcache)[-1:, : eng.vocab]
        frontier = [0]
        for d in range(1, D + 1):
            probs = torch.softmax(logits.float(), -1)
            top = torch.topk(probs, beam, dim=-1)
            new = []
            for row, g in enumerate(frontier):
                for p, t in zip(top.values[row].tolist(), top.indices[row].tolist()):
                    new.append(len(score))
                    score.append(score[g] * p)
                    dep.append(d)
                    tok.append(int(t))
                    par.append(g)
                    slot.append(-1)
            frontier = sorted(new, key=lambda g: (-score[g], g))[:beam]
            if d < D:  # the frontier's rows in one draft forward, each seeing the prefix and its ancestors
                start = self.dcache.length
                m = np.zeros((len(frontier), start + len(frontier)), dtype=bool)
                m[:, : prefix + 1] = True
                for row, g in enumerate(frontier):
                    slot[g] = start + row
                    a = par[g]
                    while a > 0:
                        m[row, slot[a]] = True
                        a = par[a]
                    m[row, start + row] = True
                logits = draft([tok[g] for g in frontier], self.dcache, positions=[prefix + d] * len(frontier),
                               mask=torch.from_numpy(m).to(eng.device))[:, : eng.vocab]
        return score, dep, tok, par, slot


_LAYOUTS: dict[tuple[TreeShape, int], tuple[list[int], list[int], np.ndarray]] = {}


def _layout(tree: TreeShape, nodes: int) -> tuple[list[int], list[int], np.ndarray]:
    """Parents, depths and ancestor matrix of ``tree``'s first ``nodes`` nodes (cached: static trees repeat)."""
    key = (tree, nodes)
    hit = _LAYOUTS.get(key)
    if hit is None:
        if len(_LAYOUTS) > 256:
            _LAYOUTS.clear()
        parent = tree_parents(tree, nodes)
        hit = _LAYOUTS[key] = (parent, tree.depth_of[: nodes + 1].tolist(), ancestor_matrix(parent))
    return hit


def _ancestors(par: list[int], g: int) -> list[int]:
    out = []
    a = par[g]
    while a > 0:
        out.append(a)
        a = par[a]
    return out


def check_tree_drafter(engine: LiveEngine, drafter: str | None, temperature: float = 0.0) -> str:
    """The drafter of a live tree request (``draft`` or ``head``), or one line saying why it cannot run: sampling
    (tree speculative sampling is not implemented), a drafter that drafts no tree, a head the engine lacks, or a
    model outside the lean forward (its tree attention mask)."""
    if temperature != 0:
        raise SpecgymError(f"live tree verification is greedy: temperature {temperature:g} needs tree speculative "
                           f"sampling (exact rejection sampling over sibling drafts), which is not implemented; "
                           f"decode sampled requests with a chain controller")
    name = IMPLICIT_DRAFTER if drafter is None else drafter
    if name not in (IMPLICIT_DRAFTER, HEAD_DRAFTER):
        raise SpecgymError(f"live trees are drafted by the draft model ({IMPLICIT_DRAFTER!r}) or the draft head "
                           f"({HEAD_DRAFTER!r}), not {name!r}")
    if name == HEAD_DRAFTER and engine.head is None:
        raise SpecgymError(f"drafter {HEAD_DRAFTER!r}: the live engine has no draft head (its pair folder has none "
                           f"or it was loaded without it)")
    lean = engine.runner_of(engine.target) is not None and (
        name == HEAD_DRAFTER or engine.runner_of(engine.draft) is not None)
    if not lean:
        raise SpecgymError("live tree verification needs the lean forward (GPT-2 or Llama-family draft and "
                           "target: llama, qwen2, mistral; lean=True); other models decode chains only")
    return name


def run_live_tree(engine: LiveEngine, prompt_ids: Sequence[int], ctrl: TreeController, max_new_tokens: int,
                  request_id: str = "live", category: str = "live", stop_at_eos: bool = False,
                  drafter: str | None = None, temperature: float = 0.0) -> LiveTreeResult:
    """Decode one request live (greedy) with a tree controller (:mod:`specgym.envs.engines.live.tree`).

    Each round is the controller's own (:meth:`TreeController.play_live`): static trees play their tree;
    ``tree-chain:SPEC`` plays the inner controller's K as the width-1 tree and lets it observe the chain round
    (token-level inner controllers are refused: their stops need the chain engine's per-token signals);
    ``tree-eagle`` builds each tree from the drafter's real frontier probabilities (exact live, unlike its
    approximate replay); ``tree-ppo`` observes the round as the chain round along the drafter's rank-0 spine. A
    controller that grows its tree from the trace's per-position signals (``tree-predicted``) refuses in one line
    (:meth:`TreeController.check_live`).

    ``drafter``: who drafts the trees, the draft model (``None``, ``draft``) or the draft head (``head``); ``None``
    takes the controller's own ``drafter`` attribute where it has one. ``temperature`` above 0 is refused in one line
    (:func:`check_tree_drafter`).
    """
    ctrl.check_live()
    req = LiveTreeRequest(engine, prompt_ids, max_new_tokens, stop_at_eos, request_id, category,
                          drafter if drafter is not None else ctrl.drafter, temperature)
    ctrl.reset(req.context)
    while not req.done:
        ctrl.play_live(req)
    return req.tree_result

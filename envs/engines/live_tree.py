"""Live tree verification: a rank-defined draft tree per round, every node verified in one target forward.

A :class:`LiveTreeRequest` plays the tree rounds of :mod:`specgym.envs.core.tree` on a real pair (greedy, GPT-2
models through the lean forward, :mod:`~specgym.envs.engines.lean_forward`). One round with a :class:`TreeShape`
clipped to depth ``D = min(depth, N - i - 1)``:

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
contiguous block. Refused with one line: sampling (``temperature > 0``: tree rejection sampling is not implemented
here, the replay refuses it too) and models the lean forward does not run (non-GPT-2). Timing as the chain engine:
measured, or priced by :meth:`CostProfile.tree_round_time` when the engine's ``timing`` is a profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.tree import TreeRoundOutcome, TreeShape
from specgym.envs.engines.draft_stats import draft_stats
from specgym.envs.engines.live_engine import LiveEngine, LiveRequest
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

    Attributes:
        tree_result: The :class:`LiveTreeResult` so far.
        spine_conf, spine_entropy: After a round played with ``stats=True``, the draft confidence and entropy of
            the rank-0 spine's nodes (for a chain, of every drafted token: what a chain controller observes).
    """

    def __init__(self, engine: LiveEngine, prompt_ids: Sequence[int], max_new_tokens: int, stop_at_eos: bool = False,
                 request_id: str = "live", category: str = "live"):
        if not engine.lean:
            raise SpecgymError("live tree verification needs the lean forward (GPT-2 draft and target, lean=True); "
                               "other models decode chains only")
        super().__init__(engine, prompt_ids, max_new_tokens, 0.0, 0, stop_at_eos, request_id, category)
        draft, target = engine._lean[id(engine.draft)], engine._lean[id(engine.target)]
        assert draft is not None and target is not None  # engine.lean
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

    def _draft_tree(self, tree: TreeShape, room: int, nodes: int, anc: np.ndarray, stats: bool) -> list[int]:
        """Tokens of nodes ``0..nodes`` (node 0 = the root, the last accepted token), one draft forward per depth."""
        eng, torch, seq = self.engine, self.engine._torch, self.seq
        draft = self.runners[0]
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
        eng, torch, seq = self.engine, self.engine._torch, self.seq
        i, n = self.position, self.length
        room = min(tree.depth, n - i - 1)
        nodes = int(tree.nodes_upto[room])
        prefix = len(seq) - 1
        if prefix + 1 + nodes > eng.context:
            raise SpecgymError(f"tree {tree.name!r}: {nodes} nodes after {prefix + 1} tokens exceed the models' "
                               f"context of {eng.context}")
        target = self.runners[1]
        r0 = eng._clock()
        if room == 0:
            tlogits = target([seq[-1]], self.tcache)[:, : eng.vocab]
            path: list[int] = []
            tokens = [seq[-1]]
            extra = int(torch.argmax(tlogits[0]))
            self.spine_conf = self.spine_entropy = np.zeros(0, np.float32)
        else:
            parent = tree_parents(tree, nodes)
            depth_of = tree.depth_of[: nodes + 1].tolist()
            anc = ancestor_matrix(parent)
            tokens = self._draft_tree(tree, room, nodes, anc, stats)
            tlogits = target(tokens, self.tcache, positions=[prefix + x for x in depth_of],
                             mask=tree_mask(anc, 0, nodes + 1, prefix, eng.device))[:, : eng.vocab]
            targ = torch.argmax(tlogits, -1).tolist()
            kids = tree.child.tolist()
            v, path = 0, []
            while len(path) < room:
                nxt = next((c for c in kids[v] if 0 < c <= nodes and tokens[c] == targ[v]), -1)
                if nxt < 0:
                    break
                path.append(nxt)
                v = nxt
            extra = int(targ[v])
            # keep the accepted path's keys/values, moved next to the root; drop the rest of the tree
            self.tcache.compact(prefix + 1, [prefix + u for u in path])
            self.dcache.compact(prefix + 1, [prefix + u for u in path if depth_of[u] < room])
        accepted = len(path)
        new = [tokens[u] for u in path] + [extra]
        if self.index is not None:
            for t in new:
                self.index.append(t)
            self.index.commit()
        seq.extend(new)
        eng._sync()
        measured_ms = (eng._clock() - r0) * 1000.0
        produced = accepted + 1
        i_end = i + produced
        if self.stop_at_eos and eng.eos_token_id is not None and eng.eos_token_id in new:
            produced = new.index(eng.eos_token_id) + 1
            accepted = produced - 1
            new = new[:produced]
            i_end = n
        time_ms = eng.timing.tree_round_time(room, nodes) if isinstance(eng.timing, CostProfile) else measured_ms
        self.position = i_end
        self.done = i_end >= n
        outcome = TreeRoundOutcome(i, room, nodes, accepted, produced, time_ms, self.done)
        res = self.tree_result
        res.tokens.extend(new)
        if len(res.tokens) > n:
            del res.tokens[n:]
        res.rounds.append(outcome)
        res.time_ms += time_ms
        return outcome

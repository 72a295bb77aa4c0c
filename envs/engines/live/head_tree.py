"""Draft trees grown by the draft head (EAGLE's recurrence on the target's features), and the ranks that replay them.

The draft head (:mod:`~specgym.envs.engines.live.draft_head`) needs no KV cache: from the target's feature ``f`` at
the position before the last accepted token and that token, ``f_1 = step(f, last)`` is the feature whose scores
propose the first draft token, and a node holding token ``x`` under a parent of feature ``f_p`` has the feature
``step(f_p, x)``. So a tree is grown one batched head step per depth over the frontier (every row its own node: no
attention mask, a node sees only its own path through its feature), and its children are the node's top-``c``
tokens over the head's draft vocabulary: ranks ``0..c-1`` as the tree replay defines them (ties of equal scores
aside). The live tree engine (:class:`~specgym.envs.engines.live.tree.LiveTreeRequest` with ``drafter="head"``)
verifies the tree in one target forward and takes the head's next feature from the target's hidden state at the
last accepted node.

:func:`grow_head_tree` grows a rank-defined :class:`TreeShape`; :func:`grow_head_eagle` grows EAGLE-2's dynamic tree
(every generated node scored by its path confidence, the product of the head's probabilities; the ``beam`` best
of each depth expanded); :func:`head_ranks` / :func:`head_rank_table` are what a recording stores so the tree
replay plays head trees (``ranks_head``, ``topk_head``: the rank of the target's token among the head's scores, and
the head's top probabilities, at each depth from each round start: unlike a draft model's rank, a head's depends on
where the round started, because its feature there is its own prediction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.envs.core.tree import TreeShape
from specgym.envs.engines.live.draft_head import target_features
from specgym.envs.engines.live.draft_stats import draft_stats, token_rank
from specgym.errors import SpecgymError

#: :func:`head_ranks`'s entry where no rank exists (a token outside the head's vocabulary, or past the completion).
NO_RANK = np.iinfo(np.int16).max


@dataclass
class HeadEagleNodes:
    """The nodes EAGLE-2 generated on the head in one round (node 0 the root), in generation order.

    Attributes:
        score: Path confidence (product of the head's probabilities along the path; the root 1).
        depth: Depth of each node.
        token: Token id of each node (the root: the last accepted token).
        parent: Index of each node's parent (the root -1).
    """

    score: list[float]
    depth: list[int]
    token: list[int]
    parent: list[int]


def _root(head: Any, feature: Any, last: int) -> Any:
    """The feature that proposes the first draft token: one head step from ``feature`` with the last token."""
    import torch

    return head.step(feature.reshape(1, -1), torch.tensor([int(last)], dtype=torch.long, device=feature.device))


def grow_head_tree(head: Any, feature: Any, last: int, tree: TreeShape, room: int,
                   stats: bool = False) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Tokens of ``tree``'s nodes ``0..nodes_upto[room]`` (node 0 = ``last``), grown by the head.

    One head step per depth over the frontier's nodes that have children in the clipped tree (the root's step
    first), each node's children its top-``c`` tokens.

    Args:
        head: A draft head (:func:`~specgym.envs.engines.live.draft_head.build_head`).
        feature: The target's hidden state at the position before ``last`` ``(width,)``.
        last: The last accepted token (the tree's root).
        tree: The rank-defined tree.
        room: Depth to grow (``1 <= room <= tree.depth``).
        stats: Also return the head's confidence and entropy at each node of the rank-0 spine's parents.

    Returns:
        The node tokens, and the spine's confidence and entropy per depth (empty without ``stats``).
    """
    import torch

    nodes = int(tree.nodes_upto[room])
    child = tree.child
    tokens = [0] * (nodes + 1)
    tokens[0] = int(last)
    frontier = [0]  # nodes whose children come next, one row of f each
    f = _root(head, feature, last)
    confs: list[float] = []
    ents: list[float] = []
    spine = 0  # the rank-0 spine's node at depth d - 1 (first in breadth-first order: first row when it expands)
    for d in range(1, room + 1):
        logits = head.scores(f)
        kids = [[c for c in child[v].tolist() if 0 < c <= nodes] for v in frontier]
        if stats and frontier[0] == spine:
            st = draft_stats(logits[:1], 0.0)
            confs.append(float(st.conf[0]))
            ents.append(float(st.entropy[0]))
            spine = kids[0][0]
        width = max(len(k) for k in kids)
        if width > len(head.ids):
            raise SpecgymError(f"tree {tree.name!r}: a node expands {width} children, above the draft head's "
                               f"vocabulary of {len(head.ids)} tokens")
        top = head.ids[torch.topk(logits, width, dim=-1).indices].tolist()
        nxt: list[int] = []
        rows: list[int] = []
        for row, (ks, toks) in enumerate(zip(kids, top)):
            for r, c in enumerate(ks):
                tokens[c] = int(toks[r])
                if d < room and 0 < child[c][0] <= nodes:
                    nxt.append(c)
                    rows.append(row)
        if not nxt:
            break
        f = head.step(f[rows], torch.tensor([tokens[c] for c in nxt], dtype=torch.long, device=f.device))
        frontier = nxt
    return tokens, np.asarray(confs, np.float32), np.asarray(ents, np.float32)


def grow_head_eagle(head: Any, feature: Any, last: int, depth: int, beam: int) -> HeadEagleNodes:
    """EAGLE-2's expansion on the head: per depth the ``beam`` generated nodes of highest path confidence (ties:
    generated first) take one batched head step and each generates its top-``beam`` children; ``depth`` expansions.
    """
    import torch

    gen = HeadEagleNodes([1.0], [0], [int(last)], [-1])
    frontier = [0]
    f = _root(head, feature, last)
    for d in range(1, depth + 1):
        probs = torch.softmax(head.scores(f).float(), -1)
        top = torch.topk(probs, min(beam, probs.shape[-1]), dim=-1)
        toks = head.ids[top.indices].tolist()
        new: list[int] = []
        row_of: dict[int, int] = {}
        for row, g in enumerate(frontier):
            for p, t in zip(top.values[row].tolist(), toks[row]):
                row_of[len(gen.score)] = row
                new.append(len(gen.score))
                gen.score.append(gen.score[g] * p)
                gen.depth.append(d)
                gen.token.append(int(t))
                gen.parent.append(g)
        frontier = sorted(new, key=lambda g: (-gen.score[g], g))[:beam]
        if d < depth:
            f = head.step(f[[row_of[g] for g in frontier]],
                          torch.tensor([gen.token[g] for g in frontier], dtype=torch.long, device=f.device))
    return gen


def head_ranks(head: Any, features: Any, ids: list[int], prompt_len: int, depth: int) -> np.ndarray:
    """The head's true-path ranks of a greedy completion: ``rank[g, j]`` = the rank of completion token ``g + j``
    among the head's scores after ``j + 1`` steps from the round start at completion position ``g``, fed the true
    tokens (:data:`NO_RANK` where the token is outside the head's vocabulary or past the completion).

    A rank-defined tree played at ``g`` accepts ``TreeShape.accepted(rank[g], room)`` (the head's children at the
    correct prefix are exactly its top tokens there), which is what the tree replay of head trees needs.

    Args:
        head: A draft head.
        features: The target's last hidden states over ``ids`` ``(len(ids), width)``, teacher-forced.
        ids: Prompt then completion token ids.
        prompt_len: Prompt length (at least 2).
        depth: Deepest tree to replay (columns).
    """
    return head_rank_table(head, features, ids, prompt_len, depth)[0]


def head_rank_table(head: Any, features: Any, ids: list[int], prompt_len: int, depth: int,
                    topk: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """:func:`head_ranks` and, with ``topk``, the head's ``topk`` largest probabilities at the same steps.

    The steps are the live head tree's (:func:`grow_head_tree`): the start's feature is one head step from the
    target's hidden state before the last accepted token with that token, each deeper one a step from the previous
    feature with the true token; every start of the completion is one row of the same batched steps.

    Returns:
        ``rank`` ``(n, depth)`` int16 (:data:`NO_RANK` where none) and ``probs`` ``(n, depth, topk)`` float32
        (softmax over the head's vocabulary, descending; zeros past the completion).
    """
    import torch

    n = len(ids) - prompt_len
    out = np.full((max(n, 0), depth), NO_RANK, dtype=np.int16)
    probs = np.zeros((max(n, 0), depth, topk), dtype=np.float32)
    if n <= 0:
        return out, probs
    if prompt_len < 2:
        raise SpecgymError("draft head ranks need a prompt of at least 2 tokens")
    dev = features.device
    seq = torch.tensor(ids, dtype=torch.long, device=dev)
    col = torch.full((int(head.embedding.shape[0]),), -1, dtype=torch.long, device=dev)
    col[head.ids] = torch.arange(len(head.ids), device=dev)  # token id -> the head's score column
    starts = torch.arange(prompt_len, len(ids), device=dev)
    with torch.inference_mode():
        f, tok = features[starts - 2], seq[starts - 1]
        for j in range(depth):
            f = head.step(f, tok)
            live = starts + j < len(ids)
            if not bool(live.any()):
                break
            want = seq[torch.clamp(starts + j, max=len(ids) - 1)]
            c = col[want]
            scores = head.scores(f)
            rank = token_rank(scores, c.clamp_min(0))
            ok = live & (c >= 0)
            alive = live.cpu().numpy()
            out[:, j] = np.where(ok.cpu().numpy(), np.minimum(rank.cpu().numpy(), NO_RANK - 1), NO_RANK)
            if topk:
                top = torch.topk(torch.softmax(scores.float(), -1), min(topk, scores.shape[-1]), dim=-1).values
                probs[alive, j, : top.shape[1]] = top.cpu().numpy()[alive]
            tok = want
    return out, probs


def recorded_head_ranks(target: Any, head: Any, prompt: list[int], completion: list[int], depth: int) -> np.ndarray:
    """:func:`head_ranks` of one greedy request over one teacher-forced target forward."""
    ids = [int(t) for t in prompt] + [int(t) for t in completion]
    return head_ranks(head, target_features(target, ids), ids, len(prompt), depth)

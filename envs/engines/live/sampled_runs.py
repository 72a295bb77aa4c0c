"""Per-start runs of whole-proposal drafters on a sampled completion: one draw of exact speculative sampling.

A greedy recording stores a prompt-lookup or draft-head drafter's acceptance as its per-start **runs**: from every
position ``g`` of the completion, how many of its proposals match before the first difference (exact: a greedy
round accepts a draft token iff it is the target's token). Under sampling a round's acceptance is random: draft
token ``y_j`` is accepted with probability ``min(1, p_j(y_j) / q_j(y_j))``, where ``p_j`` is the target's
distribution (at the temperature) after the context and ``y_1 .. y_{j-1}``, and ``q_j`` the drafter's (one-hot for
prompt lookup, whose proposal is deterministic; the head's softmax for the head). So a sampled recording stores
**one draw** of that round from every start: the drafter proposes from ``prompt + completion[:g]``, the target
scores the proposal, seeded uniforms decide, and ``run[g]`` is the leading accepted count. Replay then reads it as
it reads a greedy run (``accepted = min(run[g], K)``: speculative sampling's test of token ``j`` depends on tokens
``<= j`` only, so one draw of the longest round answers every ``K``). It is exact per start and a Monte Carlo draw
per request; the completion it starts from is the target's own sample (exact speculative sampling preserves the
target's distribution), as every replayed context is.

The target's distributions after a proposal come from tree-masked forwards of the lean runner over one cache:
the teacher-forced sequence first (its logits give ``p_1`` of every start), then one forward per depth of the
proposal tokens of the starts still accepting, each row at its own position and seeing its context and its own
earlier proposal tokens only. A start stops at its first rejection, so a depth costs the starts that reached it.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from specgym.envs.core.kinds import HEAD_DRAFTER, NGRAM_DRAFTER
from specgym.envs.core.ngram_proposer import ngram_propose
from specgym.errors import SpecgymError

#: What a sampled recording says of its whole-proposal drafters' runs (the metadata ``drafters`` entry's source).
SAMPLED_RUNS_SOURCE = ("one draw of exact speculative sampling per start of the sampled completion (seeded): the "
                       "target's distribution after each proposal token, accepted with min(1, p/q)")


def runs_seed(request_id: str, drafter: str) -> int:
    """The seed of one request's draw for one drafter (independent of the recording's order and sharding)."""
    return zlib.crc32(f"{request_id}\0{drafter}".encode()) & 0x7FFFFFFF


class SampledRequest:
    """One sampled request's teacher-forced target pass (``prompt + completion[:-1]``, the lean runner's cache kept),
    from which drafters' per-start runs are drawn (:meth:`runs`).

    Args:
        runner: The target's lean forward (:mod:`~specgym.envs.engines.live.lean_forward`: tree masks, positions).
        prompt: Prompt token ids (at least one).
        completion: The sampled completion's token ids.
        temperature: The target's sampling temperature (> 0).
        vocab: Tokens the target samples over (its first ``vocab`` logits).
    """

    def __init__(self, runner: Any, prompt: Sequence[int], completion: Sequence[int], temperature: float,
                 vocab: int):
        import torch

        self.runner, self.temperature, self.vocab = runner, float(temperature), int(vocab)
        self.prompt_len, self.n = len(prompt), len(completion)
        self.ids = [int(t) for t in prompt] + [int(t) for t in completion]
        self.cache = runner.new_cache()
        with torch.inference_mode():
            logits, hidden = runner(self.ids[:-1], self.cache, hidden=True)
        self.length = self.cache.get_seq_length()
        self.logits = logits[self.prompt_len - 1:, : self.vocab]  # row g: the target after prompt + completion[:g]
        self.hidden = hidden  # the target's last hidden state at every fed position (a draft head's features)

    def runs(self, proposals: np.ndarray, q_drawn: np.ndarray | None, u: np.ndarray) -> np.ndarray:
        """Per-start runs of one draw of exact speculative sampling (module docstring).

        Args:
            proposals: ``(n, k)`` proposal tokens of each start ``g`` (from ``prompt + completion[:g]``); ``-1`` ends
                a shorter proposal.
            q_drawn: ``(n, k)`` the drafter's probability of each proposal token; ``None`` = a deterministic
                proposal (prompt lookup).
            u: ``(n, k)`` uniforms of the acceptance tests.

        Returns:
            ``run`` ``(n,)`` int16: the accepted count of each start's round of up to ``k`` draft tokens.
        """
        import torch

        n, k = proposals.shape
        run = np.zeros(n, dtype=np.int16)
        alive = np.arange(n)
        slots: list[np.ndarray] = []  # per depth: the cache slot of each start's proposal token there (-1: none)
        with torch.inference_mode():
            for j in range(k):
                tok = proposals[alive, j]
                alive, tok = alive[tok >= 0], tok[tok >= 0]
                if not len(alive):
                    break
                logits = self.logits[torch.as_tensor(alive)] if j == 0 else \
                    self._depth_logits(proposals, alive, j, slots)
                lp = torch.log_softmax(logits.float() / self.temperature, -1)
                px = lp.gather(1, torch.as_tensor(tok, dtype=torch.long)[:, None])[:, 0].exp().cpu().numpy()
                qx = np.ones(len(alive)) if q_drawn is None else q_drawn[alive, j]
                accept = u[alive, j] < np.minimum(1.0, px / np.maximum(qx, 1e-30))
                run[alive[accept]] += 1
                alive = alive[accept]
        self.cache.crop(self.length)  # back to the teacher-forced sequence
        return run

    def _depth_logits(self, proposals: np.ndarray, alive: np.ndarray, j: int, slots: list[np.ndarray]) -> Any:
        """The target's logits after proposal tokens ``1 .. j`` of the starts ``alive`` (each row sees the context
        of its start and its own earlier proposal tokens), their token ``j`` appended to the cache."""
        import torch

        start, m = self.cache.get_seq_length(), len(alive)
        ctx = self.prompt_len + alive  # start g's context: prompt + completion[:g], the first p_len + g slots
        mask = np.zeros((m, start + m), dtype=bool)
        mask[:, : self.length] = np.arange(self.length)[None, :] < ctx[:, None]
        rows = np.arange(m)
        for depth in slots:
            mask[rows, depth[alive]] = True
        mask[rows, start + rows] = True
        here = np.full(proposals.shape[0], -1, dtype=np.int64)
        here[alive] = start + rows
        slots.append(here)
        dev = self.hidden.device
        return self.runner(proposals[alive, j - 1].tolist(), self.cache, positions=(ctx + j - 1).tolist(),
                           mask=torch.from_numpy(mask).to(dev))[:, : self.vocab]


def ngram_proposals(ids: Sequence[int], prompt_len: int, k: int, min_n: int, max_n: int) -> np.ndarray:
    """``(n, k)`` prompt-lookup proposals from every start of the completion ``ids[prompt_len:]`` (``-1`` pads a
    shorter one)."""
    n = len(ids) - prompt_len
    out = np.full((n, k), -1, dtype=np.int64)
    for g in range(n):
        prop = ngram_propose(ids[: prompt_len + g], k, min_n, max_n)
        out[g, : len(prop)] = prop
    return out


def head_proposals(head: Any, req: SampledRequest, k: int, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, q_drawn)`` ``(n, k)``: the draft head's sampled proposals from every start of ``req`` (fed the
    target's features there: :meth:`DraftHead.sample_batch`) and its probability of each drawn token."""
    import torch

    p_len = req.prompt_len
    if p_len < 2:
        raise SpecgymError("draft head runs need a prompt of at least 2 tokens")
    seq = torch.tensor(req.ids, dtype=torch.long, device=req.hidden.device)
    starts = torch.arange(p_len, len(req.ids), device=req.hidden.device)
    with torch.inference_mode():
        toks, dists = head.sample_batch(req.hidden[starts - 2], seq[starts - 1], k, req.temperature,
                                        torch.from_numpy(u).to(req.hidden.device))
        cols = torch.searchsorted(head.ids, toks)
        q = dists.gather(2, cols[..., None])[..., 0]
    return toks.cpu().numpy().astype(np.int64), q.float().cpu().numpy()


def request_sampled_runs(runner: Any, prompt: Sequence[int], completion: Sequence[int], temperature: float,
                         request_id: str, k: int, vocab: int, ngram_n: tuple[int, int],
                         head: Any = None) -> dict[str, np.ndarray]:
    """One sampled request's per-start runs of prompt lookup (``ngram``) and, given one, the draft head (``head``):
    what a sampled recording stores as ``runs_ngram`` / ``runs_head``, each drafter's draws seeded by
    :func:`runs_seed`."""
    req = SampledRequest(runner, prompt, completion, temperature, vocab)
    out: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(runs_seed(request_id, NGRAM_DRAFTER))
    out[NGRAM_DRAFTER] = req.runs(ngram_proposals(req.ids, req.prompt_len, k, *ngram_n), None, rng.random((req.n, k)))
    if head is not None:
        rng = np.random.default_rng(runs_seed(request_id, HEAD_DRAFTER))
        toks, q = head_proposals(head, req, k, rng.random((req.n, k)))
        out[HEAD_DRAFTER] = req.runs(toks, q, rng.random((req.n, k)))
    return out

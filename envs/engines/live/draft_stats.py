"""Draft token statistics from logits: the one definition of ``draft_conf`` and ``draft_entropy``.

The live engine (token by token), the recorder (every position of a request at once) and the transformers
integration compute the features a controller sees with :func:`draft_stats`, so recorded traces, live rounds and
``generate()`` rounds describe a draft token the same way:

* greedy (``temperature == 0``): the draft proposes ``argmax q``; ``conf = max q``; ``entropy = H(q)`` with
  ``q = softmax(logits)``;
* sampling (``temperature > 0``): the draft proposes ``x ~ q`` with ``q = softmax(logits / T)``; ``conf = q(x)``;
  ``entropy = H(q)``.

The signals of trace format v2 (:mod:`specgym.envs.core.signals`) are defined here too: :func:`top_probs` (the
draft's ``TOPK`` largest probabilities of ``q``) and :func:`token_rank` (the rank of a token in the draft's order).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from specgym.envs.core.signals import TOPK
from specgym.envs.engines.live.clock import host_multinomial


class DraftStats(NamedTuple):
    """Statistics of ``n`` draft positions (torch tensors).

    Attributes:
        tokens: ``(n,)`` the proposed tokens.
        probs: ``(n, V)`` the draft distributions ``q`` the tokens were chosen from.
        conf: ``(n,)`` ``q(token)``.
        entropy: ``(n,)`` ``H(q)`` in nats.
    """

    tokens: Any
    probs: Any
    conf: Any
    entropy: Any


def draft_stats(logits: Any, temperature: float, tokens: Any = None, generator: Any = None) -> DraftStats:
    """Choose (or take) the draft tokens of ``logits`` ``(n, V)`` and describe them.

    Args:
        logits: Draft logits, ``(n, V)``, any float dtype (computed in float32).
        temperature: 0 = greedy (argmax), > 0 = sample from ``softmax(logits / T)``.
        tokens: The tokens actually proposed (``(n,)``), when the caller already chose them; otherwise they are
            chosen here.
        generator: ``torch.Generator`` for sampling; a CPU one (:func:`~specgym.envs.engines.live.clock.host_generator`)
            samples on the host whatever the logits' device, so a seed gives the same tokens on a GPU.
    """
    import torch

    x = logits.float()
    if temperature > 0:
        x = x / temperature
    logp = torch.log_softmax(x, -1)
    probs = logp.exp()
    if tokens is None:
        tokens = torch.argmax(x, -1) if temperature == 0 else host_multinomial(probs, generator)[:, 0]
    conf = probs.gather(1, tokens.view(-1, 1))[:, 0].clamp(0.0, 1.0)
    entropy = (-(probs * logp).sum(-1)).clamp_min(0.0)
    return DraftStats(tokens, probs, conf, entropy)


def top_probs(probs: Any, k: int | None = None) -> Any:
    """``(n, k)`` the ``k`` (default ``TOPK``) largest probabilities of each row of ``probs``, descending; rows
    padded with 0 when the vocabulary is smaller than ``k``."""
    import torch

    k = TOPK if k is None else k
    top = torch.topk(probs, min(k, probs.shape[-1]), dim=-1, sorted=True).values
    if top.shape[-1] < k:
        top = torch.nn.functional.pad(top, (0, k - top.shape[-1]))
    return top


def token_rank(logits: Any, tokens: Any) -> Any:
    """``(n,)`` rank of ``tokens`` in each row of ``logits`` ``(n, V)``, 0 = the argmax: the number of entries
    above the token's, plus the equal ones at a lower index (ties broken as ``argmax`` breaks them)."""
    import torch

    x = logits.float()
    mine = x.gather(1, tokens.view(-1, 1))
    lower = torch.arange(x.shape[-1], device=x.device).view(1, -1) < tokens.view(-1, 1)
    return ((x > mine) | ((x == mine) & lower)).sum(-1)

"""Draft token statistics from logits: the one definition of ``draft_conf`` and ``draft_entropy``.

The live engine (token by token), the recorder (every position of a request at once) and the transformers
integration compute the features a controller sees with :func:`draft_stats`, so recorded traces, live rounds and
``generate()`` rounds describe a draft token the same way:

* greedy (``temperature == 0``): the draft proposes ``argmax q``; ``conf = max q``; ``entropy = H(q)`` with
  ``q = softmax(logits)``;
* sampling (``temperature > 0``): the draft proposes ``x ~ q`` with ``q = softmax(logits / T)``; ``conf = q(x)``;
  ``entropy = H(q)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple


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
        generator: ``torch.Generator`` for sampling.
    """
    import torch

    x = logits.float()
    if temperature > 0:
        x = x / temperature
    logp = torch.log_softmax(x, -1)
    probs = logp.exp()
    if tokens is None:
        tokens = torch.argmax(x, -1) if temperature == 0 else torch.multinomial(probs, 1, generator=generator)[:, 0]
    conf = probs.gather(1, tokens.view(-1, 1))[:, 0].clamp(0.0, 1.0)
    entropy = (-(probs * logp).sum(-1)).clamp_min(0.0)
    return DraftStats(tokens, probs, conf, entropy)

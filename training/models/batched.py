"""Batched generation with a Hugging Face causal LM on the CPU: rows of token ids, left-padded, sorted by length.

The batching of :func:`~specgym.training.models.distill.sample_answers` (left padding, so that every row ends where
generation starts; a seed per batch) as a function of its own, for callers that need the ids and where each row
stopped rather than logits: the data generator's prompt, passage and answer stages
(:mod:`specgym.training.models.data_gen`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Generation:
    """One row's generated tokens.

    Attributes:
        ids: The new token ids, up to and including the first stop token (when one came).
        stopped: A stop token ended the row (else ``max_new_tokens`` did).
    """

    ids: list[int]
    stopped: bool


def cut_at_stop(ids: Sequence[int], stop_ids: Sequence[int]) -> Generation:
    """``ids`` up to and including the first of ``stop_ids`` (the rest of a finished row is padding)."""
    stops = set(stop_ids)
    for n, t in enumerate(ids):
        if t in stops:
            return Generation([int(v) for v in ids[:n + 1]], True)
    return Generation([int(v) for v in ids], False)


def generate_rows(model: Any, rows: Sequence[Sequence[int]], *, pad_id: int, stop_ids: Sequence[int],
                  max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, batch: int = 8,
                  on_batch: Callable[[int, int], None] | None = None) -> list[Generation]:
    """Continue every row of token ids; returns one :class:`Generation` per row, in the order of ``rows``.

    Rows are sorted by length and cut into batches of ``batch`` (little padding), each left-padded with ``pad_id``
    under an attention mask. ``temperature`` 0 is greedy; above 0 each batch samples from the temperature-scaled
    distribution (nucleus ``top_p``; no top-k) after ``torch.manual_seed(seed + batch index)``, so a run is
    repeatable on one machine.

    Args:
        model: The causal LM (eval mode).
        rows: The prompts' token ids.
        pad_id: The id padding is written with.
        stop_ids: Tokens that end a row (kept as its last token).
        max_new_tokens: Longest continuation.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_p: Nucleus sampling mass (1 keeps the whole distribution).
        seed: Base seed of the batches' sampling.
        batch: Rows per ``generate`` call.
        on_batch: Called after every batch with ``(rows done in it, new tokens in it)`` (a progress bar).
    """
    import torch

    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]), i))
    out: list[Generation | None] = [None] * len(rows)
    sample = temperature > 0
    for b, start in enumerate(range(0, len(order), batch)):
        idx = order[start:start + batch]
        width = max(len(rows[i]) for i in idx)
        x = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(x)
        for r, i in enumerate(idx):
            x[r, width - len(rows[i]):] = torch.tensor(list(rows[i]), dtype=torch.long)
            mask[r, width - len(rows[i]):] = 1
        torch.manual_seed(seed + b)
        with torch.inference_mode():
            seqs = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=sample,
                                  temperature=temperature if sample else None, top_p=top_p if sample else None,
                                  top_k=0 if sample else None, eos_token_id=list(stop_ids), pad_token_id=pad_id)
        new = 0
        for r, i in enumerate(idx):
            out[i] = g = cut_at_stop(seqs[r, width:].tolist(), stop_ids)
            new += len(g.ids)
        if on_batch is not None:
            on_batch(len(idx), new)
    return [g for g in out if g is not None]

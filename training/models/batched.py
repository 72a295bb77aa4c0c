"""Batched generation with a Hugging Face causal LM on the CPU: rows of token ids in, each row's new tokens out.

For the data generator's prompt, passage and answer stages (:mod:`specgym.training.models.data_gen`), which need
the ids and where each row stopped rather than logits. A Llama-family model runs under continuous batching
(:mod:`specgym.training.models.continuous_batch`: ``batch`` slots, a finished row's slot takes the next row at once,
each row sampled from a generator seeded by ``(seed, row index)``); any other model goes through transformers'
``generate`` over static batches of rows sorted by length and left-padded (the batching of
:func:`~specgym.training.models.distill.sample_answers`), where a batch runs until its longest row ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specgym.training.models.continuous_batch import ContextTooShort, continuous_generate, row_seed, supported


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

    A model :func:`~specgym.training.models.continuous_batch.supported` runs under continuous batching with ``batch``
    slots: greedy rows are those a one-row greedy ``generate`` writes, and above temperature 0 row ``i`` draws from
    its own generator seeded by ``row_seed(seed, i)``, so its text depends on its prompt, ``seed`` and ``i`` only
    (not on ``batch`` or the other rows). Any other model (or rows too long for the model's context) goes through
    ``generate`` over batches of ``batch`` rows sorted by length and left-padded with ``pad_id``, each sampled after
    ``torch.manual_seed(seed + batch index)`` (repeatable on one machine for one ``batch``). Sampling is from the
    temperature-scaled distribution cut to its nucleus ``top_p`` (no top-k) either way.

    Args:
        model: The causal LM (eval mode).
        rows: The prompts' token ids.
        pad_id: The id padding is written with.
        stop_ids: Tokens that end a row (kept as its last token).
        max_new_tokens: Longest continuation.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_p: Nucleus sampling mass (1 keeps the whole distribution).
        seed: Base seed of the sampling.
        batch: Slots of the continuous batching (rows per ``generate`` call on the fallback).
        on_batch: Called as rows finish with ``(rows finished, their new tokens)`` (a progress bar; after each
            decode step that finished rows, or each ``generate`` call on the fallback).
    """
    if rows and all(rows) and supported(model):
        try:
            news = continuous_generate(model, rows, stop_ids=stop_ids, max_new_tokens=max_new_tokens,
                                       temperature=temperature, top_p=top_p,
                                       seeds=[row_seed(seed, i) for i in range(len(rows))], slots=batch,
                                       on_batch=on_batch)
        except ContextTooShort:
            pass
        else:
            return [cut_at_stop(ids, stop_ids) for ids in news]
    return _generate_static(model, rows, pad_id=pad_id, stop_ids=stop_ids, max_new_tokens=max_new_tokens,
                            temperature=temperature, top_p=top_p, seed=seed, batch=batch, on_batch=on_batch)


def _generate_static(model: Any, rows: Sequence[Sequence[int]], *, pad_id: int, stop_ids: Sequence[int],
                     max_new_tokens: int, temperature: float, top_p: float, seed: int, batch: int,
                     on_batch: Callable[[int, int], None] | None) -> list[Generation]:
    """``generate`` over static batches of ``batch`` rows sorted by length (the models the slotted forward lacks)."""
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

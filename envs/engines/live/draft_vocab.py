"""A draft restricted to a subset of the vocabulary: a smaller output layer, the same exact decoding.

For a small target with a large vocabulary (SmolLM2-135M: 49,152 words x 576) the draft's output layer is most of a
draft token's work. A draft folder may name a list of token ids in :data:`DRAFT_VOCAB_FILE`; the draft then scores
only those tokens (:class:`ReducedHead`) and gives every other token probability exactly zero. Speculative decoding
stays exact: greedy verification compares the draft's token with the target's argmax over the full vocabulary, and
rejection sampling is exact for any draft distribution, including one with zeros. What changes is cost (a smaller
matrix product) and acceptance (a target token outside the list is never drafted); ``specgym bench draft-vocab``
measures both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specgym.errors import SpecgymError

#: In a draft folder: ``{"file": "draft-vocab-N.json"}``, the token id list the draft is restricted to.
DRAFT_VOCAB_FILE = "specgym-draft-vocab.json"
#: The logit of a token outside the list: finite (so entropies stay finite), and exp() of it is exactly 0.
OUTSIDE = -1e9


def draft_vocab_ids(folder: str | Path) -> list[int] | None:
    """The token ids a draft folder restricts its output layer to, or None (the full vocabulary)."""
    marker = Path(folder) / DRAFT_VOCAB_FILE
    if not marker.is_file():
        return None
    try:
        spec = json.loads(marker.read_text(encoding="utf-8"))
        ids = json.loads((Path(folder) / spec["file"]).read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecgymError(f"{marker}: cannot read the draft vocabulary ({type(exc).__name__}: {exc})") from None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise SpecgymError(f"{marker}: {spec['file']} must be a non-empty list of token ids")
    return sorted(set(ids))


def output_rows(model: Any) -> int:
    """How many logits the model's output layer returns (its vocabulary, reduced draft or not)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or head.weight.shape[0])


def make_reduced_head(head: Any, ids: list[int], vocab: int) -> Any:
    """An output layer that scores ``ids`` with ``head``'s rows and returns ``vocab`` logits (:data:`OUTSIDE`
    elsewhere)."""
    import torch

    class ReducedHead(torch.nn.Module):
        """``vocab`` logits from the rows of the listed tokens only."""

        def __init__(self) -> None:
            super().__init__()
            idx = torch.tensor(ids, dtype=torch.long, device=head.weight.device)
            if int(idx.max()) >= vocab:
                raise SpecgymError(f"draft vocabulary: token id {int(idx.max())} is outside the model's {vocab}")
            self.rows = torch.nn.Linear(head.weight.shape[1], len(ids), bias=False, device=head.weight.device,
                                        dtype=head.weight.dtype)
            self.rows.weight = torch.nn.Parameter(head.weight.detach()[idx].clone(), requires_grad=False)
            self.register_buffer("ids", idx, persistent=False)
            self.out_features = vocab

        @property
        def weight(self) -> Any:  # what callers read the hidden size from (``weight.shape[1]``)
            return self.rows.weight

        def forward(self, h: Any) -> Any:
            sub = self.rows(h)
            out = sub.new_full((*sub.shape[:-1], self.out_features), OUTSIDE)
            return out.index_copy_(-1, self.ids, sub)

    return ReducedHead()


def restrict_draft_vocab(model: Any, folder: str | Path) -> int | None:
    """Restrict a loaded draft to the vocabulary its folder names (in place); returns the list's size or None."""
    ids = draft_vocab_ids(folder)
    if ids is None:
        return None
    model.set_output_embeddings(make_reduced_head(model.get_output_embeddings(), ids, output_rows(model)))
    return len(ids)

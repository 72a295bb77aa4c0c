"""A lean cached forward for GPT-2 models: transformers' arithmetic without its per-call overhead.

Speculative decoding calls the draft once per drafted token, so the draft's per-call cost decides how cheap drafting
is. For a small model on a CPU that cost is mostly Python: a transformers 5.x forward of a 1-layer, 128-wide GPT-2
takes ~1 ms (building masks and position ids, dispatching the attention interface, cache bookkeeping), while its
arithmetic takes ~0.1 ms. :class:`LeanGPT2` runs the same layers (the model's own LayerNorm, linear/``Conv1D`` or
packed modules and activation; scaled-dot-product attention) over a preallocated key/value cache, so a draft token
costs a fraction of that and a target step a little less. Logits equal the transformers forward up to float
rounding (``tests/test_live_engine.py``).

It applies to GPT-2 (``model_type == "gpt2"``) without cross-attention or the optional attention rescalings; for any
other model :func:`lean_runner` returns ``None`` and the engine keeps the transformers forward.
"""

from __future__ import annotations

from typing import Any


class KVCache:
    """Keys and values of every layer in preallocated tensors ``(layers, heads, capacity, head_dim)``.

    Offers the two methods of transformers' ``DynamicCache`` the engine uses: :meth:`get_seq_length` and
    :meth:`crop` (``n <= 0`` removes ``-n`` tokens).
    """

    def __init__(self, layers: int, heads: int, capacity: int, head_dim: int, dtype: Any, device: Any):
        import torch

        self.k = torch.zeros(layers, heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def get_seq_length(self) -> int:
        """Tokens held."""
        return self.length

    def crop(self, n: int) -> None:
        """As ``DynamicCache.crop``: ``n < 0`` removes the last ``-n`` tokens, ``n >= 0`` keeps the first ``n``."""
        self.length = max(0, self.length + n) if n < 0 else min(self.length, n)

    def compact(self, keep: int, slots: list[int]) -> None:
        """Keep the first ``keep`` tokens, then the entries of ``slots`` (each ``>= keep``, increasing) moved into
        consecutive slots ``keep, keep + 1, ..``: a verified tree's accepted path, the rest of the tree dropped."""
        if keep > self.length:
            raise ValueError(f"cannot keep {keep} tokens of a cache holding {self.length}")
        if slots:
            import torch

            src = torch.tensor(slots, device=self.k.device)
            dst = torch.arange(keep, keep + len(slots), device=self.k.device)
            self.k[:, :, dst] = self.k[:, :, src]  # the right side is gathered first: overlapping moves are safe
            self.v[:, :, dst] = self.v[:, :, src]
        self.length = keep + len(slots)


class LeanGPT2:
    """Cached forward of a loaded ``GPT2LMHeadModel`` (eval mode) over a :class:`KVCache`."""

    def __init__(self, model: Any):
        cfg = model.config
        self.blocks = list(model.transformer.h)
        self.wte = model.transformer.wte.weight
        self.wpe = model.transformer.wpe.weight
        self.ln_f = model.transformer.ln_f
        self.lm_head = model.lm_head
        self.heads = int(cfg.n_head)
        self.width = int(cfg.n_embd)
        self.head_dim = self.width // self.heads
        self.capacity = int(cfg.n_positions)

    def new_cache(self) -> KVCache:
        """An empty cache for one sequence of up to ``n_positions`` tokens."""
        return KVCache(len(self.blocks), self.heads, self.capacity, self.head_dim, self.wte.dtype, self.wte.device)

    def __call__(self, ids: list[int], cache: KVCache, hidden: bool = False, positions: list[int] | None = None,
                 mask: Any = None) -> Any:
        """Logits ``(len(ids), V)`` of the tokens ``ids`` following the ``cache.length`` tokens in ``cache``; with
        ``hidden``, ``(logits, h)`` where ``h`` ``(len(ids), width)`` is the last hidden state (after ``ln_f``, as
        transformers' ``hidden_states[-1]``).

        Tree attention: ``positions`` (the tokens' position ids) and ``mask`` (bool ``(len(ids), cache.length +
        len(ids))``, True = may attend) replace the causal defaults, so rows can be tree nodes that see the prefix
        and their own ancestors only (:mod:`specgym.envs.engines.live_tree`). Keys/values still go to the next
        ``len(ids)`` cache slots."""
        import torch
        import torch.nn.functional as F

        start, n = cache.length, len(ids)
        end = start + n
        if end > self.capacity:
            raise ValueError(f"sequence of {end} tokens exceeds the model's context of {self.capacity}")
        dev = self.wte.device
        if positions is not None and max(positions) >= self.capacity:
            raise ValueError(f"position {max(positions)} exceeds the model's context of {self.capacity}")
        pos = self.wpe[start:end] if positions is None else self.wpe[torch.tensor(positions, device=dev)]
        x = self.wte[torch.tensor(ids, device=dev)] + pos
        if mask is None and n > 1:  # query i (position start + i) sees keys 0 .. start + i
            mask = torch.ones(n, end, dtype=torch.bool, device=dev).tril(diagonal=start)
        H, hd = self.heads, self.head_dim
        for layer, block in enumerate(self.blocks):
            qkv = block.attn.c_attn(block.ln_1(x))
            q, k, v = qkv.view(n, 3, H, hd).permute(1, 2, 0, 3)  # each (H, n, hd)
            cache.k[layer, :, start:end] = k
            cache.v[layer, :, start:end] = v
            att = F.scaled_dot_product_attention(q, cache.k[layer, :, :end], cache.v[layer, :, :end], attn_mask=mask)
            x = x + block.attn.c_proj(att.transpose(0, 1).reshape(n, self.width))
            x = x + block.mlp.c_proj(block.mlp.act(block.mlp.c_fc(block.ln_2(x))))
        cache.length = end
        h = self.ln_f(x)
        return (self.lm_head(h), h) if hidden else self.lm_head(h)


def lean_runner(model: Any) -> LeanGPT2 | None:
    """A :class:`LeanGPT2` for a GPT-2 model whose forward it reproduces; ``None`` for any other model."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "gpt2" or not hasattr(model, "transformer"):
        return None
    if (getattr(cfg, "add_cross_attention", False) or not getattr(cfg, "scale_attn_weights", True)
            or getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or getattr(cfg, "reorder_and_upcast_attn", False)
            or cfg.n_embd % cfg.n_head):
        return None
    return LeanGPT2(model)

"""A lean cached forward for GPT-2 models: transformers' arithmetic without its per-call overhead.

Speculative decoding calls the draft once per drafted token, so the draft's per-call cost decides how cheap drafting
is. For a small model on a CPU that cost is mostly Python: a transformers 5.x forward of a 1-layer, 128-wide GPT-2
takes ~1 ms (building masks and position ids, dispatching the attention interface, cache bookkeeping), while its
arithmetic takes ~0.1 ms. :class:`LeanGPT2` runs the same layers (the model's own LayerNorm, linear/``Conv1D`` or
packed modules and activation; scaled-dot-product attention) over a preallocated key/value cache, so a draft token
costs a fraction of that and a target step a little less. Logits equal the transformers forward up to float
rounding (``tests/test_live_engine.py``).

It applies to GPT-2 (``model_type == "gpt2"``) without cross-attention or the optional attention rescalings, and
with :class:`LeanLlama` to the Llama family (``llama``, ``qwen2``, ``mistral``): RMSNorm, rotary position embeddings
(the model's own rotary module computes the cos/sin tables, so scaled RoPE variants with static frequencies are
covered), grouped-query attention (SDPA's ``enable_gqa``), the gated SiLU MLP, and sliding-window attention (Mistral's
on every layer, Qwen2's on the layers its ``layer_types`` name). Both take tree-attention masks and position ids,
so live tree verification runs on both. For any other model (or a dynamic RoPE, whose frequencies depend on the
sequence length) :func:`lean_runner` returns ``None`` and the engine keeps the transformers forward.

The cache grows on demand (doubling, up to the model's context), so a model with a 128k context does not allocate it
up front.
"""

from __future__ import annotations

from typing import Any


class KVCache:
    """Keys and values of every layer in preallocated tensors ``(layers, heads, capacity, head_dim)``.

    Offers the two methods of transformers' ``DynamicCache`` the engine uses: :meth:`get_seq_length` and
    :meth:`crop` (``n <= 0`` removes ``-n`` tokens).
    """

    def __init__(self, layers: int, heads: int, capacity: int, head_dim: int, dtype: Any, device: Any,
                 initial: int | None = None):
        import torch

        self.capacity = int(capacity)
        first = self.capacity if initial is None else max(1, min(int(initial), self.capacity))
        self.k = torch.zeros(layers, heads, first, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def ensure(self, end: int) -> None:
        """Room for ``end`` tokens (the storage doubles, up to :attr:`capacity`)."""
        have = self.k.shape[2]
        if end <= have:
            return
        import torch

        size = min(self.capacity, max(end, 2 * have))
        k = torch.zeros(*self.k.shape[:2], size, self.k.shape[3], dtype=self.k.dtype, device=self.k.device)
        v = torch.zeros_like(k)
        k[:, :, :have] = self.k
        v[:, :, :have] = self.v
        self.k, self.v = k, v

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
        and their own ancestors only (:mod:`specgym.envs.engines.live.tree`). Keys/values still go to the next
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


class LeanLlama:
    """Cached forward of a loaded Llama-family causal LM (``llama``, ``qwen2``, ``mistral``; eval mode) over a
    :class:`KVCache` holding the key/value heads (grouped-query attention)."""

    #: Tokens of cache allocated up front (it grows on demand).
    INITIAL_CACHE = 512

    def __init__(self, model: Any):
        cfg = model.config
        inner = model.model
        self.rotary = inner.rotary_emb
        self.layers = list(inner.layers)
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm
        self.lm_head = model.lm_head
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.capacity = int(cfg.max_position_embeddings)
        self.scale = self.head_dim ** -0.5
        self.eps = [float(layer.input_layernorm.variance_epsilon) for layer in self.layers]
        self.windows = _windows(cfg, len(self.layers))
        self._cos: Any = None
        self._sin: Any = None

    def new_cache(self) -> KVCache:
        """An empty cache for one sequence (room grows up to ``max_position_embeddings`` tokens)."""
        return KVCache(len(self.layers), self.kv_heads, self.capacity, self.head_dim, self.embed.dtype,
                       self.embed.device, initial=min(self.capacity, self.INITIAL_CACHE))

    def _tables(self, end: int) -> tuple[Any, Any]:
        """The rotary cos/sin tables ``(positions, head_dim)`` for positions ``0 .. end - 1`` at least."""
        import torch

        if self._cos is None or self._cos.shape[0] < end or self._cos.dtype != self.embed.dtype \
                or self._cos.device != self.embed.device:
            size = min(self.capacity, max(end, 2 * (0 if self._cos is None else self._cos.shape[0]), 256))
            pos = torch.arange(size, device=self.embed.device)[None]
            probe = torch.zeros(1, dtype=self.embed.dtype, device=self.embed.device)
            cos, sin = self.rotary(probe, pos)
            half = cos.shape[-1] // 2
            # rotate_half(x) * sin == roll(x, half) * signed_sin with the first half of sin negated
            self._cos, self._sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
        return self._cos, self._sin

    def __call__(self, ids: list[int], cache: KVCache, hidden: bool = False, positions: list[int] | None = None,
                 mask: Any = None) -> Any:
        """As :meth:`LeanGPT2.__call__`: logits ``(len(ids), V)`` (with ``hidden``, also the last hidden state after
        the final norm); ``positions`` and ``mask`` replace the causal defaults (tree attention)."""
        import torch
        import torch.nn.functional as F

        start, n = cache.length, len(ids)
        end = start + n
        if end > self.capacity:
            raise ValueError(f"sequence of {end} tokens exceeds the model's context of {self.capacity}")
        if positions is not None and max(positions) >= self.capacity:
            raise ValueError(f"position {max(positions)} exceeds the model's context of {self.capacity}")
        cache.ensure(end)
        dev = self.embed.device
        cos_t, sin_t = self._tables(end if positions is None else max(end, max(positions) + 1))
        if positions is None:
            cos, sin = cos_t[start:end], sin_t[start:end]
        else:
            idx = torch.tensor(positions, device=dev)
            cos, sin = cos_t[idx], sin_t[idx]
        x = self.embed[torch.tensor(ids, device=dev)]
        if mask is None and n > 1:  # query i (position start + i) sees keys 0 .. start + i
            mask = torch.ones(n, end, dtype=torch.bool, device=dev).tril(diagonal=start)
        masks = {w: _window_mask(mask, w, start, n, positions, dev) for w in set(self.windows)}
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        half = hd // 2
        for li, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = _rms(x, layer.input_layernorm.weight, self.eps[li])
            q = attn.q_proj(h).view(n, H, hd).transpose(0, 1)
            k = attn.k_proj(h).view(n, KV, hd).transpose(0, 1)
            v = attn.v_proj(h).view(n, KV, hd).transpose(0, 1)
            q = q * cos + q.roll(half, -1) * sin
            k = k * cos + k.roll(half, -1) * sin
            cache.k[li, :, start:end] = k
            cache.v[li, :, start:end] = v
            w = self.windows[li]
            m = masks[w]
            lo = 0
            if w is not None and m is None and end > w:  # one causal row: only the window's keys
                lo = end - w
            att = F.scaled_dot_product_attention(q[None], cache.k[li, :, lo:end][None], cache.v[li, :, lo:end][None],
                                                 attn_mask=m, scale=self.scale, enable_gqa=KV != H)[0]
            x = x + attn.o_proj(att.transpose(0, 1).reshape(n, H * hd))
            h = _rms(x, layer.post_attention_layernorm.weight, self.eps[li])
            x = x + mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))
        cache.length = end
        h = _rms(x, self.norm.weight, float(self.norm.variance_epsilon))
        return (self.lm_head(h), h) if hidden else self.lm_head(h)


def _rms(x: Any, weight: Any, eps: float) -> Any:
    """transformers' ``LlamaRMSNorm``: normalised in float32, scaled by the weight in the input's dtype (float32:
    torch's fused ``rms_norm``, the same arithmetic up to float rounding)."""
    import torch

    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _windows(cfg: Any, layers: int) -> list[int | None]:
    """Each layer's attention window (None = full attention): Mistral's ``sliding_window`` on every layer, Qwen2's on
    the layers ``layer_types`` marks ``sliding_attention``, none for Llama."""
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return [None] * layers
    types = getattr(cfg, "layer_types", None)
    if types is None:
        return [int(window)] * layers if cfg.model_type == "mistral" else [None] * layers
    return [int(window) if t == "sliding_attention" else None for t in types[:layers]]


def _window_mask(mask: Any, window: int | None, start: int, n: int, positions: list[int] | None, dev: Any) -> Any:
    """``mask`` further limited to keys within ``window`` positions of each query (a key at position ``j`` is seen
    from position ``i`` iff ``i - j < window``, transformers' sliding-window rule); None where nothing is masked."""
    if window is None or (mask is None and n == 1):
        return mask  # one causal row: the caller slices the window's keys
    import torch

    end = start + n
    qpos = torch.arange(start, end, device=dev) if positions is None else torch.tensor(positions, device=dev)
    kpos = torch.cat([torch.arange(start, device=dev), qpos])
    near = (qpos[:, None] - kpos[None, :]) < window
    return near if mask is None else mask & near


_LLAMA_FAMILY = ("llama", "qwen2", "mistral")


def lean_runner(model: Any) -> LeanGPT2 | LeanLlama | None:
    """A lean runner for a GPT-2 or Llama-family model whose forward it reproduces; ``None`` for any other model."""
    cfg = getattr(model, "config", None)
    if cfg is not None and getattr(cfg, "model_type", None) in _LLAMA_FAMILY:
        return _llama_runner(model, cfg)
    if cfg is None or getattr(cfg, "model_type", None) != "gpt2" or not hasattr(model, "transformer"):
        return None
    if (getattr(cfg, "add_cross_attention", False) or not getattr(cfg, "scale_attn_weights", True)
            or getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or getattr(cfg, "reorder_and_upcast_attn", False)
            or cfg.n_embd % cfg.n_head):
        return None
    return LeanGPT2(model)


def _llama_runner(model: Any, cfg: Any) -> LeanLlama | None:
    """A :class:`LeanLlama` where its arithmetic is the model's: the standard layer layout, static RoPE frequencies,
    SiLU gating, the eager/SDPA attention of the standard modules."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return None
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in ("default", "linear", "llama3", "yarn"):  # dynamic / longrope: frequencies follow the length
        return None
    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish") or getattr(cfg, "pretraining_tp", 1) not in (1, None):
        return None
    for layer in layers:
        if not all(hasattr(layer, a) for a in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")):
            return None
        if not all(hasattr(layer.mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return None
    return LeanLlama(model)

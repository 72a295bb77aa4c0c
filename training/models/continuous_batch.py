"""Continuous batching of a Llama-family causal LM on the CPU: a fixed number of slots, a row finished frees its slot
for the next pending row at once.

Hugging Face ``generate`` over a static batch runs until its longest row ends, so rows that stopped early keep their
seats (and their cost) to the end. Here every slot holds one row's keys and values in a cache of its own,
left-aligned (the row's token ``j`` at column ``j``), so a row's positions are its columns and nothing is ever
shifted: a new row is prefilled alone (one forward over its prompt, written into its slot's first columns) and then
joins the batched decode step, which feeds every busy slot one token at its own position: the projections and the
MLP run over all rows at once, the attention row by row over that row's own keys (no masked columns to pay for).
Busy slots are kept at the front (a finished slot takes the last busy one's row), so a step runs over a prefix of
the cache.

The forward is the model's own modules (norms, projections, MLP, head) around an attention written for the slotted
cache, so the arithmetic is transformers' up to the attention kernel's rounding: greedy rows are the rows a one-row
greedy ``generate`` writes (tests/test_batched_generation.py). Sampling draws each row's tokens from a generator of
its own, seeded from ``(seed, row index)``, so a row's text does not depend on the batch, the slots or the order.

Models: those :func:`~specgym.envs.engines.live.lean_forward.lean_runner` reproduces as a Llama-family model
(``llama``, ``qwen2``, ``mistral``: grouped-query attention, sliding windows); :func:`supported` says which, and
:func:`~specgym.training.models.batched.generate_rows` falls back to ``generate`` for the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specgym.envs.engines.live.lean_forward import LeanLlama, lean_runner


class ContextTooShort(ValueError):
    """A row plus its new tokens would not fit the model's context."""


#: Generation-config settings that change ``generate``'s logits, with their neutral values: a model whose
#: ``generation_config`` sets any of them otherwise is left to ``generate`` (single-token ``sequence_bias`` excepted:
#: :func:`token_bias`). ``top_k`` is not among them: the callers sample without top-k.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0), "bad_words_ids": (None, []), "min_length": (None, 0),
    "min_new_tokens": (None, 0), "suppress_tokens": (None, []), "begin_suppress_tokens": (None, []),
    "forced_bos_token_id": (None,), "forced_eos_token_id": (None,), "exponential_decay_length_penalty": (None,),
    "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0), "typical_p": (None, 1.0), "min_p": (None, 0.0),
    "guidance_scale": (None, 1.0), "watermarking_config": (None,), "num_beams": (None, 1),
    "diversity_penalty": (None, 0.0), "token_healing": (None, False), "logits_processor": (None, []),
}


def token_bias(model: Any) -> dict[int, float] | None:
    """The logit bias ``generate`` adds to single tokens (``generation_config.sequence_bias`` of one-token sequences;
    ``{}`` without); ``None`` where the generation config changes the logits in any other way."""
    gc = getattr(model, "generation_config", None)
    if gc is None:
        return {}
    if any(getattr(gc, name, None) not in neutral for name, neutral in _NEUTRAL.items()):
        return None
    bias = getattr(gc, "sequence_bias", None) or {}
    pairs = bias.items() if isinstance(bias, dict) else [(tuple(seq), b) for seq, b in bias]
    out: dict[int, float] = {}
    for seq, b in pairs:
        if len(seq) != 1:
            return None
        out[int(seq[0])] = float(b)  # a later entry for the same token replaces an earlier one, as in transformers
    return out


def supported(model: Any) -> bool:
    """Whether :func:`continuous_generate` runs ``model``: a Llama-family model the lean forward reproduces, whose
    generation config changes the logits by single-token biases at most (:func:`token_bias`)."""
    return isinstance(lean_runner(model), LeanLlama) and token_bias(model) is not None


def row_seed(seed: int, index: int) -> int:
    """The seed of row ``index``'s generator: distinct for distinct ``(seed, index)`` with ``0 <= index < 1000003``
    (and ``0 <= seed < 2**43``)."""
    return (int(seed) * 1_000_003 + int(index)) % (2 ** 63)


class SlotLlama:
    """The cached forward of a Llama-family model over ``slots`` rows of up to ``capacity`` tokens each.

    Attributes:
        k: Keys ``(layers, slots, kv_heads, columns, head_dim)`` (a row's token ``j`` at column ``j``; the columns
            grow on demand, doubling, up to ``capacity``).
        v: Values, the same shape.
        lens: Tokens each slot holds.
    """

    #: Columns allocated up front (zeros: a masked column must hold a finite value, as it is weighted by zero).
    INITIAL = 256

    def __init__(self, model: Any, slots: int, capacity: int):
        import torch

        runner = lean_runner(model)
        if not isinstance(runner, LeanLlama):
            raise ValueError(f"{type(model).__name__}: not a Llama-family model the slotted forward runs")
        self.layers, self.embed, self.norm, self.lm_head = runner.layers, runner.embed, runner.norm, runner.lm_head
        self.vocab = int(self.lm_head.weight.shape[0])
        self.heads, self.kv_heads, self.head_dim = runner.heads, runner.kv_heads, runner.head_dim
        self.windows = runner.windows
        self.scale = runner.scale
        if capacity > runner.capacity:
            raise ContextTooShort(f"{capacity} tokens exceed the model's context of {runner.capacity}")
        dev, dtype = self.embed.device, self.embed.dtype
        self.capacity = capacity
        first = min(capacity, self.INITIAL)
        self.k = torch.zeros(len(self.layers), slots, self.kv_heads, first, self.head_dim, dtype=dtype, device=dev)
        self.v = torch.zeros_like(self.k)
        self.lens = [0] * slots
        cos, sin = runner.rotary(torch.zeros(1, dtype=dtype, device=dev), torch.arange(capacity, device=dev)[None])
        half = self.head_dim // 2
        # rotate_half(x) * sin == roll(x, half) * signed_sin, the first half of sin negated (exact: a sign flip)
        self.cos, self.sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)

    def _rotate(self, x: Any, cos: Any, sin: Any) -> Any:
        return x * cos + x.roll(self.head_dim // 2, -1) * sin

    def _head(self, x: Any) -> Any:
        return self.lm_head(self.norm(x))

    def _ensure(self, end: int) -> None:
        """Room for ``end`` columns (doubling, up to the capacity)."""
        have = self.k.shape[3]
        if end <= have:
            return
        import torch

        size = min(self.capacity, max(end, 2 * have))
        k = self.k.new_zeros(*self.k.shape[:3], size, self.k.shape[4])
        v = torch.zeros_like(k)
        k[:, :, :, :have] = self.k
        v[:, :, :, :have] = self.v
        self.k, self.v = k, v

    def prefill(self, slot: int, ids: Sequence[int]) -> Any:
        """Write row ``ids``' keys and values into ``slot`` (from column 0); returns the logits ``(vocab,)`` of the
        token after its last one."""
        import torch
        import torch.nn.functional as F

        n = len(ids)
        if n > self.capacity:
            raise ContextTooShort(f"a row of {n} tokens exceeds the slots' capacity of {self.capacity}")
        self._ensure(n)
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        dev = self.embed.device
        x = self.embed[torch.tensor(list(ids), device=dev)]
        cos, sin = self.cos[:n], self.sin[:n]
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        pos = torch.arange(n, device=dev)
        masks = {w: None if w is None else causal & ((pos[:, None] - pos[None, :]) < w) for w in set(self.windows)}
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = self._rotate(attn.q_proj(h).view(n, H, hd).transpose(0, 1), cos, sin)
            k = self._rotate(attn.k_proj(h).view(n, KV, hd).transpose(0, 1), cos, sin)
            v = attn.v_proj(h).view(n, KV, hd).transpose(0, 1)
            self.k[li, slot, :, :n] = k
            self.v[li, slot, :, :n] = v
            m = masks[self.windows[li]]
            att = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=m, is_causal=m is None,
                                                 scale=self.scale, enable_gqa=KV != H)[0]
            x = x + attn.o_proj(att.transpose(0, 1).reshape(n, H * hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.lens[slot] = n
        return self._head(x[-1:])[0]

    def decode(self, tokens: Sequence[int]) -> Any:
        """Feed slot ``b`` (``b < len(tokens)``) its next token ``tokens[b]`` at its own position; returns the logits
        ``(len(tokens), vocab)``."""
        import torch
        import torch.nn.functional as F

        n = len(tokens)
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        dev = self.embed.device
        pos_list = self.lens[:n]
        pos = torch.tensor(pos_list, device=dev)
        width = max(pos_list) + 1
        if width > self.capacity:
            raise ContextTooShort(f"a row of {width} tokens exceeds the slots' capacity of {self.capacity}")
        self._ensure(width)
        rows = torch.arange(n, device=dev)
        x = self.embed[torch.tensor(list(tokens), device=dev)]
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        # each row attends to its own keys only (a slice per row: no masked columns, so no work on them); a window
        # keeps the keys within w positions of the query (transformers' rule: i - j < w)
        spans = {w: [(0 if w is None else max(0, p + 1 - w), p + 1) for p in pos_list] for w in set(self.windows)}
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = self._rotate(attn.q_proj(h).view(n, H, hd), cos, sin)
            k = self._rotate(attn.k_proj(h).view(n, KV, hd), cos, sin)
            ck, cv = self.k[li], self.v[li]
            ck[rows, :, pos] = k
            cv[rows, :, pos] = attn.v_proj(h).view(n, KV, hd)
            # the query heads of one key/value head side by side: (1, KV, H / KV, hd) against (1, KV, keys, hd)
            qg = q.view(n, KV, H // KV, hd)
            att = torch.cat([F.scaled_dot_product_attention(qg[b:b + 1], ck[b:b + 1, :, lo:hi], cv[b:b + 1, :, lo:hi],
                                                             scale=self.scale)
                             for b, (lo, hi) in enumerate(spans[self.windows[li]])])
            x = x + attn.o_proj(att.reshape(n, H * hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        for b in range(n):
            self.lens[b] += 1
        return self._head(x)

    def move(self, src: int, dst: int) -> None:
        """Slot ``dst`` takes slot ``src``'s row (its keys, values and length)."""
        n = self.lens[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lens[dst] = n


#: Tokens a sampling step looks at first, per row: the nucleus of a trained model's distribution is nearly always
#: among them; the rest of the vocabulary is looked at only when a draw falls there (or the nucleus reaches further).
TOP = 64


def pick(logits: Any, temperature: float, top_p: float, gens: Sequence[Any]) -> list[int]:
    """The next token of each row of ``logits`` ``(n, vocab)``: the argmax at ``temperature`` 0, else a draw from the
    temperature-scaled distribution cut to its nucleus ``top_p`` (no top-k), one uniform from row ``i``'s generator
    ``gens[i]`` mapped through the row's cumulative distribution, tokens in order of probability (so a row's draw is
    its own, whatever the other rows).

    Exact, and cheap where the distribution is peaked: each row's :data:`TOP` most likely tokens and their
    probabilities (over the whole vocabulary's softmax) come first; the other tokens are summed up only for a row
    whose uniform falls past those ``TOP`` tokens' mass (``top_p`` 1) or whose nucleus is wider (``top_p`` < 1).
    """
    import torch

    if temperature <= 0:
        return [int(t) for t in logits.argmax(-1).tolist()]
    x = logits.float() / temperature
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    top, idx = x.topk(min(TOP, x.shape[-1]), dim=-1)  # descending
    probs = (top - lse).exp()
    cum = probs.cumsum(-1)
    if top_p < 1:
        probs = probs * ((cum - probs) < top_p)  # keep while the mass before a token is under top_p
    out = []
    for i, g in enumerate(gens):
        u = float(torch.rand((), generator=g, dtype=torch.float64))
        if top_p < 1 and float(cum[i, -1]) < top_p:  # a nucleus past the top tokens: sort the whole row
            out.append(_draw_sorted(x[i] - lse[i], top_p, u))
        elif top_p < 1 or u < float(cum[i, -1]):
            c = probs[i].double().cumsum(-1)
            out.append(int(idx[i, _search(c, u * float(c[-1]) if top_p < 1 else u)]))
        else:  # past the top tokens' mass: the rest of the vocabulary, in order of token id
            rest = (x[i] - lse[i]).exp()
            rest[idx[i]] = 0.0
            c = rest.double().cumsum(-1)
            mass = float(cum[i, -1])
            out.append(_search(c, (u - mass) / max(1.0 - mass, 1e-300) * float(c[-1])))
    return out


def _search(cum: Any, target: float) -> int:
    """The first index whose cumulative mass exceeds ``target`` (the last one if rounding left none)."""
    import torch

    return int(torch.searchsorted(cum, torch.tensor([target], dtype=cum.dtype), right=True).clamp_(max=len(cum) - 1))


def _draw_sorted(logp: Any, top_p: float, u: float) -> int:
    """A draw from the nucleus ``top_p`` of the log-probabilities ``logp`` with the uniform ``u`` (the whole row
    sorted)."""
    probs, order = logp.exp().sort(descending=True, stable=True)
    probs = probs * ((probs.cumsum(-1) - probs) < top_p)
    c = probs.double().cumsum(-1)
    return int(order[_search(c, u * float(c[-1]))])


def continuous_generate(model: Any, rows: Sequence[Sequence[int]], *, stop_ids: Sequence[int], max_new_tokens: int,
                        temperature: float = 0.0, top_p: float = 1.0, seeds: Sequence[int] | None = None,
                        slots: int = 32, on_batch: Callable[[int, int], None] | None = None) -> list[list[int]]:
    """Continue every row (non-empty token ids) with up to ``max_new_tokens`` tokens, ``slots`` rows at a time;
    returns each row's new tokens (to and with its first stop token), in the order of ``rows``.

    Rows enter in order of length (similar lengths decode side by side: less masked attention). ``on_batch`` is
    called after every step in which rows finished, with ``(rows finished, their new tokens)``.

    Args:
        model: The causal LM (eval mode; :func:`supported`).
        rows: The prompts' token ids, none empty.
        stop_ids: Tokens that end a row (kept as its last token).
        max_new_tokens: Longest continuation.
        temperature: 0 for greedy decoding, else the sampling temperature.
        top_p: Nucleus sampling mass (1 keeps the whole distribution).
        seeds: Row ``i``'s generator seed (sampling only; default ``i``): a row's tokens depend on its prompt and
            seed only, not on the other rows, their order or ``slots``.
        slots: Rows decoded side by side.
        on_batch: Progress: ``(rows finished, their new tokens)``.

    Raises:
        ContextTooShort: The longest row plus ``max_new_tokens`` exceeds the model's context.
        ValueError: A model :func:`supported` refuses.
    """
    import torch

    bias_map = token_bias(model)
    if bias_map is None:
        raise ValueError(f"{type(model).__name__}: its generation config changes the logits beyond token biases")
    slots = max(1, min(slots, len(rows)))
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]), i))[::-1]  # popped from the end: shortest first
    capacity = max(len(r) for r in rows) + max_new_tokens
    eng = SlotLlama(model, slots, capacity)
    stops = set(int(t) for t in stop_ids)
    out: list[list[int]] = [[] for _ in rows]
    seeds = range(len(rows)) if seeds is None else seeds
    gens = [torch.Generator().manual_seed(int(s)) if temperature > 0 else None for s in seeds]
    seat: list[int] = []  # seat[b]: the row slot b holds (busy slots 0 .. len(seat) - 1)
    bias = None
    if bias_map:  # as transformers' SequenceBiasLogitsProcessor: the logits plus a float32 bias vector
        bias = torch.zeros(eng.vocab, dtype=torch.float32, device=eng.embed.device)
        bias[list(bias_map)] = torch.tensor(list(bias_map.values()), dtype=torch.float32, device=eng.embed.device)

    def choose(logits: Any, idx: list[int]) -> list[int]:
        return pick(logits if bias is None else logits + bias, temperature, top_p, [gens[i] for i in idx])

    def done(i: int) -> bool:
        return out[i][-1] in stops or len(out[i]) >= max_new_tokens

    finished, tokens = 0, 0
    with torch.inference_mode():
        while order or seat:
            while order and len(seat) < slots:  # fill the free slots, a prefill each
                i = order.pop()
                out[i].append(choose(eng.prefill(len(seat), rows[i])[None], [i])[0])
                if done(i):
                    finished, tokens = finished + 1, tokens + len(out[i])
                else:
                    seat.append(i)
            if seat:
                new = choose(eng.decode([out[i][-1] for i in seat]), seat)
                for b in reversed(range(len(seat))):  # from the back: a freed slot takes the last busy one's row
                    i = seat[b]
                    out[i].append(new[b])
                    if done(i):
                        finished, tokens = finished + 1, tokens + len(out[i])
                        last = len(seat) - 1
                        if b != last:
                            eng.move(last, b)
                            seat[b] = seat[last]
                        seat.pop()
            if finished and on_batch is not None:
                on_batch(finished, tokens)
                finished, tokens = 0, 0
    return out

"""Function-preserving growth of a trained GPT-2: wider by duplication, deeper by identity blocks.

Training a large target from scratch on one CPU thread takes days; growing a trained small one keeps everything it
has learnt and makes it as expensive (and as capable, once training continues) as the larger shape:

* **width x m** (Net2WiderNet for a pre-LayerNorm transformer): the residual stream ``h`` becomes ``[h, ..., h]``
  (``m`` copies). LayerNorm of the copies equals the copies of the LayerNorm (same mean and variance), every input
  projection is tiled ``W / m`` so each output copy sums the ``m`` input copies, and heads are duplicated, so every
  hidden state is the ``m``-fold copy of the original. The tied LM head would multiply logits by ``m``; the final
  LayerNorm's gain and bias are divided by ``m`` to cancel it.
* **depth**: new blocks whose two output projections (attention and MLP) are zero add nothing to the residual
  stream, so the function is unchanged; their other weights are random so that gradients reach them.

A little noise (``noise`` x the weight's standard deviation) breaks the symmetry between the copies, so continued
training can use the new capacity. With ``noise=0`` the grown model's logits equal the original's up to float
rounding (``tests/test_lmpair.py``).
"""

from __future__ import annotations

from typing import Any

from specgym.errors import SpecgymError


def _tile(w, m: int, dims: tuple[int, ...], scale: float = 1.0):
    """Repeat ``w`` ``m`` times along each of ``dims`` and multiply by ``scale``."""
    reps = [1] * w.dim()
    for d in dims:
        reps[d] = m
    return w.repeat(*reps) * scale


def _tile_qkv(w, m: int, n_embd: int, in_dim: bool):
    """Tile a fused ``c_attn`` weight ``(in, 3 * n_embd)`` (or its bias ``(3 * n_embd,)``) block by block."""
    import torch

    parts = torch.split(w, n_embd, dim=-1)
    if in_dim:
        return torch.cat([_tile(p, m, (0, 1), 1.0 / m) for p in parts], dim=-1)
    return torch.cat([_tile(p, m, (0,)) for p in parts], dim=-1)


def grow_gpt2(model: Any, width_mult: int = 1, n_layer: int | None = None, noise: float = 0.0, seed: int = 0) -> Any:
    """Return a grown copy of a ``GPT2LMHeadModel``.

    Args:
        model: The trained model (tied embeddings, pre-LayerNorm GPT-2).
        width_mult: Width multiplier ``m`` (``n_embd`` and ``n_head`` times ``m``; head size unchanged).
        n_layer: Total depth after growth (>= the model's); new identity blocks are spread evenly between the old.
        noise: Relative standard deviation of the symmetry-breaking noise added to every grown weight.
        seed: Seed of the new blocks' weights and of the noise.

    Returns:
        A new ``GPT2LMHeadModel`` computing the same function (exactly when ``noise == 0``).
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.config
    m = int(width_mult)
    depth = int(n_layer or cfg.n_layer)
    if m < 1:
        raise SpecgymError(f"width multiplier must be >= 1, got {width_mult}")
    if depth < cfg.n_layer:
        raise SpecgymError(f"n_layer {depth} is below the model's {cfg.n_layer}: growth cannot remove blocks")
    if not cfg.tie_word_embeddings:
        raise SpecgymError("growth expects tied input/output embeddings (GPT-2's default)")
    if cfg.n_inner not in (None, 4 * cfg.n_embd):
        raise SpecgymError(f"growth expects n_inner = 4 * n_embd, got {cfg.n_inner}")
    d = cfg.n_embd
    new_cfg = GPT2Config(**{**cfg.to_dict(), "n_embd": d * m, "n_head": cfg.n_head * m, "n_layer": depth})
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    grown = GPT2LMHeadModel(new_cfg).eval()
    old = model.state_dict()
    new: dict[str, torch.Tensor] = {}
    new["transformer.wte.weight"] = _tile(old["transformer.wte.weight"], m, (1,))
    new["transformer.wpe.weight"] = _tile(old["transformer.wpe.weight"], m, (1,))
    new["transformer.ln_f.weight"] = _tile(old["transformer.ln_f.weight"], m, (0,), 1.0 / m)
    new["transformer.ln_f.bias"] = _tile(old["transformer.ln_f.bias"], m, (0,), 1.0 / m)
    # old block b goes to slot placement[b]; the remaining slots are identity blocks
    placement = [round(b * depth / cfg.n_layer) for b in range(cfg.n_layer)]
    for b, slot in enumerate(placement):
        src, dst = f"transformer.h.{b}.", f"transformer.h.{slot}."
        for ln in ("ln_1", "ln_2"):
            new[dst + f"{ln}.weight"] = _tile(old[src + f"{ln}.weight"], m, (0,))
            new[dst + f"{ln}.bias"] = _tile(old[src + f"{ln}.bias"], m, (0,))
        new[dst + "attn.c_attn.weight"] = _tile_qkv(old[src + "attn.c_attn.weight"], m, d, in_dim=True)
        new[dst + "attn.c_attn.bias"] = _tile_qkv(old[src + "attn.c_attn.bias"], m, d, in_dim=False)
        for name in ("attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            new[dst + f"{name}.weight"] = _tile(old[src + f"{name}.weight"], m, (0, 1), 1.0 / m)
            new[dst + f"{name}.bias"] = _tile(old[src + f"{name}.bias"], m, (0,))
    state = grown.state_dict()
    for slot in sorted(set(range(depth)) - set(placement)):
        for name in ("attn.c_proj", "mlp.c_proj"):
            state[f"transformer.h.{slot}.{name}.weight"].zero_()
            state[f"transformer.h.{slot}.{name}.bias"].zero_()
    if noise > 0:
        for _key, w in new.items():
            if w.dim() == 2:
                w.add_(torch.randn(w.shape, generator=gen) * float(w.std()) * noise)
    state.update(new)
    state["lm_head.weight"] = state["transformer.wte.weight"]
    grown.load_state_dict(state)
    grown.tie_weights()
    return grown

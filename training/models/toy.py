"""A tiny RANDOMLY-INITIALISED GPT-2 draft/target pair with a character tokenizer (tests and smoke runs only).

The models are untrained: their outputs are meaningless text. They exist so that the live engine, the recorder,
the profiler and the ``generate()`` integration can be tested in seconds without the shipped trained pair. To give
the draft a realistic acceptance rate, the draft can be made a noisy copy of the target's first layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOY_CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,:=+-*()\n")
TOY_SPECIALS = ["<|endoftext|>", "<|pad|>", "<unk>"]


def toy_tokenizer():
    """A character-level fast tokenizer (vocab ~50): ids 0 = ``<|endoftext|>`` (bos/eos), 1 = ``<|pad|>``."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(TOY_SPECIALS + TOY_CHARS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", unk_token="<unk>", model_max_length=256)


def toy_models(vocab_size: int, seed: int = 0, n_positions: int = 256, target_layers: int = 2,
               width: int = 32, draft_noise: float = 0.3, head_scale: float = 0.6):
    """(draft, target): random GPT-2s; the draft is the target's first layer plus noise (so acceptance is > 0)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    def cfg(layers: int):
        return GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=width, n_layer=layers, n_head=2,
                          bos_token_id=0, eos_token_id=0, pad_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, tie_word_embeddings=False)

    torch.manual_seed(seed)
    target = GPT2LMHeadModel(cfg(target_layers)).eval()
    with torch.no_grad():  # an untied, large output head: peaked distributions whose argmax depends on context
        target.lm_head.weight.normal_(0.0, head_scale)
    draft = GPT2LMHeadModel(cfg(1)).eval()
    sd = {k: v for k, v in target.state_dict().items()
          if not k.startswith("transformer.h.") or k.startswith("transformer.h.0.")}
    draft.load_state_dict(sd, strict=False)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(draft_noise * p.std() * torch.randn_like(p))
    return draft, target


def save_toy_pair(folder: str | Path, seed: int = 0, **kw) -> tuple[Path, Path]:
    """Write a toy pair in Hugging Face format to ``folder/{draft,target}``; returns both paths."""
    tok = toy_tokenizer()
    draft, target = toy_models(len(tok), seed=seed, **kw)
    return save_pair(folder, tok, draft, target)


def save_pair(folder: str | Path, tok: Any, draft: Any, target: Any) -> tuple[Path, Path]:
    """Write a draft and a target with their shared tokenizer to ``folder/{draft,target}`` (Hugging Face format);
    returns both paths."""
    out = []
    for name, model in (("draft", draft), ("target", target)):
        path = Path(folder) / name
        model.save_pretrained(str(path))
        tok.save_pretrained(str(path))
        out.append(path)
    return out[0], out[1]

"""Tiny RANDOMLY-INITIALISED draft/target pairs of six Hugging Face architectures, built in seconds (tests only).

Each pair: a 4-layer target with a large untied output head (peaked distributions whose argmax depends on the
context) and a 2-layer draft made of the target's embeddings, first two layers and head plus noise (so acceptance is
well above zero and below one), both saved with :func:`save_pretrained` next to a character tokenizer. Llama and
Mistral pairs get a tokenizer that adds ``<s>`` in front of every encoding, as their real tokenizers do; the others
add nothing (GPT-2 style). The models are untrained: their text is meaningless.

``build_pair(arch, folder)`` writes one pair; ``pair_paths(arch)`` returns a session-cached one (see
``tests/test_hf_pairs.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specgym.training.models.toy import save_pair

ARCHS = ("gpt2", "llama", "qwen2", "mistral", "gpt_neox", "phi")
#: Architectures whose real tokenizers put a BOS token in front of every prompt.
BOS_ARCHS = ("llama", "mistral")
WIDTH, HEADS, KV_HEADS, CONTEXT = 32, 4, 2, 256
TARGET_LAYERS, DRAFT_LAYERS = 4, 2
#: Mistral's attention window in the tiny pairs: short, so tests decode past it.
SLIDING_WINDOW = 24


def tokenizer(bos: bool) -> Any:
    """The toy character tokenizer (ids 0 ``<|endoftext|>``, 1 ``<|pad|>``, 2 ``<unk>``); with ``bos``, a ``<s>``
    token (the last id) is prepended to every encoding by default."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from specgym.training.models.toy import toy_tokenizer

    tok = toy_tokenizer()
    if not bos:
        return tok
    backend = tok.backend_tokenizer
    backend.add_special_tokens(["<s>"])
    bos_id = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="<|endoftext|>",
                                   pad_token="<|pad|>", unk_token="<unk>", model_max_length=CONTEXT)


def config(arch: str, layers: int, vocab: int) -> Any:
    """A small config of ``arch`` with ``layers`` layers (dropout off, untied head, eos 0, pad 1)."""
    import transformers as tf

    common: dict[str, Any] = dict(vocab_size=vocab, num_hidden_layers=layers, num_attention_heads=HEADS,
                                  hidden_size=WIDTH, intermediate_size=2 * WIDTH, max_position_embeddings=CONTEXT,
                                  eos_token_id=0, pad_token_id=1, tie_word_embeddings=False)
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=vocab, n_positions=CONTEXT, n_embd=WIDTH, n_layer=layers, n_head=HEADS,
                             bos_token_id=0, eos_token_id=0, pad_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0,
                             attn_pdrop=0.0, tie_word_embeddings=False)
    if arch == "llama":
        return tf.LlamaConfig(**common, num_key_value_heads=KV_HEADS, bos_token_id=vocab - 1)
    if arch == "qwen2":
        return tf.Qwen2Config(**common, num_key_value_heads=KV_HEADS, bos_token_id=0)
    if arch == "mistral":
        return tf.MistralConfig(**common, num_key_value_heads=KV_HEADS, bos_token_id=vocab - 1,
                                sliding_window=SLIDING_WINDOW)
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(**common, bos_token_id=0, attention_dropout=0.0, hidden_dropout=0.0)
    if arch == "phi":
        return tf.PhiConfig(**common, num_key_value_heads=HEADS, bos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                            attention_dropout=0.0)
    raise ValueError(f"unknown architecture {arch!r}; one of {ARCHS}")


def models(arch: str, vocab: int, seed: int = 0, draft_noise: float = 0.3, head_scale: float = 0.6,
           target_vocab: int | None = None) -> tuple[Any, Any]:
    """(draft, target) of ``arch``; the draft is the target's first layers plus noise. ``target_vocab`` > ``vocab``
    pads the target's embedding rows (same tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    target = AutoModelForCausalLM.from_config(config(arch, TARGET_LAYERS, target_vocab or vocab)).eval()
    with torch.no_grad():
        target.get_output_embeddings().weight.normal_(0.0, head_scale)
        if target_vocab:  # padding rows past the tokenizer score nothing (zero logits), as untrained rows do
            target.get_output_embeddings().weight[vocab:] = 0.0
    draft = AutoModelForCausalLM.from_config(config(arch, DRAFT_LAYERS, vocab)).eval()
    keep = {f".{i}." for i in range(DRAFT_LAYERS)}
    dsd = draft.state_dict()
    sd = {}
    for k, v in target.state_dict().items():
        if k not in dsd:
            continue
        if ".h." in k or ".layers." in k:
            if not any(f"{s}" in k for s in keep):
                continue
        sd[k] = v[: dsd[k].shape[0]] if v.shape != dsd[k].shape else v
    draft.load_state_dict(sd, strict=False)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(draft_noise * p.std() * torch.randn_like(p))
    return draft, target


def build_pair(arch: str, folder: str | Path, seed: int = 0, target_vocab: int | None = None) -> tuple[Path, Path]:
    """Write the pair of ``arch`` to ``folder/{draft,target}``; returns both paths."""
    tok = tokenizer(arch in BOS_ARCHS)
    draft, target = models(arch, len(tok), seed=seed, target_vocab=target_vocab)
    return save_pair(folder, tok, draft, target)


_CACHE: dict[tuple, tuple[Path, Path]] = {}


def cached_pair(arch: str, tmp_path_factory: Any, **kw: Any) -> tuple[Path, Path]:
    """The pair of ``arch`` built once per test session (``tmp_path_factory``: pytest's session fixture)."""
    key = (arch, tuple(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = build_pair(arch, tmp_path_factory.mktemp(f"pair-{arch}"), **kw)
    return _CACHE[key]

"""The pairs' shared tokenizer: byte-level BPE (vocabulary 4096) and the tokenised training stream."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from specgym.training.lm_pair.corpus import CATEGORIES, EOT, PAD, log, read_jsonl


def train_tokenizer(work: Path, vocab_size: int = 4096, sample_bytes: int = 12_000_000) -> Path:
    """Train a byte-level BPE on a sample of the training documents and save it as a HF fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    docs = read_jsonl(work / "train_docs.jsonl")
    rng = random.Random(0)
    rng.shuffle(docs)
    texts, total = [], 0
    for d in docs:
        texts.append(d["text"])
        total += len(d["text"])
        if total > sample_bytes:
            break
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT, PAD])
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=EOT, eos_token=EOT, pad_token=PAD,
                                   unk_token=None, model_max_length=512)
    out = work / "tokenizer"
    fast.save_pretrained(str(out))
    log.info("tokenizer: vocab %d trained on %d bytes -> %s", len(fast), total, out)
    return out


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def tokenize_corpus(work: Path) -> dict:
    """Encode the training documents into one shuffled uint16 stream and the held-out eval sets per category."""
    tok = load_tokenizer(work / "tokenizer")
    eot = tok.convert_tokens_to_ids(EOT)
    docs = read_jsonl(work / "train_docs.jsonl")
    random.Random(1).shuffle(docs)
    ids: list[np.ndarray] = []
    counts = {c: 0 for c in CATEGORIES}
    batch = 256
    for s in range(0, len(docs), batch):
        chunk = docs[s : s + batch]
        enc = tok([d["text"] for d in chunk], add_special_tokens=False)["input_ids"]
        for d, e in zip(chunk, enc):
            ids.append(np.asarray([eot] + e, dtype=np.uint16))
            counts[d["category"]] += len(e) + 1
    stream = np.concatenate(ids)
    np.save(work / "train_ids.npy", stream)
    held = read_jsonl(work / "heldout.jsonl")
    for cat in CATEGORIES:
        enc = tok([d["text"] for d in held if d["category"] == cat], add_special_tokens=False)["input_ids"]
        arr = np.concatenate([np.asarray([eot] + e, dtype=np.uint16) for e in enc])
        np.save(work / f"heldout_{cat}.npy", arr)
    stats = {"train_tokens": int(stream.size), "tokens_by_category": counts}
    (work / "token_stats.json").write_text(json.dumps(stats, indent=2))
    log.info("tokens: %s", json.dumps(stats))
    return stats

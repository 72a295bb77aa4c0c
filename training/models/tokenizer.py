"""The pairs' shared tokenizer: byte-level BPE (vocabulary 4096), the tokenised training stream and the held-out
evaluation prompts (cut to a token budget)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from specgym.training.models.corpus import CATEGORIES, EOT, PAD, log, read_jsonl


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


def heldout_prompts(work: Path, n_per_category: int = 200, seed: int = 0, max_prompt_tokens: int = 96,
                    id_prefix: str = "") -> list[dict]:
    """Prompts from the held-out documents only, ``n_per_category`` of each of code, prose and math.

    ``seed`` picks the windows (pairs use different seeds); ids are ``<id_prefix><category>-<nnnn>``.

    code: a window of 4-12 consecutive lines of a held-out stdlib file (starting at a line that opens a
    statement); prose: 1-3 sentences from a held-out help topic; math: one or two solved held-out problems
    followed by a new ``Question: ...\nAnswer:``. Prompts are cut to ``max_prompt_tokens`` tokens.
    """
    tok = load_tokenizer(work / "tokenizer")
    held = read_jsonl(work / "heldout.jsonl")
    rng = random.Random(seed)
    by_cat = {c: [d for d in held if d["category"] == c] for c in CATEGORIES}
    out: list[dict] = []

    def clip(text: str) -> str:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return tok.decode(ids[:max_prompt_tokens]) if len(ids) > max_prompt_tokens else text

    for cat in CATEGORIES:
        made = 0
        seen: set[str] = set()
        tries = 0
        while made < n_per_category and tries < n_per_category * 50:
            tries += 1
            doc = rng.choice(by_cat[cat])
            if cat == "code":
                lines = doc["text"].split("\n")
                starts = [i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#")]
                if len(starts) < 10:
                    continue
                i = rng.choice(starts[:-4])
                text = "\n".join(lines[i : i + rng.randint(4, 12)]) + "\n"
            elif cat == "prose":
                sents = [x.strip() for x in doc["text"].replace("\n", " ").split(". ") if len(x.strip()) > 20]
                if len(sents) < 2:
                    continue
                i = rng.randrange(len(sents) - 1)
                text = ". ".join(sents[i : i + rng.randint(1, 3)]) + "."
                text = " ".join(text.split()) + " "
            else:
                probs = doc["text"].strip().split("\n\n")
                if len(probs) < 2:
                    continue
                i = rng.randrange(len(probs) - 1)
                solved = probs[max(0, i - rng.randint(0, 1)) : i + 1]
                question = probs[i + 1].split("\nAnswer:")[0]
                text = "\n\n".join(solved + [question]) + "\nAnswer:"
            text = clip(text)
            if len(text.strip()) < 20 or text in seen:
                continue
            seen.add(text)
            out.append({"id": f"{id_prefix}{cat}-{made:04d}", "category": cat, "prompt": text, "source": doc["source"]})
            made += 1
    return out

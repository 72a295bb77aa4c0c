"""Train a small real draft/target model pair from scratch on CPU (``specgym train-lm-pair``).

No model hub is reachable on the project's machines, so specgym ships its own pair. Everything is built from what
every Python installation has:

* code: the standard library's ``.py`` sources (a deterministic ~3% of files are held out for prompts/eval);
* English prose: ``pydoc_data/topics.py`` (the help topics; ~10% of topics held out);
* math: generated arithmetic word problems (training and held-out sets come from different seeds).

Stages (each resumable, artifacts under ``--work-dir``, default ``work_tmp/lm_pair``):

1. ``corpus``: write ``train_docs.jsonl`` and ``heldout.jsonl`` ({"category", "text"} per line).
2. ``tokenizer``: byte-level BPE (``tokenizers``) with ``<|endoftext|>`` (bos/eos, id 0) and ``<|pad|>`` (id 1).
3. ``tokens``: the training stream as uint16 ids (``train_ids.npy``) and held-out eval ids per category.
4. ``target``: a GPT-2-style target trained with a wall-clock budget; checkpoints every few minutes, resumes.
5. ``draft``: a much cheaper GPT-2 draft distilled from the target's logits (KL at T=1 plus cross-entropy).
6. ``export``: both models in Hugging Face format (fp16 safetensors, config with bos/eos/pad ids, tokenizer) under
   ``data/models/<name>/{target,draft}``; they load with ``from_pretrained(path)`` and ``HF_HUB_OFFLINE=1``
   (``dtype=torch.float32`` casts the fp16 weights back).

Training uses bf16 autocast on CPU (about 1.5x faster than fp32 here) and ``torch.set_num_threads(threads)``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import random
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from specgym.errors import SpecgymError

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WORK = REPO / "work_tmp" / "lm_pair"
EOT = "<|endoftext|>"
PAD = "<|pad|>"
CATEGORIES = ("code", "prose", "math")

log = logging.getLogger("specgym.lm_pair")


# ----------------------------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------------------------


def _held_out(key: str, percent: int) -> bool:
    """Deterministic split by a hash of ``key`` (stable across machines and Python versions)."""
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % 100 < percent


def stdlib_dir() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def iter_code_files(root: Path) -> Iterator[tuple[str, str]]:
    """Yield ``(relative path, source)`` of the standard library's ``.py`` files (no site-packages, no huge files)."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")) or rel == "pydoc_data/topics.py":
            continue
        try:
            if path.stat().st_size > 400_000:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            yield rel, text


def load_topics(root: Path) -> dict[str, str]:
    """The pydoc help topics (English prose about Python) without importing the module."""
    path = root / "pydoc_data" / "topics.py"
    ns: dict = {}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), ns)  # a plain dict literal
    return dict(ns["topics"])


_NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Mia", "Ravi", "Eva", "Ken", "Zoe", "Ivan", "Nora", "Paul", "Lena"]
_ITEMS = ["apples", "books", "coins", "pencils", "marbles", "stickers", "cards", "cookies", "stamps", "shells"]


def math_problem(rng: random.Random) -> str:
    """One arithmetic word problem with a worked answer (the math category)."""
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 12)
    n1, n2 = rng.sample(_NAMES, 2)
    it = rng.choice(_ITEMS)
    kind = rng.randrange(6)
    if kind == 0:
        q = f"{n1} has {a} {it}. {n1} buys {b} more. How many {it} does {n1} have now?"
        s = f"{a} + {b} = {a + b}. The answer is {a + b}."
    elif kind == 1:
        a, b = max(a, b), min(a, b)
        q = f"{n1} had {a} {it} and gave {b} of them to {n2}. How many {it} does {n1} have left?"
        s = f"{a} - {b} = {a - b}. The answer is {a - b}."
    elif kind == 2:
        q = f"There are {c} boxes with {a} {it} in each box. How many {it} are there in total?"
        s = f"{c} * {a} = {c * a}. The answer is {c * a}."
    elif kind == 3:
        q = f"{n1} shares {a * c} {it} equally among {c} friends. How many {it} does each friend get?"
        s = f"{a * c} / {c} = {a}. The answer is {a}."
    elif kind == 4:
        q = (f"{n1} has {a} {it}. {n2} has {b} more {it} than {n1}. "
             f"How many {it} do they have together?")
        s = f"{n2} has {a} + {b} = {a + b}. Together: {a} + {a + b} = {2 * a + b}. The answer is {2 * a + b}."
    else:
        q = f"{n1} buys {c} packs of {it}. Each pack costs {a} dollars. {n1} pays with {c * a + b} dollars. How much change does {n1} get?"
        s = f"The packs cost {c} * {a} = {c * a} dollars. The change is {c * a + b} - {c * a} = {b}. The answer is {b}."
    return f"Question: {q}\nAnswer: {s}"


def math_document(rng: random.Random, n: int) -> str:
    """A document of ``n`` word problems separated by blank lines."""
    return "\n\n".join(math_problem(rng) for _ in range(n)) + "\n"


def build_corpus(work: Path, math_docs: int = 6000, prose_repeat: int = 3) -> dict:
    """Write ``train_docs.jsonl`` and ``heldout.jsonl``; return corpus statistics.

    Held out: code files with ``sha1(path) % 100 < 3``, topics with ``sha1(key) % 100 < 10``, math documents from a
    separate seed. Prose is repeated ``prose_repeat`` times in training (it is small next to the code).
    """
    root = stdlib_dir()
    train: list[dict] = []
    held: list[dict] = []
    stats = {"stdlib": str(root), "code_files_train": 0, "code_files_heldout": 0, "topics_train": 0,
             "topics_heldout": 0, "math_docs_train": math_docs, "bytes": {}}
    for rel, text in iter_code_files(root):
        rec = {"category": "code", "source": rel, "text": text}
        if _held_out(rel, 3):
            held.append(rec)
            stats["code_files_heldout"] += 1
        else:
            train.append(rec)
            stats["code_files_train"] += 1
    for key, text in sorted(load_topics(root).items()):
        rec = {"category": "prose", "source": f"pydoc_data/topics.py:{key}", "text": text}
        if _held_out(key, 10):
            held.append(rec)
            stats["topics_heldout"] += 1
        else:
            train.extend([rec] * prose_repeat)
            stats["topics_train"] += 1
    rng = random.Random(1234)
    for i in range(math_docs):
        train.append({"category": "math", "source": f"math-train-{i}", "text": math_document(rng, rng.randint(3, 8))})
    rng_h = random.Random(98765)
    for i in range(400):
        held.append({"category": "math", "source": f"math-heldout-{i}", "text": math_document(rng_h, rng_h.randint(3, 8))})
    for cat in CATEGORIES:
        stats["bytes"][cat] = sum(len(r["text"]) for r in train if r["category"] == cat)
    work.mkdir(parents=True, exist_ok=True)
    for name, recs in (("train_docs.jsonl", train), ("heldout.jsonl", held)):
        with open(work / name, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    (work / "corpus_stats.json").write_text(json.dumps(stats, indent=2))
    log.info("corpus: %s", json.dumps(stats))
    return stats


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def heldout_prompts(work: Path, n_per_category: int = 200, seed: int = 0, max_prompt_tokens: int = 96) -> list[dict]:
    """Prompts from the held-out documents only, ``n_per_category`` of each of code, prose and math.

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
            out.append({"id": f"{cat}-{made:04d}", "category": cat, "prompt": text, "source": doc["source"]})
            made += 1
    return out


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class ModelSpec:
    """Size of one GPT-2-style model."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int = 512


def make_config(spec: ModelSpec, vocab_size: int, bos: int = 0, eos: int = 0, pad: int = 1):
    """A GPT2Config with explicit bos/eos/pad ids (without them transformers falls back to 50256)."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=vocab_size, n_positions=spec.n_positions, n_embd=spec.n_embd, n_layer=spec.n_layer,
                      n_head=spec.n_head, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)


def _batch(stream: np.ndarray, rng: np.random.Generator, batch: int, block: int):
    import torch

    starts = rng.integers(0, stream.size - block - 1, size=batch)
    x = np.stack([stream[s : s + block + 1].astype(np.int64) for s in starts])
    return torch.from_numpy(x)


def _lr(frac: float, peak: float, warm_frac: float = 0.03, floor: float = 0.1) -> float:
    """Warm-up then cosine decay to ``floor * peak``, driven by the fraction of the wall-clock budget used."""
    if frac < warm_frac:
        return peak * max(frac / warm_frac, 0.02)
    p = min(1.0, (frac - warm_frac) / (1 - warm_frac))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def heldout_loss(model, work: Path, block: int = 512, max_tokens: int = 40_000) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) on the held-out sets, per category."""
    import torch

    model.eval()
    out = {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for cat in CATEGORIES:
            arr = np.load(work / f"heldout_{cat}.npy")[:max_tokens].astype(np.int64)
            n = (arr.size - 1) // block
            losses = []
            for i in range(n):
                x = torch.from_numpy(arr[i * block : (i + 1) * block + 1])[None]
                logits = model(x[:, :-1]).logits[0].float()
                losses.append(float(torch.nn.functional.cross_entropy(logits, x[0, 1:])))
            out[cat] = float(np.mean(losses)) if losses else float("nan")
    model.train()
    return out


def _save_ckpt(model, opt, state: dict, path: Path) -> None:
    import torch

    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp))
    torch.save(opt.state_dict(), tmp / "optim.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    if path.exists():
        old = path.with_name(path.name + ".old")
        if old.exists():
            import shutil

            shutil.rmtree(old)
        path.rename(old)
    tmp.rename(path)


def train_model(work: Path, role: str, spec: ModelSpec, budget_s: float, batch: int, block: int, peak_lr: float,
                teacher_path: Path | None = None, distill_alpha: float = 0.7, ckpt_every_s: float = 300.0,
                threads: int = 1) -> dict:
    """Train ``role`` ("target" or "draft") for ``budget_s`` wall-clock seconds (resumable from its checkpoint).

    With ``teacher_path`` the loss is ``alpha * KL(teacher || student) + (1 - alpha) * CE`` at temperature 1:
    the draft learns the target's full next-token distributions, which is what speculative acceptance rewards.
    """
    import torch
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(threads)
    tok = load_tokenizer(work / "tokenizer")
    stream = np.load(work / "train_ids.npy")
    ckpt = work / f"{role}_ckpt"
    if ckpt.exists():
        model = GPT2LMHeadModel.from_pretrained(str(ckpt), dtype=torch.float32)
        state = json.loads((ckpt / "state.json").read_text())
        log.info("%s: resuming at step %d (%.0f s used)", role, state["step"], state["elapsed_s"])
    else:
        cfg = make_config(spec, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
        torch.manual_seed(0 if role == "target" else 1)
        model = GPT2LMHeadModel(cfg)
        state = {"step": 0, "elapsed_s": 0.0, "tokens": 0, "spec": asdict(spec), "budget_s": budget_s,
                 "batch": batch, "block": block, "peak_lr": peak_lr, "teacher": str(teacher_path or "")}
    state["budget_s"] = budget_s
    teacher = None
    if teacher_path is not None:
        teacher = GPT2LMHeadModel.from_pretrained(str(teacher_path), dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())
    log.info("%s: %s, %.2fM parameters, budget %.0f s", role, spec, n_params / 1e6, budget_s)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    if (ckpt / "optim.pt").exists():
        opt.load_state_dict(torch.load(ckpt / "optim.pt"))
    rng = np.random.default_rng(state["step"] + (0 if role == "target" else 7))
    model.train()
    t0 = time.time() - state["elapsed_s"]
    last_ckpt = time.time()
    last_log = time.time()
    while True:
        elapsed = time.time() - t0
        if elapsed >= budget_s:
            break
        lr = _lr(elapsed / budget_s, peak_lr)
        for g in opt.param_groups:
            g["lr"] = lr
        xb = _batch(stream, rng, batch, block)
        x, y = xb[:, :-1], xb[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x).logits.float()
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
            if teacher is not None:
                with torch.no_grad():
                    t_logits = teacher(x).logits.float()
                kl = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(t_logits, -1),
                                                log_target=True, reduction="batchmean") / x.size(1)
                loss = distill_alpha * kl + (1 - distill_alpha) * ce
            else:
                loss = ce
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["tokens"] += int(x.numel())
        if time.time() - last_log > 60:
            last_log = time.time()
            el = time.time() - t0
            log.info("%s step %d  %.0f/%.0f s  lr %.2e  ce %.3f  loss %.3f  %.0f tok/s(avg)", role, state["step"], el,
                     budget_s, lr, float(ce), float(loss), state["tokens"] / max(el, 1e-9))
        if time.time() - last_ckpt > ckpt_every_s:
            state["elapsed_s"] = time.time() - t0
            _save_ckpt(model, opt, state, ckpt)
            last_ckpt = time.time()
    state["elapsed_s"] = time.time() - t0
    state["heldout_loss"] = heldout_loss(model, work)
    state["n_params"] = n_params
    _save_ckpt(model, opt, state, ckpt)
    log.info("%s done: %s", role, json.dumps({k: state[k] for k in ("step", "tokens", "elapsed_s", "heldout_loss")}))
    return state


def export_pair(work: Path, name: str, draft_role: str = "draft", out_root: Path | None = None) -> Path:
    """Write both models (fp16 safetensors + config + tokenizer) to ``data/models/<name>/{target,draft}``."""
    import shutil

    import torch
    from transformers import GPT2LMHeadModel

    from specgym.paths import MODELS_DIR

    out = (out_root or MODELS_DIR) / name
    tok = load_tokenizer(work / "tokenizer")
    for role, src in (("target", "target"), ("draft", draft_role)):
        model = GPT2LMHeadModel.from_pretrained(str(work / f"{src}_ckpt"), dtype=torch.float32)
        model = model.to(torch.float16)
        dest = out / role
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        model.save_pretrained(str(dest), safe_serialization=True)
        tok.save_pretrained(str(dest))
        # Weights are stored in fp16 to keep the repository small; the config says float32 so that
        # from_pretrained(path) (dtype "auto") casts them back: fp16 matmuls are slow on CPU.
        cfg_path = dest / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["dtype"] = "float32"
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        st = json.loads((work / f"{src}_ckpt" / "state.json").read_text())
        (dest / "training_state.json").write_text(json.dumps(
            {k: st.get(k) for k in ("step", "tokens", "elapsed_s", "heldout_loss", "n_params", "spec", "batch",
                                    "block", "peak_lr", "teacher")}, indent=2))
    log.info("exported pair to %s", out)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Model card
# ----------------------------------------------------------------------------------------------------------------


def _workload_summary(path: Path) -> dict | None:
    """Mean acceptance and greedy-loop share per category of a recorded workload (None if absent)."""
    if not path.exists():
        return None
    from specgym.envs.trace_format import load_workload

    wl = load_workload(path)
    out = {"requests": wl.n_requests, "positions": wl.n_positions, "by_category": {}}
    loops = wl.extra.get("loop_share_by_category", {})
    for cat in wl.categories():
        idx = np.flatnonzero(wl.category == cat)
        pa = np.concatenate([wl.p_accept[wl.span(r)] for r in idx])
        out["by_category"][cat] = {"requests": int(len(idx)), "p_accept": float(pa.mean()),
                                   "loop_share": loops.get(cat)}
    out["p_accept"] = float(wl.p_accept.mean())
    out["loop_share"] = wl.extra.get("loop_share")
    return out


def write_model_card(pair_dir: Path, work: Path, figures: Path | None = None, profile: Path | None = None,
                     workloads: dict[str, Path] | None = None) -> Path:
    """Write ``README.md`` (the model card) into ``pair_dir`` from the training logs and measured figures."""
    from specgym.io import atomic_write_text

    corpus = json.loads((work / "corpus_stats.json").read_text())
    tokens = json.loads((work / "token_stats.json").read_text())
    states = {role: json.loads((pair_dir / role / "training_state.json").read_text()) for role in ("target", "draft")}
    sizes = {role: sum(f.stat().st_size for f in (pair_dir / role).iterdir()) / 1e6 for role in ("target", "draft")}
    fig = json.loads(figures.read_text()) if figures and figures.exists() else None
    prof = json.loads(profile.read_text()) if profile and profile.exists() else None
    wls = {name: _workload_summary(p) for name, p in (workloads or {}).items()}
    L: list[str] = []
    L += ["# specgym tinypair: a small GPT-2 draft/target pair trained from scratch on CPU", "",
          "Purpose: a real (not synthetic) model pair for specgym's live engine, recorder and profiler on machines "
          "without a model hub. It is a research fixture for speculative decoding, **not** a useful language model: "
          "it writes Python-looking code, pydoc-like prose and arithmetic word problems of low quality.", "",
          "Load it offline (weights are stored as fp16 to keep the repository small; the config says float32, so "
          "`from_pretrained` casts them back):", "", "```python",
          "import os; os.environ['HF_HUB_OFFLINE'] = '1'",
          "from transformers import AutoModelForCausalLM, AutoTokenizer",
          "tok = AutoTokenizer.from_pretrained('data/models/tinypair/target')",
          "target = AutoModelForCausalLM.from_pretrained('data/models/tinypair/target')  # float32",
          "draft = AutoModelForCausalLM.from_pretrained('data/models/tinypair/draft')", "```", "",
          "Both folders hold the same tokenizer; `<|endoftext|>` (id 0) is bos and eos, `<|pad|>` (id 1) is pad "
          "(explicit in config.json; GPT2Config would otherwise fall back to 50256).", ""]
    L += ["## Corpus (built only from what every Python installation has)", "",
          f"* code: the standard library's `.py` files ({corpus['code_files_train']} files for training, "
          f"{corpus['code_files_heldout']} held out by `sha1(path) % 100 < 3`);",
          f"* prose: `pydoc_data/topics.py` help topics ({corpus['topics_train']} for training, repeated 3x; "
          f"{corpus['topics_heldout']} held out by `sha1(key) % 100 < 10`);",
          f"* math: generated arithmetic word problems with worked answers ({corpus['math_docs_train']} training "
          "documents from seed 1234; held-out problems from seed 98765).",
          f"* training tokens in the stream: {tokens['train_tokens']:,} "
          f"({', '.join(f'{k} {v:,}' for k, v in tokens['tokens_by_category'].items())}).",
          f"* stdlib used: `{corpus['stdlib']}` (Python {sys.version.split()[0]}).", "",
          "Tokenizer: byte-level BPE (`tokenizers`), vocabulary 4096, trained on ~12 MB of the training documents.",
          ""]
    L += ["## Models", "", "| | layers | width | heads | parameters | context | train tokens | steps | wall time | "
          "held-out loss code / prose / math (nats) | size on disk |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for role in ("target", "draft"):
        st = states[role]
        sp = st["spec"]
        hl = st.get("heldout_loss") or {}
        L.append(f"| {role} | {sp['n_layer']} | {sp['n_embd']} | {sp['n_head']} | {st['n_params'] / 1e6:.2f}M | "
                 f"{sp['n_positions']} | {st['tokens'] / 1e6:.1f}M | {st['step']} | {st['elapsed_s'] / 60:.0f} min | "
                 f"{hl.get('code', float('nan')):.2f} / {hl.get('prose', float('nan')):.2f} / "
                 f"{hl.get('math', float('nan')):.2f} | {sizes[role]:.1f} MB |")
    distilled = bool(states["draft"].get("teacher"))
    L += ["", "Training: AdamW (betas 0.9/0.95, weight decay 0.1), warm-up then cosine decay driven by the wall-clock "
          "budget, batch 8 x 512 tokens, bf16 autocast on CPU, ONE torch thread (the machine is shared with other "
          f"jobs). Target peak LR {states['target']['peak_lr']}; draft peak LR {states['draft']['peak_lr']}, "
          + ("distilled from the target (loss = 0.7 KL(target || draft) + 0.3 cross-entropy)." if distilled else
             "trained on cross-entropy only (it beat the distilled draft, see below)."), "",
          "Why this size: on this 2-core CPU at one thread a 6-layer/256 target trains at ~2,600-3,600 tokens/s "
          "(16M tokens in 78 minutes) while an 8-layer/384 target trains at ~730 tokens/s (about 3.5M tokens in "
          "the same time, too few to learn much). The 1-layer/128 draft costs ~0.37 ms per token against ~2.45 ms "
          "for the target's step (cost ratio ~0.15).", "",
          "Draft selection (same target; live engine, CPU clock, 3 held-out prompts x 128 greedy tokens, "
          "`work_tmp/compare_drafts.py`): speedup over plain decoding at K=1 / acceptance at K=1:", "",
          "| draft candidate | training | held-out code loss | speedup K=1 | acceptance K=1 |", "|---|---|---|---|---|",
          "| 1 layer / 128, distilled (0.7 KL + 0.3 CE) | 8 min, 2.2M tokens | 3.95 | 0.78x | 0.20 |",
          "| **1 layer / 128, cross-entropy (shipped)** | 7 min, 5.4M tokens | 3.45 | 1.01x | 0.51 |",
          "| 2 layers / 128, cross-entropy | 7 min, 4.4M tokens | 3.29 | 0.90x | 0.46 |", "",
          "Distillation needs a target forward per batch, which made it 2.6x slower per token on one thread; with a "
          "few minutes of budget the extra tokens of plain cross-entropy won. All three drafts are weak (the target "
          "had the whole budget): **speculation does not pay with this pair on this CPU** (best fixed K about 1.0x "
          "plain decoding). A draft trained for ~1 hour, or a GPU-like cost regime, is needed for real speedups.", ""]
    L += ["## Measured on this machine", ""]
    if prof:
        v = prof["verify_ms"]
        L += [f"Cost profile `{prof['name']}` ({prof['hardware'].get('clock', 'wall')} clock, "
              f"{prof['hardware'].get('cpu', '')}, {prof['hardware'].get('torch_threads')} thread): draft "
              f"{prof['draft_ms']:.3f} ms/token, target step t_AR {v[0]:.3f} ms (cost ratio "
              f"{prof['draft_ms'] / v[0]:.3f}), verify of {len(v)} tokens {v[-1]:.3f} ms, round overhead "
              f"{prof['round_overhead_ms']:.3f} ms.", ""]
    if fig:
        L += [f"Live engine (`specgym.bench_live`, {fig['prompts']} held-out prompts x {fig.get('max_new_tokens', '?')}"
              f" tokens, greedy, {fig['clock']} clock): plain decoding {fig['plain_tok_s']:.0f} tok/s; best fixed "
              f"K = {fig['best_fixed_k']} gives **{fig['best_speedup']:.2f}x** plain decoding "
              f"({fig['best_profile_ratio']:.2f} of the cost profile's prediction).", "",
              "| K | tok/s | speedup | acceptance |", "|---|---|---|---|"]
        L += [f"| {r['k']} | {r['tok_s']:.0f} | {r['speedup']:.2f} | {r['acceptance']:.2f} |" for r in fig["live"]]
        L += [""]
    for name, summ in wls.items():
        if summ is None:
            continue
        L += [f"Workload `{name}` ({summ['requests']} held-out prompts, {summ['positions']:,} positions): mean "
              f"acceptance probability {summ['p_accept']:.3f}; share of completions ending in a repetition loop "
              f"(last 64 tokens periodic, period <= 32): {summ['loop_share']:.2f}.", "",
              "| category | requests | mean p_accept | loop share |", "|---|---|---|---|"]
        for cat, c in summ["by_category"].items():
            ls = "" if c["loop_share"] is None else f"{c['loop_share']:.2f}"
            L.append(f"| {cat} | {c['requests']} | {c['p_accept']:.3f} | {ls} |")
        L += [""]
    L += ["## Limitations", "",
          "* A weak target falls into greedy repetition loops; loops are easy for the draft to predict, which "
          "inflates greedy acceptance. The sampled workload (temperature 0.8) is the more realistic one; report both.",
          "* Figures are for a shared 2-core CPU at one thread; GPU regimes differ (see "
          "`data/profiles/gpu-like-published.json`, illustrative).",
          "* Trained for minutes, not days: held-out losses are high and outputs are often ungrammatical.", ""]
    path = pair_dir / "README.md"
    atomic_write_text(path, "\n".join(L), overwrite=True)
    return path


# ----------------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------------

STAGES = ("corpus", "tokenizer", "tokens", "target", "draft", "export", "prompts", "card")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``specgym train-lm-pair`` (shared by ``python -m specgym.training.lm_pair``)."""
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK)
    p.add_argument("--name", default="tinypair", help="folder under data/models/ for the exported pair")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--target", default="6,256,4", help="target n_layer,n_embd,n_head")
    p.add_argument("--draft", default="1,128,2", help="draft n_layer,n_embd,n_head")
    p.add_argument("--draft-role", default="draft", help="checkpoint name of the draft (to train several)")
    p.add_argument("--target-budget-min", type=float, default=78.0)
    p.add_argument("--draft-budget-min", type=float, default=8.0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=512)
    p.add_argument("--target-lr", type=float, default=1.5e-3)
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--no-distill", action="store_true", help="train the draft on cross-entropy only")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log-file", type=Path, default=None)
    p.add_argument("--prompts-per-category", type=int, default=200)
    p.add_argument("--prompts-out", type=Path, default=None, help="held-out prompts JSONL (stage 'prompts'; "
                   "default <work-dir>/prompts.jsonl)")


def _spec(text: str, where: str) -> ModelSpec:
    try:
        n_layer, n_embd, n_head = (int(v) for v in text.split(","))
    except ValueError:
        raise SpecgymError(f"{where}: expected n_layer,n_embd,n_head (e.g. 6,256,4), got {text!r}") from None
    if n_embd % n_head:
        raise SpecgymError(f"{where}: n_embd {n_embd} is not divisible by n_head {n_head}")
    return ModelSpec(n_layer, n_embd, n_head)


def run(args: argparse.Namespace) -> int:
    """Run the requested stages in order."""
    work: Path = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    handlers.append(logging.FileHandler(args.log_file or work / "train.log"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", handlers=handlers, force=True)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise SpecgymError(f"--stages: unknown stage(s) {bad}; choose from {','.join(STAGES)}")
    import torch

    torch.set_num_threads(args.threads)
    if "corpus" in stages:
        build_corpus(work)
    if "tokenizer" in stages:
        train_tokenizer(work, args.vocab_size)
    if "tokens" in stages:
        tokenize_corpus(work)
    if "target" in stages:
        train_model(work, "target", _spec(args.target, "--target"), args.target_budget_min * 60, args.batch,
                    args.block, args.target_lr, threads=args.threads)
    if "draft" in stages:
        teacher = None if args.no_distill else work / "target_ckpt"
        train_model(work, args.draft_role, _spec(args.draft, "--draft"), args.draft_budget_min * 60, args.batch,
                    args.block, args.draft_lr, teacher_path=teacher, threads=args.threads)
    if "export" in stages:
        export_pair(work, args.name, draft_role=args.draft_role)
    if "prompts" in stages:
        from specgym.io import atomic_write_text

        prompts = heldout_prompts(work, args.prompts_per_category)
        out = args.prompts_out or work / "prompts.jsonl"
        atomic_write_text(Path(out), "".join(json.dumps(p) + "\n" for p in prompts), overwrite=True)
        log.info("wrote %d held-out prompts to %s", len(prompts), out)
    if "card" in stages:
        from specgym.paths import MODELS_DIR, PROFILES_DIR, WORKLOADS_DIR

        card = write_model_card(
            MODELS_DIR / args.name, work, figures=REPO / "work_tmp" / "live_figures.json",
            profile=PROFILES_DIR / f"cpu-{args.name}.json",
            workloads={f"{args.name}-greedy": WORKLOADS_DIR / f"{args.name}-greedy.parquet",
                       f"{args.name}-t08": WORKLOADS_DIR / f"{args.name}-t08.parquet"},
        )
        log.info("wrote model card %s", card)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specgym.training.lm_pair", description=__doc__.splitlines()[0])
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except SpecgymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

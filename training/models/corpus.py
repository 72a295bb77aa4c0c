"""The training corpus of the shipped model pairs, built only from what every Python installation has.

* code: the standard library's ``.py`` sources (a deterministic ~3% of files are held out for prompts/eval);
* English prose: ``pydoc_data/topics.py`` (the help topics; ~10% of topics held out);
* math: generated arithmetic word problems (training and held-out sets come from different seeds).

``build_corpus`` writes ``train_docs.jsonl`` and ``heldout.jsonl`` ({"category", "source", "text"} per line) into
the work folder; :func:`~specgym.training.models.tokenizer.heldout_prompts` cuts evaluation prompts from the
held-out documents only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EOT = "<|endoftext|>"
PAD = "<|pad|>"
CATEGORIES = ("code", "prose", "math")

log = logging.getLogger("specgym.lm_pair")


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
        q = (f"{n1} buys {c} packs of {it}. Each pack costs {a} dollars. {n1} pays with {c * a + b} dollars. "
             f"How much change does {n1} get?")
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
    stats: dict[str, Any] = {"stdlib": str(root), "code_files_train": 0, "code_files_heldout": 0, "topics_train": 0,
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
        text = math_document(rng_h, rng_h.randint(3, 8))
        held.append({"category": "math", "source": f"math-heldout-{i}", "text": text})
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

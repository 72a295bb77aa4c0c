"""``specgym data eval-prompts``: a frozen evaluation prompts file from a finished data folder's val and test splits.

A data folder (:mod:`specgym.training.models.data_gen`) splits its prompts train/val/test by *source* (a passage, or
a group of near-duplicate prompts, :func:`~specgym.training.models.prompt_filter.source_groups`); the drafters learn
from its train split only (:mod:`specgym.training.models.data_answers`). The val and test prompts are thus prompts
nobody on the project wrote and no drafter trained on: what a recording (``specgym record --prompts FILE``) for the
replay and live tables should hold. This module writes them as a prompts file ``specgym record`` reads (every line
names its ``split``, so the recording keeps the folder's split of each prompt), sampled to a cap per split and
category, with a manifest beside it (``NAME.manifest.json``) that identifies the split: the data folder's
``config.json`` and ``prompts.jsonl`` SHA-256, the sample's seed and cap, the counts, the leak check, and the
SHA-256 of the file written, so that the file can be declared frozen and checked later (:func:`check_frozen`).

The sample (:func:`sample`): per split and category, a seeded order of that cell's prompts with prompts of sources
not yet picked first (two prompts over one passage are taken only when the cell has too few sources), cut at
``per_category``; a larger cap extends a smaller one's sample. The file lists the picks rank by rank (every cell's
first pick, then every cell's second...), so any prefix (``record --max-prompts``) is balanced too.

The leak check (:func:`find_leaks`, :func:`check_no_leak`): a val or test prompt must share no source, no passage,
no normalised text and no near-duplicate (the data folder's grouping threshold, found by the same MinHash helper,
:func:`~specgym.training.models.prompt_filter.near_pairs`, with another draw of its permutations than the grouping
used) with any train prompt of the same folder. Candidates that leak are left out before the sample is drawn (the
manifest names them); the sample written is checked again.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.errors import SpecgymError
from specgym.io import atomic_paths, check_output, sha256_file
from specgym.training.models.data_answers import check_data_folder
from specgym.training.models.data_gen import read_lines
from specgym.training.models.prompt_filter import jaccard, near_pairs, normalise, shingles

#: The splits an evaluation prompts file holds (the train split is what the drafters learned from).
EVAL_SPLITS = ("val", "test")
#: Default prompts per split and category: 14 categories x 2 splits x 8 = 224 prompts, at most 28.7k answer tokens
#: at 128 each. A greedy ``specgym record`` of the real pair costs about 0.06 s per position on this 2-core CPU (the
#: shipped smollm2-greedy recording: 20.7k positions in ~20 min with a second recording beside it) and 0.12 s while
#: a data generation held both cores (8 prompts, 2 with passages, 671 positions in 79 CPU-seconds, loading
#: included): under ~30 min quiet, and 10 per category (280) would be ~35 min at best.
DEFAULT_PER_CATEGORY = 8
#: The fields each written prompt carries (``prompt``, ``id``, ``category`` and ``split`` are what ``record`` reads).
FIELDS = ("id", "split", "category", "source", "passage", "prompt", "license")
#: The fields a data folder's prompt must have for a sample to be drawn.
_NEEDED = ("id", "split", "category", "source", "prompt")
MANIFEST_KIND = "specgym eval prompts"


def manifest_path(out: Path) -> Path:
    """The manifest beside an evaluation prompts file: ``NAME.jsonl`` -> ``NAME.manifest.json``."""
    return out.with_name(f"{out.stem}.manifest.json")


@dataclass(frozen=True)
class Leak:
    """A val or test prompt that shares something with the train split.

    Attributes:
        id: The val or test prompt's id.
        split: Its split.
        kind: ``source``, ``passage``, ``duplicate`` (same normalised text) or ``near-duplicate``.
        train_id: The train prompt it shares it with.
        detail: The shared source or passage, or the Jaccard similarity.
    """

    id: str
    split: str
    kind: str
    train_id: str
    detail: str

    def line(self) -> str:
        """The leak in words (for a one-line error)."""
        return f"{self.split} prompt {self.id} shares its {self.kind} ({self.detail}) with train prompt {self.train_id}"


def find_leaks(evaluated: Sequence[dict[str, Any]], train: Sequence[dict[str, Any]], threshold: float,
               seed: int) -> list[Leak]:
    """Every way the ``evaluated`` prompts (val, test) meet the ``train`` prompts of one data folder: a shared
    ``source``, a shared ``passage``, the same normalised text
    (:func:`~specgym.training.models.prompt_filter.normalise`), or full texts whose word 3-shingle Jaccard similarity
    is at least ``threshold`` (:func:`~specgym.training.models.prompt_filter.near_pairs`, MinHash candidates with
    permutations drawn from ``seed``, verified exactly). Sorted by the evaluated prompt's id.

    Args:
        evaluated: Prompt records (``id``, ``split``, ``source``, ``prompt``, optional ``passage``).
        train: The train split's prompt records.
        threshold: The near-duplicate Jaccard similarity (the data folder's ``group_threshold``).
        seed: The MinHash permutations' seed.
    """
    by_source = {p["source"]: p["id"] for p in train}
    by_passage = {p["passage"]: p["id"] for p in train if p.get("passage") is not None}
    by_text = {normalise(p["prompt"]): p["id"] for p in train}
    leaks: list[Leak] = []
    for p in evaluated:
        if p["source"] in by_source:
            leaks.append(Leak(p["id"], p["split"], "source", by_source[p["source"]], p["source"]))
        if p.get("passage") is not None and p["passage"] in by_passage:
            leaks.append(Leak(p["id"], p["split"], "passage", by_passage[p["passage"]], p["passage"]))
        if normalise(p["prompt"]) in by_text:
            leaks.append(Leak(p["id"], p["split"], "duplicate", by_text[normalise(p["prompt"])], "same text"))
    sets = [shingles(p["prompt"]) for p in train] + [shingles(p["prompt"]) for p in evaluated]
    n = len(train)
    for i, j in near_pairs(sets, threshold, seed):
        if i < n <= j:  # one train prompt, one evaluated (pairs within either side are not leaks)
            p = evaluated[j - n]
            leaks.append(Leak(p["id"], p["split"], "near-duplicate", train[i]["id"],
                              f"Jaccard {jaccard(sets[i], sets[j]):.2f} >= {threshold:g}"))
    return sorted(leaks, key=lambda lk: (lk.id, lk.kind, lk.train_id))


def check_no_leak(evaluated: Sequence[dict[str, Any]], train: Sequence[dict[str, Any]], threshold: float,
                  seed: int) -> None:
    """Refuse evaluation prompts that meet the train split (:func:`find_leaks`).

    Raises:
        SpecgymError: One line naming the first leak and how many there are.
    """
    leaks = find_leaks(evaluated, train, threshold, seed)
    if leaks:
        more = f" (and {len(leaks) - 1} more)" if len(leaks) > 1 else ""
        raise SpecgymError(f"{len(leaks)} leak(s) from the train split: {leaks[0].line()}{more}; the evaluation "
                           f"prompts would not be held out")


def _cell_key(split: str, category: str) -> int:
    """A stable integer of a (split, category) cell: its draws do not depend on which other cells exist."""
    return int.from_bytes(hashlib.sha256(f"{split}:{category}".encode()).digest()[:4], "big")


def sample(prompts: Sequence[dict[str, Any]], categories: Sequence[str], per_category: int,
           seed: int) -> list[dict[str, Any]]:
    """``per_category`` prompts (at most) of every val and test category, listed rank by rank.

    Per ``(split, category)`` cell, the prompts (in id order) are shuffled by a generator of ``(seed, cell)``, then
    stably reordered so that a source's first prompt comes before any source's second; the cell's first
    ``per_category`` are picked. The result lists every cell's first pick (splits in :data:`EVAL_SPLITS` order,
    categories in ``categories`` order, then any others alphabetically), then every cell's second, and so on.
    """
    extra = sorted({p["category"] for p in prompts} - set(categories))
    cells: list[list[dict[str, Any]]] = []
    for split in EVAL_SPLITS:
        for cat in [*categories, *extra]:
            pool = sorted((p for p in prompts if p["split"] == split and p["category"] == cat), key=lambda p: p["id"])
            order = np.random.default_rng([seed, _cell_key(split, cat)]).permutation(len(pool))
            seen: Counter[str] = Counter()
            ranked = []
            for pos, i in enumerate(order):
                src = pool[int(i)]["source"]
                ranked.append((seen[src], pos, pool[int(i)]))
                seen[src] += 1
            cells.append([p for _, _, p in sorted(ranked, key=lambda r: (r[0], r[1]))][:per_category])
    return [cell[r] for r in range(per_category) for cell in cells if r < len(cell)]


@dataclass
class EvalPrompts:
    """An evaluation prompts file before it is written: its records and its manifest (the file's ``sha256`` is
    added when it is written)."""

    records: list[dict[str, Any]]
    manifest: dict[str, Any]
    excluded: list[Leak] = field(default_factory=list)

    def text(self) -> str:
        """The file's bytes as text: one JSON object per line, in :data:`FIELDS` order."""
        return "".join(json.dumps({k: r.get(k) for k in FIELDS}, ensure_ascii=False) + "\n" for r in self.records)


def _data_prompts(folder: Path) -> list[dict[str, Any]]:
    """A finished data folder's prompts, each checked for the fields a sample needs (one line naming file and
    line otherwise)."""
    path = folder / "prompts.jsonl"
    out = read_lines(path)
    for lineno, p in enumerate(out, 1):
        missing = [k for k in _NEEDED if not isinstance(p.get(k), str) or not p.get(k)]
        if missing:
            raise SpecgymError(f"{path}:{lineno}: a prompt without {', '.join(missing)}; the data folder is damaged")
    return out


def check_finished(folder: Path) -> dict[str, Any]:
    """Refuse a data folder whose prompts or answers stage is unfinished (one line naming the stage,
    :func:`~specgym.training.models.data_answers.check_data_folder`); returns its ``config.json``."""
    target = ""
    try:
        doc = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        target = str(doc.get("target", "")) if isinstance(doc, dict) else ""
    except (OSError, ValueError):
        pass  # check_data_folder names what is wrong with it
    return check_data_folder(folder, target)


def build(folder: Path, per_category: int = DEFAULT_PER_CATEGORY, seed: int = 0) -> EvalPrompts:
    """The evaluation prompts of a finished data folder: val and test prompts that do not leak from its train split
    (:func:`find_leaks`), sampled (:func:`sample`), checked again (:func:`check_no_leak`), with their manifest.

    Raises:
        SpecgymError: The folder is unfinished or damaged (:func:`check_finished`), ``per_category`` is below 1, or
            it has no val or test prompt.
    """
    if per_category < 1:
        raise SpecgymError(f"--per-category {per_category}: must be >= 1")
    folder = Path(folder)
    config = check_finished(folder)
    prompts = _data_prompts(folder)
    threshold = float(config.get("group_threshold", 0.5))
    leak_seed = int(config.get("seed", 0)) + 1  # another MinHash draw than the grouping's (config seed)
    train = [p for p in prompts if p["split"] == "train"]
    candidates = [p for p in prompts if p["split"] in EVAL_SPLITS]
    if not candidates:
        raise SpecgymError(f"--data {folder}: no val or test prompts (its splits are {config.get('splits')}); "
                           f"nothing held out to evaluate on")
    excluded = find_leaks(candidates, train, threshold, leak_seed)
    leaked = {lk.id for lk in excluded}
    kept = [p for p in candidates if p["id"] not in leaked]
    categories = [str(c) for c in config.get("categories", [])]
    records = sample(kept, categories, per_category, seed)
    check_no_leak(records, train, threshold, leak_seed)

    def counts(ps: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
        cats = [*categories, *sorted({p["category"] for p in ps} - set(categories))]
        return {s: {c: sum(1 for p in ps if p["split"] == s and p["category"] == c) for c in cats}
                for s in EVAL_SPLITS}

    manifest = {
        "kind": MANIFEST_KIND,
        "prompts": len(records),
        "counts": counts(records),
        "available": counts(kept),
        "data": {"folder": str(folder), "config_sha256": sha256_file(folder / "config.json"),
                 "prompts_sha256": sha256_file(folder / "prompts.jsonl"), "target": config.get("target"),
                 "splits": config.get("splits"), "seed": config.get("seed"), "prompts": len(prompts),
                 "train_prompts": len(train)},
        "sample": {"splits": list(EVAL_SPLITS), "per_category": per_category, "seed": seed,
                   "order": "rank by rank over (split, category) cells; within a cell a seeded shuffle, a source's "
                            "first prompt before any source's second"},
        "leak_check": {"against": "train", "threshold": threshold, "minhash_seed": leak_seed,
                       "checks": ["source", "passage", "duplicate", "near-duplicate"],
                       "excluded": [{"id": lk.id, "split": lk.split, "kind": lk.kind, "train_id": lk.train_id,
                                     "detail": lk.detail} for lk in excluded],
                       "sample_leaks": 0},
    }
    return EvalPrompts(records, manifest, excluded)


def check_outputs(out: Path, force: bool) -> tuple[Path, Path]:
    """``(out, manifest)``, refused in one line before anything is read: ``out`` not named ``.jsonl``, or it or its
    manifest already there without ``force`` (:func:`~specgym.io.check_output`)."""
    out = check_output(out, force, "file", suffixes=(".jsonl",))
    man = check_output(manifest_path(out), force, "file", option="--out's manifest",
                       hint="--force replaces it with --out")
    return out, man


def write(ev: EvalPrompts, out: Path, force: bool = False, command: str | None = None) -> Path:
    """Write the prompts file and its manifest (:func:`manifest_path`) together, atomically: temporaries renamed into
    place only once both are complete. Returns the manifest's path.

    Raises:
        SpecgymError: ``out`` is not a ``.jsonl`` name, or it or its manifest exists and ``force`` is not given.
    """
    out, man = check_outputs(out, force)
    text = ev.text()
    ev.manifest = {**ev.manifest, "file": out.name, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                   **({"command": command} if command else {})}
    with atomic_paths([out, man], overwrite=force) as (tmp_out, tmp_man):
        tmp_out.write_bytes(text.encode("utf-8"))
        tmp_man.write_text(json.dumps(ev.manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return man


def check_frozen(path: Path) -> dict[str, Any]:
    """Check that an evaluation prompts file is the one its manifest froze (same SHA-256); returns the manifest.

    Raises:
        SpecgymError: No manifest beside it, an unreadable one, or a file whose bytes changed since.
    """
    path = Path(path)
    man = manifest_path(path)
    if not path.is_file():
        raise SpecgymError(f"{path}: not found (an evaluation prompts file)")
    try:
        doc = json.loads(man.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise SpecgymError(f"{man}: missing or unreadable; `specgym data eval-prompts` writes it beside "
                           f"{path}") from None
    if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND:
        raise SpecgymError(f"{man}: not an evaluation prompts manifest (kind {MANIFEST_KIND!r} expected)")
    have = sha256_file(path)
    if have != doc.get("sha256"):
        raise SpecgymError(f"{path}: sha256 {have[:12]}... differs from its manifest's "
                           f"{str(doc.get('sha256'))[:12]}...; the frozen file was changed")
    return doc

"""``specgym train-draft``: the stages that make a distilled draft for a target, and the shipped folder they end in.

Stages (each resumable; running the command again continues where it stopped): ``answers`` (the target's answers
to the train prompts and its greedy answers to the val prompts, :func:`~specgym.training.models.distill.
sample_answers`), ``init`` (the layer subset), ``train`` (sparse distillation for a wall-clock budget), ``export``
(held-out acceptance measured, then the draft written as a folder that borrows the target's embedding, with a
card). With ``--data`` the answers are a data folder's (its train split; its val split's greedy answers measure),
and the answers stage only teacher-forces them for the target's top-``k`` logits
(:mod:`~specgym.training.models.data_answers`). ``make drafter-smollm2`` runs them all for the real pair, on
``build/data-smollm2``.

Everything a run checks before it loads a model (so a refused run loads nothing and creates no work folder): the
prompts file and its splits, ``--layers`` (against the target's depth read from its ``config.json`` or GGUF header),
that the work folder's answers are to this prompts file, that a finished ``draft_init`` was built from these layers,
and that every stage asked for has what it starts from (the stage to run first is named).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from specgym.catalogue import external_target
from specgym.envs.engines.live.draft_vocab import DRAFT_VOCAB_FILE, make_reduced_head, output_rows
from specgym.envs.engines.live.model_cache import BORROW_FILE
from specgym.envs.engines.live.model_loading import load_model, load_tokenizer
from specgym.envs.workloads.prompts import read_prompts
from specgym.errors import SpecgymError
from specgym.io import atomic_dir
from specgym.paths import portable_name
from specgym.training.models.checkpoint import recover_folder, save_folder
from specgym.training.models.data_answers import (
    DataAnswers,
    DataSelection,
    check_work_answers,
    data_command,
    read_data_answers,
    refuse_data_answers,
    teacher_answers,
    teacher_progress,
)
from specgym.training.models.distill import (
    CKPT_DONE,
    INIT_DONE,
    AnswerPlan,
    batch_files,
    check_answers_source,
    check_layers,
    heldout_acceptance,
    init_complete,
    layer_subset_draft,
    load_answers,
    prompts_source,
    sample_answers,
    train_draft,
)
from specgym.training.models.draft_card import draft_card

STAGES = ("answers", "init", "train", "export")
#: The reduced draft vocabularies an export measures and ships (most frequent answer tokens).
VOCAB_SIZES = (4096, 8192, 16384)
#: Tensors a shipped draft borrows from its target (the tied embedding / output layer).
BORROWED = {"model.embed_tokens.weight": "model.embed_tokens.weight"}


@dataclass
class DraftBuild:
    """One ``train-draft`` run: the target, the prompts, the draft's shape and the budgets.

    Attributes:
        target: The target (a folder, a ``.gguf`` file or a shipped pair's target name such as ``smollm2``).
        prompts: A prompts file whose lines name their ``split`` (train answers teach, val answers measure).
        work: The work folder (answers, checkpoints; resumable).
        layers: The target layers the draft starts from.
        budget_s: Wall-clock seconds of distillation.
        plan: Which answers the target writes.
        vocab_sizes: Draft vocabularies (most frequent answer tokens) whose coverage and acceptance are reported.
        draft_vocab: The one of ``vocab_sizes`` the exported draft is restricted to
            (:mod:`specgym.envs.engines.live.draft_vocab`), or None for the full vocabulary.
        data: Learn from a data folder's answers (``specgym data generate``: its train split, the val split held
            out; :mod:`specgym.training.models.data_answers`) instead of answers the target generates to
            ``prompts``; the answers stage then only teacher-forces them for the target's top-``k`` logits.
    """

    target: str
    prompts: str
    work: Path
    layers: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    budget_s: float = 3600.0
    plan: AnswerPlan = field(default_factory=AnswerPlan)
    vocab_sizes: tuple[int, ...] = VOCAB_SIZES
    draft_vocab: int | None = None
    data: DataSelection | None = None


def run(build: DraftBuild, stages: tuple[str, ...] = STAGES, out: Path | None = None, force: bool = False) -> dict:
    """Run ``stages`` in order; returns the build's report (held-out acceptance after ``export``).

    Raises:
        SpecgymError: Before any model is loaded and before the work folder is created: a bad prompts file, a data
            folder that is not finished or is another target's, bad ``--layers``, answers to another prompts file
            (or another pick of data answers), a ``draft_init`` built from other layers, or a stage whose input no
            earlier run or stage makes.
    """
    work = build.work
    data: DataAnswers | None = None
    if build.data is not None:
        data = read_data_answers(build.data, build.target)
        picked = {work / "answers": data.identity("train"), work / "answers_val": data.identity("val")}
        for folder, identity in picked.items():
            check_work_answers(folder, identity)
        n_answers = {work / "answers": len(data.train), work / "answers_val": len(data.val)}

        def progress(folder: Path) -> tuple[int, int]:
            return teacher_progress(folder, n_answers[folder], build.plan.batch)
    else:
        prompts = read_prompts(build.prompts)
        by_split = {s: [p for p in prompts if p.split == s] for s in ("train", "val", "test")}
        if not by_split["train"] or not by_split["val"]:
            raise SpecgymError(f"{build.prompts}: train-draft needs prompts whose lines name a 'split' (train and "
                               f"val)")
        source = prompts_source(build.prompts)
        for folder in (work / "answers", work / "answers_val"):
            refuse_data_answers(folder)
            check_answers_source(folder, source)

        def progress(folder: Path) -> tuple[int, int]:
            return _answers_progress(folder, by_split["train" if folder.name == "answers" else "val"])
    if "export" in stages and out is None:
        raise SpecgymError("the export stage needs --out")
    check_layers(build.layers)
    recover_folder(work / "draft_init", INIT_DONE)
    recover_folder(work / "draft_ckpt", CKPT_DONE)
    _check_init_layers(build, stages)
    _check_prerequisites(build, stages, progress)
    if "init" in stages and not init_complete(work / "draft_init"):
        check_layers(build.layers, target_depth(build.target))
    target = tok = None

    def loaded() -> tuple[Any, Any]:
        nonlocal target, tok
        if target is None:
            tok, target = load_tokenizer(build.target, "target"), load_model(build.target, "target")
        return target, tok

    report: dict[str, Any] = {}
    if "answers" in stages and data is not None:
        t, _ = loaded()
        top_k, batch = build.plan.top_k, build.plan.batch
        report["val_tokens"] = teacher_answers(t, data.val, work / "answers_val", data.identity("val"), top_k, batch,
                                               "target top-k (val answers)")
        report["train_tokens"] = teacher_answers(t, data.train, work / "answers", data.identity("train"), top_k,
                                                 batch, "target top-k (train answers)")
    elif "answers" in stages:
        t, k = loaded()
        report["val_tokens"] = sample_answers(t, k, by_split["val"], work / "answers_val", _val_plan(build.plan),
                                              build.prompts, "target answers (val)")
        report["train_tokens"] = sample_answers(t, k, by_split["train"], work / "answers", build.plan, build.prompts,
                                                "target answers (train)")
    if "init" in stages and not init_complete(work / "draft_init"):
        t, k = loaded()
        draft = layer_subset_draft(t, build.layers)

        def write(tmp: Path) -> None:
            draft.save_pretrained(str(tmp))
            k.save_pretrained(str(tmp))
            (tmp / INIT_DONE).write_text(json.dumps({"layers": build.layers, "target": build.target}) + "\n")

        save_folder(work / "draft_init", write)  # a partial draft_init (saved in place by older specgym) is replaced
    if "train" in stages:
        report["train"] = train_draft(work, build.budget_s)
    if "export" in stages:
        assert out is not None
        report.update(export_draft(build, out, force, data))
    return report


def _val_plan(plan: AnswerPlan) -> AnswerPlan:
    """The val prompts' answers: greedy only, as long and as wide as the train answers."""
    return AnswerPlan(temperatures=(0.0,), max_new_tokens=plan.max_new_tokens, top_k=plan.top_k, batch=plan.batch)


def _check_init_layers(build: DraftBuild, stages: tuple[str, ...]) -> None:
    """A finished ``draft_init`` records the layers it was built from: ``init`` (which would keep it) and ``export``
    (whose card names the layers) refuse others, rather than mislabel the draft."""
    record = build.work / "draft_init" / INIT_DONE
    if not ({"init", "export"} & set(stages)) or not record.is_file():
        return
    try:
        had = json.loads(record.read_text()).get("layers")
    except (OSError, ValueError, AttributeError):
        return
    if had is not None and had != build.layers:
        raise SpecgymError(f"--layers {','.join(map(str, build.layers))}: {build.work / 'draft_init'} was built from "
                           f"target layers {','.join(map(str, had))}; give --layers {','.join(map(str, had))}, or use "
                           f"another --work-dir")


def _check_prerequisites(build: DraftBuild, stages: tuple[str, ...],
                         progress: Callable[[Path], tuple[int, int]]) -> None:
    """Refuse a stage whose input neither an earlier run nor an earlier stage of this run makes, naming the stage to
    run first (stages run in the order answers, init, train, export, whatever order they are given in).
    ``progress(answers folder)`` is ``(finished batches, batches)``."""
    work = build.work
    init, ckpt = work / "draft_init", work / "draft_ckpt"
    for stage in (s for s in STAGES if s in stages):
        if stage in ("train", "export") and "answers" not in stages:
            for folder in (work / "answers", work / "answers_val"):
                done, total = progress(folder)
                if done < total:
                    have = "no answers" if not done else f"{done} of {total} batches of answers"
                    same = "--data" if build.data is not None else "--prompts"
                    raise SpecgymError(f"--stages {stage}: {folder} holds {have}; run --stages answers first "
                                       f"(same --work-dir and {same})")
        if stage in ("train", "export") and "init" not in stages and not init_complete(init):
            what = ("is incomplete (an init stage stopped before it finished)" if init.exists()
                    else "does not exist yet")
            raise SpecgymError(f"--stages {stage}: {init} {what}; run --stages init first")
        if stage == "export" and "train" not in stages and not (ckpt / CKPT_DONE).is_file():
            raise SpecgymError(f"--stages export: {ckpt} does not exist yet (no trained draft); run --stages train "
                               f"first")


def _answers_progress(folder: Path, prompts: list[Any]) -> tuple[int, int]:
    """``(finished batches, batches of the folder's plan)`` of an answers folder (``(0, 1)`` without a plan)."""
    path = folder / "plan.json"
    if not path.is_file():
        return 0, 1
    try:
        have = json.loads(path.read_text())
        names = {f.name for f in fields(AnswerPlan)}
        kwargs: dict[str, Any] = {k: tuple(v) if k == "temperatures" else v for k, v in have.items() if k in names}
        plan = AnswerPlan(**kwargs)
    except (OSError, ValueError, TypeError, AttributeError):
        raise SpecgymError(f"{path}: unreadable; move this answers folder away or use another --work-dir") from None
    total = len(plan.jobs(prompts))
    return sum(1 for f in batch_files(folder) if int(f.stem) < total), total


def target_depth(target: str) -> int | None:
    """The target's number of decoder layers, read without loading a model: a folder's ``config.json``, or the
    header of a ``.gguf`` file (a shipped pair's included); None where it cannot be read so cheaply (a hub name, a
    damaged file: the model load reports those)."""
    path = Path(target).expanduser()
    gguf = path if path.suffix == ".gguf" else external_target(target) if not path.exists() else None
    if gguf is not None:
        return gguf_block_count(gguf) if gguf.is_file() else None
    try:
        doc = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    n = doc.get("num_hidden_layers", doc.get("n_layer")) if isinstance(doc, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


#: GGUF metadata value types of a fixed size (``struct`` formats).
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_block_count(path: Path) -> int | None:
    """The ``<architecture>.block_count`` of a GGUF file, read from the metadata at its head (milliseconds; no
    tensor is read); None if the file is no GGUF (v2 or later) or holds no such key."""
    try:
        with open(path, "rb") as f:

            def read(fmt: str) -> Any:
                size = struct.calcsize("<" + fmt)
                data = f.read(size)
                if len(data) != size:
                    raise ValueError("truncated")
                return struct.unpack("<" + fmt, data)[0]

            def string() -> bytes:
                n = read("Q")
                if n > 1 << 24:
                    raise ValueError("string too long")
                return f.read(n)

            def skip(vtype: int) -> None:
                if vtype in _GGUF_SCALARS:
                    read(_GGUF_SCALARS[vtype])
                elif vtype == _GGUF_STRING:
                    string()
                elif vtype == _GGUF_ARRAY:
                    etype, n = read("I"), read("Q")
                    if etype in _GGUF_SCALARS:
                        f.seek(n * struct.calcsize("<" + _GGUF_SCALARS[etype]), 1)
                    else:
                        for _ in range(n):
                            skip(etype)
                else:
                    raise ValueError(f"unknown value type {vtype}")

            if f.read(4) != b"GGUF" or read("I") < 2:
                return None
            read("Q")  # tensors
            for _ in range(read("Q")):
                key, vtype = string(), read("I")
                if key.endswith(b".block_count") and vtype in _GGUF_SCALARS and vtype not in (6, 7, 12):
                    return int(read(_GGUF_SCALARS[vtype]))
                skip(vtype)
    except (OSError, ValueError, struct.error):
        return None
    return None


def draft_vocab(work: Path, size: int) -> np.ndarray:
    """The ``size`` token ids most frequent in the target's train answers (ties by id), sorted by id."""
    return answer_vocab(load_answers(work / "answers"), size)


def answer_vocab(answers: Iterable[Any], size: int) -> np.ndarray:
    """The ``size`` token ids most frequent in ``answers`` (anything with an ``answer`` id array; ties by id), sorted
    by id."""
    counts = np.zeros(0, dtype=np.int64)
    for a in answers:
        c = np.bincount(a.answer, minlength=counts.size)
        counts = np.pad(counts, (0, max(0, c.size - counts.size)))
        counts[: c.size] += c
    order = np.lexsort((np.arange(counts.size), -counts))
    return np.sort(order[:size])


def export_draft(build: DraftBuild, out: Path, force: bool = False, data: DataAnswers | None = None) -> dict[str, Any]:
    """Measure the trained draft on the val answers and write the shipped folder: config, tokenizer, the draft's own
    weights in float16 (no embedding: :data:`BORROWED` names what comes from the target), a draft vocabulary list
    per size, ``training_state.json`` and a README card (``data``: the data folder's answers it learned from, which
    its metadata and rebuild commands name)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    work = build.work
    if build.draft_vocab is not None and build.draft_vocab not in build.vocab_sizes:
        raise SpecgymError(f"--draft-vocab {build.draft_vocab}: choose one of {', '.join(map(str, build.vocab_sizes))}")
    draft = AutoModelForCausalLM.from_pretrained(str(work / "draft_ckpt"), dtype=torch.float32)
    val = load_answers(work / "answers_val")
    init = AutoModelForCausalLM.from_pretrained(str(work / "draft_init"), dtype=torch.float32)
    heldout = {"init": heldout_acceptance(init, val), "full": heldout_acceptance(draft, val)}
    report: dict[str, Any] = {"heldout": heldout}
    total = sum(a.answer.size for a in val)
    vocabs = {}
    full_head, vocab_rows = draft.get_output_embeddings(), output_rows(draft)
    for size in build.vocab_sizes:
        vocab = draft_vocab(work, size)
        covered = sum(int(np.isin(a.answer, vocab).sum()) for a in val)
        draft.set_output_embeddings(make_reduced_head(full_head, [int(v) for v in vocab], vocab_rows))
        report["heldout"][f"vocab{size}"] = {**heldout_acceptance(draft, val), "coverage": covered / total}
        draft.set_output_embeddings(full_head)  # the exported weights are the full draft's
        vocabs[size] = vocab
    state = json.loads((work / "draft_ckpt" / "state.json").read_text())
    with atomic_dir(out, overwrite=force, owner="specgym train-draft") as tmp:
        own = {k: v.to(torch.float16).contiguous() for k, v in draft.state_dict().items()
               if k not in BORROWED and k != "lm_head.weight"}
        save_file(own, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        draft.config.save_pretrained(str(tmp))
        load_tokenizer(str(work / "draft_init"), "draft").save_pretrained(str(tmp))
        (tmp / BORROW_FILE).write_text(json.dumps({"target": build.target, "tensors": BORROWED}, indent=2) + "\n")
        for size, vocab in vocabs.items():
            (tmp / f"draft-vocab-{size}.json").write_text(json.dumps([int(v) for v in vocab]) + "\n")
        if build.draft_vocab is not None:
            (tmp / DRAFT_VOCAB_FILE).write_text(json.dumps({"file": f"draft-vocab-{build.draft_vocab}.json"}) + "\n")
        plan: dict[str, Any] = asdict(build.plan)
        trained_on: dict[str, Any] = {"prompts": portable_name(build.prompts), "split": "train"}
        source = f" --prompts {build.prompts}" if Path(build.prompts).stem != "smollm2-prompts" else ""
        if data is not None and build.data is not None:  # the answers the data folder holds, not the plan's
            c = data.config
            plan.update(temperatures=[0.0] + [c["temperature"]] * bool(c["samples"]), samples=c["samples"],
                        max_new_tokens=c["max_new_tokens"], seed=c["seed"])
            trained_on, source = data.trained_on(), f" {build.data.options()}"
        meta = {"layers_from_target": build.layers, "budget_s": build.budget_s, "plan": plan,
                "draft_vocab": build.draft_vocab, "trained_on": trained_on,
                "training": state, "heldout": report["heldout"], "val_positions": total}
        (tmp / "training_state.json").write_text(json.dumps(meta, indent=2) + "\n")
        common = f"specgym train-draft --target {build.target}{source} --layers {','.join(map(str, build.layers))}"
        restrict = f" --draft-vocab {build.draft_vocab}" if build.draft_vocab is not None else ""
        budget = float(state.get("budget_s", build.budget_s))  # what the train stage ran with
        commands = [f"{common} --stages answers,init,train --budget-min {budget / 60:g}",
                    f"{common} --stages export{restrict} --out {out}"]
        if build.data is not None:
            commands.insert(0, data_command(build.target, build.data.folder))
        card = draft_card(meta, build.target, sum(int(v.numel()) for v in own.values()), commands)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return report

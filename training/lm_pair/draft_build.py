"""``specgym train-draft``: the stages that make a distilled draft for a target, and the shipped folder they end in.

Stages (each resumable; running the command again continues where it stopped): ``answers`` (the target's answers
to the train prompts and its greedy answers to the val prompts, :func:`~specgym.training.lm_pair.distill.
sample_answers`), ``init`` (the layer subset), ``train`` (sparse distillation for a wall-clock budget), ``export``
(held-out acceptance measured, then the draft written as a folder that borrows the target's embedding, with a
card). ``make drafter-smollm2`` runs them all for the real pair.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.engines.draft_vocab import DRAFT_VOCAB_FILE, make_reduced_head, output_rows
from specgym.envs.engines.model_cache import BORROW_FILE
from specgym.envs.engines.model_loading import load_model, load_tokenizer
from specgym.envs.workloads.prompts import read_prompts
from specgym.errors import SpecgymError
from specgym.io import atomic_dir
from specgym.paths import portable_name
from specgym.training.lm_pair.distill import (
    AnswerPlan,
    heldout_acceptance,
    layer_subset_draft,
    load_answers,
    sample_answers,
    train_draft,
)
from specgym.training.lm_pair.draft_card import draft_card

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
            (:mod:`specgym.envs.engines.draft_vocab`), or None for the full vocabulary.
    """

    target: str
    prompts: str
    work: Path
    layers: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    budget_s: float = 3600.0
    plan: AnswerPlan = field(default_factory=AnswerPlan)
    vocab_sizes: tuple[int, ...] = VOCAB_SIZES
    draft_vocab: int | None = None


def run(build: DraftBuild, stages: tuple[str, ...] = STAGES, out: Path | None = None, force: bool = False) -> dict:
    """Run ``stages`` in order; returns the build's report (held-out acceptance after ``export``)."""
    work = build.work
    work.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(build.prompts)
    by_split = {s: [p for p in prompts if p.split == s] for s in ("train", "val", "test")}
    if not by_split["train"] or not by_split["val"]:
        raise SpecgymError(f"{build.prompts}: train-draft needs prompts whose lines name a 'split' (train and val)")
    target = tok = None

    def loaded() -> tuple[Any, Any]:
        nonlocal target, tok
        if target is None:
            tok, target = load_tokenizer(build.target, "target"), load_model(build.target, "target")
        return target, tok

    report: dict[str, Any] = {}
    if "answers" in stages:
        t, k = loaded()
        report["val_tokens"] = sample_answers(t, k, by_split["val"], work / "answers_val",
                                              AnswerPlan(temperatures=(0.0,), max_new_tokens=build.plan.max_new_tokens,
                                                         top_k=build.plan.top_k, batch=build.plan.batch))
        report["train_tokens"] = sample_answers(t, k, by_split["train"], work / "answers", build.plan)
    if "init" in stages and not (work / "draft_init" / "config.json").exists():
        t, k = loaded()
        draft = layer_subset_draft(t, build.layers)
        draft.save_pretrained(str(work / "draft_init"))
        k.save_pretrained(str(work / "draft_init"))
    if "train" in stages:
        report["train"] = train_draft(work, build.budget_s)
    if "export" in stages:
        if out is None:
            raise SpecgymError("the export stage needs --out")
        report.update(export_draft(build, out, force))
    return report


def draft_vocab(work: Path, size: int) -> np.ndarray:
    """The ``size`` token ids most frequent in the target's train answers (ties by id), sorted by id."""
    counts = np.zeros(0, dtype=np.int64)
    for a in load_answers(work / "answers"):
        c = np.bincount(a.answer, minlength=counts.size)
        counts = np.pad(counts, (0, max(0, c.size - counts.size)))
        counts[: c.size] += c
    order = np.lexsort((np.arange(counts.size), -counts))
    return np.sort(order[:size])


def export_draft(build: DraftBuild, out: Path, force: bool = False) -> dict[str, Any]:
    """Measure the trained draft on the val answers and write the shipped folder: config, tokenizer, the draft's own
    weights in float16 (no embedding: :data:`BORROWED` names what comes from the target), a draft vocabulary list
    per size, ``training_state.json`` and a README card."""
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
        meta = {"layers_from_target": build.layers, "budget_s": build.budget_s, "plan": asdict(build.plan),
                "draft_vocab": build.draft_vocab,
                "trained_on": {"prompts": portable_name(build.prompts), "split": "train"},
                "training": state, "heldout": report["heldout"], "val_positions": total}
        (tmp / "training_state.json").write_text(json.dumps(meta, indent=2) + "\n")
        prompts = f" --prompts {build.prompts}" if Path(build.prompts).stem != "smollm2-prompts" else ""
        common = f"specgym train-draft --target {build.target}{prompts} --layers {','.join(map(str, build.layers))}"
        restrict = f" --draft-vocab {build.draft_vocab}" if build.draft_vocab is not None else ""
        budget = float(state.get("budget_s", build.budget_s))  # what the train stage ran with
        commands = [f"{common} --stages answers,init,train --budget-min {budget / 60:g}",
                    f"{common} --stages export{restrict} --out {out}"]
        card = draft_card(meta, build.target, sum(int(v.numel()) for v in own.values()), commands)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return report

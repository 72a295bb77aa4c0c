"""``specgym train-lm-pair``: the stages that build a shipped model pair (each resumable).

Stages (artifacts under ``--work-dir``, default ``build/lm_pair``):

1. ``corpus``: ``train_docs.jsonl`` and ``heldout.jsonl`` (:mod:`~specgym.training.models.corpus`).
2. ``tokenizer``: byte-level BPE with ``<|endoftext|>`` (bos/eos, id 0) and ``<|pad|>`` (id 1), or a copy of an
   existing pair's tokenizer (``--tokenizer-from``).
3. ``tokens``: the training stream as uint16 ids and held-out eval ids per category.
4. ``grow``: a function-preserving wider/deeper copy of a trained target (:mod:`~specgym.training.models.grow`).
5. ``target``: train the target for a wall-clock budget (from scratch, or continuing the grown model).
6. ``draft``: train the draft; distilled from ``--teacher`` (KL + cross-entropy) unless ``--no-distill``.
7. ``export``: both models in Hugging Face format under ``data/models/<name>/{target,draft}``.
8. ``prompts``: held-out prompts (JSONL) for recording workloads.
9. ``card``: the model card.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from specgym.errors import SpecgymError
from specgym.io import atomic_write_text
from specgym.training.models.corpus import build_corpus, log
from specgym.training.models.export import export_pair
from specgym.training.models.grow import grow_gpt2
from specgym.training.models.pair_card import write_model_card
from specgym.training.models.tokenizer import heldout_prompts, tokenize_corpus, train_tokenizer
from specgym.training.models.train import ModelSpec, train_model

DEFAULT_WORK = Path("build") / "lm_pair"


STAGES = ("corpus", "tokenizer", "tokens", "grow", "target", "draft", "export", "prompts", "card")


def _spec(text: str, where: str) -> ModelSpec:
    try:
        n_layer, n_embd, n_head = (int(v) for v in text.split(","))
    except ValueError:
        raise SpecgymError(f"{where}: expected n_layer,n_embd,n_head (e.g. 6,256,4), got {text!r}") from None
    if n_embd % n_head:
        raise SpecgymError(f"{where}: n_embd {n_embd} is not divisible by n_head {n_head}")
    return ModelSpec(n_layer, n_embd, n_head)


def _copy_tokenizer(src: Path, work: Path) -> Path:
    from transformers import AutoTokenizer

    out = work / "tokenizer"
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(out))
    log.info("tokenizer: copied from %s", src)
    return out


def grow_stage(src: Path, work: Path, role: str, width: int, layers: int | None, noise: float) -> Path:
    """Grow the model in ``src`` into ``<work>/<role>_init`` (function-preserving up to ``noise``)."""
    import torch
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(str(src), dtype=torch.float32)
    grown = grow_gpt2(model, width, layers, noise=noise)
    out = work / f"{role}_init"
    grown.save_pretrained(str(out))
    log.info("grew %s (%.2fM parameters) into %s (%.2fM)", src, sum(p.numel() for p in model.parameters()) / 1e6,
             out, sum(p.numel() for p in grown.parameters()) / 1e6)
    return out


def run(args: Any) -> int:
    """Run the requested stages in order (``args``: the parsed options of ``specgym train-lm-pair``)."""
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise SpecgymError(f"--stages: unknown stage(s) {bad}; choose from {','.join(STAGES)}")
    if "grow" in stages and args.grow_from is None:
        raise SpecgymError("stage 'grow' needs --grow-from MODEL_FOLDER")
    for opt in ("target_budget_min", "draft_budget_min", "batch", "block", "target_lr", "draft_lr", "threads"):
        if getattr(args, opt) <= 0:
            raise SpecgymError(f"--{opt.replace('_', '-')} must be > 0, got {getattr(args, opt)}")
    work: Path = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    handlers.append(logging.FileHandler(args.log_file or work / "train.log"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", handlers=handlers, force=True)
    import torch

    torch.set_num_threads(args.threads)
    target_init = args.target_init
    if "corpus" in stages:
        build_corpus(work)
    if "tokenizer" in stages:
        if args.tokenizer_from:
            _copy_tokenizer(args.tokenizer_from, work)
        else:
            train_tokenizer(work, args.vocab_size)
    if "tokens" in stages:
        tokenize_corpus(work)
    if "grow" in stages:
        target_init = grow_stage(args.grow_from, work, args.target_role, args.grow_width, args.grow_layers,
                                 args.grow_noise)
    if "target" in stages:
        if target_init is None and (work / f"{args.target_role}_init").exists():
            target_init = work / f"{args.target_role}_init"
        train_model(work, args.target_role, _spec(args.target, "--target"), args.target_budget_min * 60,
                    args.target_batch or args.batch, args.block, args.target_lr, threads=args.threads,
                    precision=args.precision, init_from=target_init)
    if "draft" in stages:
        teacher = None if args.no_distill else (args.teacher or work / f"{args.target_role}_ckpt")
        train_model(work, args.draft_role, _spec(args.draft, "--draft"), args.draft_budget_min * 60, args.batch,
                    args.block, args.draft_lr, teacher_path=teacher, distill_alpha=args.distill_alpha,
                    threads=args.threads, precision=args.precision, init_from=args.draft_init)
    if "export" in stages:
        export_pair(work, args.name, target_role=args.target_role, draft_role=args.draft_role,
                    models_dir=args.models_dir)
    if "prompts" in stages:
        prompts = heldout_prompts(work, args.prompts_per_category, seed=args.prompts_seed,
                                  id_prefix=args.prompts_id_prefix)
        out = args.prompts_out or work / "prompts.jsonl"
        atomic_write_text(Path(out), "".join(json.dumps(p) + "\n" for p in prompts), overwrite=True)
        log.info("wrote %d held-out prompts to %s", len(prompts), out)
    if "card" in stages:
        workloads = [Path(w) for w in args.card_workloads.split(",") if w.strip()]
        card = write_model_card(args.models_dir / args.name, work, profile=args.card_profile, workloads=workloads,
                                figures=args.card_figures, notes=args.card_notes)
        log.info("wrote model card %s", card)
    return 0

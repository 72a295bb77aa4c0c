"""``specgym train-draft`` and ``specgym train-head``: the drafters specgym trains for a Llama-family target (the real
pair's): a distilled draft model (:mod:`specgym.training.models.draft_build`) and an EAGLE-style draft head
(:mod:`specgym.training.models.head_build`). Both learn from the target's answers: their own (``train-draft --stages
answers`` generates them for a prompts file) or a data folder's (``--data``, :mod:`specgym.training.models.
data_answers`: its train split, its val split held out)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import specgym.catalogue as catalogue
from specgym.commands.args import float_range, path_type, positive_int
from specgym.deps import require
from specgym.errors import SpecgymError
from specgym.io import check_output
from specgym.training.models.data_answers import DataSelection, check_data_folder
from specgym.training.models.distill import AnswerPlan, check_layers
from specgym.training.models.draft_build import STAGES, VOCAB_SIZES, DraftBuild, run
from specgym.training.models.head_build import STAGES as HEAD_STAGES
from specgym.training.models.head_build import HeadBuild
from specgym.training.models.head_build import run as run_head


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train-draft``."""
    p = sub.add_parser("train-draft", help="distil a draft model for a target on this CPU (long; one thread; "
                                           "resumable)")
    p.add_argument("--target", default="smollm2",
                   help="the target: a folder, a .gguf file or a shipped pair's target name (default %(default)s)")
    p.add_argument("--prompts", default=None,
                   help="prompts file whose lines name their split; the target answers its train and val prompts "
                        "(default smollm2-prompts; not with --data)")
    _add_data_arguments(p)
    p.add_argument("--work-dir", type=Path, default=Path("runs/draft-smollm2"),
                   help="answers and checkpoints; running again resumes (default %(default)s)")
    p.add_argument("--stages", default="answers,init,train,export",
                   help="comma-separated, in order, from answers,init,train,export (default %(default)s)")
    p.add_argument("--layers", default="0,1,2,3", help="target layers the draft starts from (default %(default)s)")
    p.add_argument("--budget-min", type=float_range(0, lo_open=True), default=60.0,
                   help="distillation wall-clock budget, minutes (default %(default)s)")
    p.add_argument("--samples", type=positive_int, default=None,
                   help="sampled answers per train prompt at each temperature above 0 (default 2; not with --data)")
    p.add_argument("--temperatures", default=None,
                   help="stage answers: the temperatures the target answers at, 0 = one greedy answer (default "
                        "0,0.7,1.0; not with --data)")
    p.add_argument("--seed", type=int, default=None,
                   help="stage answers: sampling seed (a second work folder with another seed adds answers for "
                        "`train-head --extra-answers`; default 0; not with --data)")
    p.add_argument("--out", type=Path, default=None, help="stage export: the draft folder to write")
    p.add_argument("--draft-vocab", type=positive_int, default=None, metavar="N",
                   help="stage export: restrict the draft's output layer to its N most frequent answer tokens (4096, "
                        "8192 or 16384; `specgym bench draft-vocab` measures the trade; default: full vocabulary)")
    p.add_argument("--force", action="store_true", help="replace an --out folder specgym wrote")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default %(default)s)")
    p.set_defaults(func=_run)
    _add_head_parser(sub)


def _add_head_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train-head``."""
    p = sub.add_parser("train-head", help="train a draft head on a target's hidden state on this CPU (one thread; "
                                          "resumable; needs train-draft's answers, or --data)")
    p.add_argument("--target", default="smollm2",
                   help="the target: a folder, a .gguf file or a shipped pair's target name (default %(default)s)")
    p.add_argument("--work-dir", type=Path, default=Path("runs/draft-smollm2"),
                   help="train-draft's work folder (its answers/ and answers_val/, unless --data); the head's "
                        "features and checkpoint go to its head/ (default %(default)s)")
    _add_data_arguments(p)
    p.add_argument("--stages", default="features,train,export",
                   help="comma-separated, in order, from features,train,export (default %(default)s)")
    p.add_argument("--mlp", type=positive_int, default=1536, help="width of the head's gated MLP (default %(default)s)")
    p.add_argument("--steps", type=positive_int, default=1500, help="optimiser steps (default %(default)s)")
    p.add_argument("--unroll", type=positive_int, default=3,
                   help="steps the head is unrolled from each start in training (default %(default)s)")
    p.add_argument("--extra-answers", type=Path, action="append", default=[], metavar="DIR",
                   help="another train-draft work folder whose answers/ the head also learns from (repeatable)")
    p.add_argument("--draft-vocab", type=positive_int, default=4096, metavar="N",
                   help="the head scores the N most frequent train-answer tokens (4096, 8192 or 16384; default "
                        "%(default)s)")
    p.add_argument("--out", type=Path, default=None, help="stage export: the head folder to write")
    p.add_argument("--force", action="store_true", help="replace an --out folder specgym wrote")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default %(default)s)")
    p.set_defaults(func=_run_head)


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    """``--data`` and the pick of its answers (the same options, and so the same answers, for both commands)."""
    p.add_argument("--data", type=path_type, default=None, metavar="DIR",
                   help="learn from the answers of a data folder `specgym data generate` wrote (its train split; its "
                        "val split's greedy answers held out) instead of answers generated here; its answers stage "
                        "must be finished")
    p.add_argument("--max-answers", type=positive_int, default=None, metavar="N",
                   help="with --data: learn from a seeded pick of N train answers (default: all)")
    p.add_argument("--max-val-answers", type=positive_int, default=None, metavar="N",
                   help="with --data: measure on a seeded pick of N val greedy answers (default: all)")


def _data(args: argparse.Namespace, given: dict[str, bool]) -> DataSelection | None:
    """The ``--data`` selection (None without ``--data``); options that only mean something with or without it are
    refused in one line."""
    if args.data is None:
        if args.max_answers is not None or args.max_val_answers is not None:
            raise SpecgymError("--max-answers and --max-val-answers pick a data folder's answers: give --data too")
        return None
    for name, is_given in given.items():
        if is_given:
            raise SpecgymError(f"--{name} with --data: the data folder's answers are used as written; drop --{name}")
    check_data_folder(args.data, args.target)  # an unfinished or another target's folder: refused before torch loads
    return DataSelection(args.data, args.max_answers, args.max_val_answers)


def _stages(text: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """The stages a ``--stages`` list names (they run in the order of ``known`` whatever order they are given in)."""
    stages = tuple(s.strip() for s in text.split(",") if s.strip())
    if not stages or any(s not in known for s in stages):
        raise SpecgymError(f"--stages {text!r}: choose from {','.join(known)}")
    return stages


def _run_head(args: argparse.Namespace) -> int:
    stages = _stages(args.stages, HEAD_STAGES)
    if args.draft_vocab not in VOCAB_SIZES:
        raise SpecgymError(f"--draft-vocab {args.draft_vocab}: choose one of {', '.join(map(str, VOCAB_SIZES))}")
    if "export" in stages:
        if args.out is None:
            raise SpecgymError("--stages includes export: give --out (the head folder to write)")
        check_output(args.out, args.force, "dir")
    require("hf", "train-head")
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    data = _data(args, {"extra-answers": bool(args.extra_answers)})
    build = HeadBuild(target=args.target, work=args.work_dir, mlp=args.mlp, steps=args.steps,
                      draft_vocab=args.draft_vocab, unroll=args.unroll, extra_answers=tuple(args.extra_answers),
                      data=data)
    report = run_head(build, stages, args.out, args.force)
    print(json.dumps(report, indent=2, default=str))
    return 0


def _run(args: argparse.Namespace) -> int:
    stages = _stages(args.stages, STAGES)
    data = _data(args, {"prompts": args.prompts is not None, "samples": args.samples is not None,
                        "temperatures": args.temperatures is not None, "seed": args.seed is not None})
    samples = 2 if args.samples is None else args.samples
    seed = 0 if args.seed is None else args.seed
    temps = "0,0.7,1.0" if args.temperatures is None else args.temperatures
    try:
        layers = [int(x) for x in args.layers.split(",")]
    except ValueError:
        raise SpecgymError(f"--layers {args.layers!r}: expected comma-separated layer indices, e.g. 0,1,2,3") from None
    check_layers(layers)  # the range against the target's depth is checked before the target is loaded
    if args.draft_vocab is not None and args.draft_vocab not in VOCAB_SIZES:
        raise SpecgymError(f"--draft-vocab {args.draft_vocab}: choose one of "
                           f"{', '.join(map(str, VOCAB_SIZES))}")
    if "export" in stages:
        if args.out is None:
            raise SpecgymError("--stages includes export: give --out (the draft folder to write)")
        check_output(args.out, args.force, "dir")
    try:
        temperatures = tuple(float(t) for t in temps.split(","))
    except ValueError:
        raise SpecgymError(f"--temperatures {temps!r}: expected comma-separated numbers, e.g. 0,0.7,1.0") from None
    if not temperatures or any(not math.isfinite(t) or t < 0 for t in temperatures):
        raise SpecgymError(f"--temperatures {temps!r}: temperatures are finite numbers, 0 (greedy) or positive")
    if len(set(temperatures)) != len(temperatures):
        raise SpecgymError(f"--temperatures {temps!r}: a temperature is named twice (its answers would be written "
                           f"and trained on twice); name each once")
    prompts = (str(data.folder / "prompts.jsonl") if data is not None
               else str(catalogue.resolve("prompts", args.prompts or "smollm2-prompts")))
    require("hf", "train-draft")
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    build = DraftBuild(target=args.target, prompts=prompts, work=args.work_dir, layers=layers,
                       budget_s=60.0 * args.budget_min, plan=AnswerPlan(temperatures, samples, seed=seed),
                       draft_vocab=args.draft_vocab, data=data)
    report = run(build, stages, args.out, args.force)
    print(json.dumps(report, indent=2, default=str))
    return 0

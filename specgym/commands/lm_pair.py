"""``specgym train-lm-pair``: build a shipped draft/target model pair (corpus, tokenizer, growth, training,
distillation, export, prompts, model card); see :mod:`specgym.training.lm_pair.build`."""

from __future__ import annotations

import argparse

from specgym.deps import require


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train-lm-pair``."""
    from specgym.training.lm_pair.build import add_arguments

    p = sub.add_parser("train-lm-pair", help="build a draft/target model pair on this CPU (long; one thread)")
    add_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    require("hf", "train-lm-pair")
    from specgym.training.lm_pair.build import run

    return run(args)

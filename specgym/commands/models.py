"""``specgym train-lm-pair``: build a shipped draft/target model pair (corpus, tokenizer, growth, training,
distillation, export, prompts, model card); see :mod:`specgym.training.models.pair_build`."""

from __future__ import annotations

import argparse
from pathlib import Path

from specgym.deps import require
from specgym.training.models.pair_build import DEFAULT_WORK, STAGES, run


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train-lm-pair``."""
    p = sub.add_parser("train-lm-pair", help="build a draft/target model pair on this CPU (long; one thread)")
    add_arguments(p)
    p.set_defaults(func=_run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``specgym train-lm-pair``."""
    p.add_argument("--stages", default="corpus,tokenizer,tokens,target,draft,export,prompts,card",
                   help=f"comma-separated, in order, from {','.join(STAGES)} (default: %(default)s)")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK,
                   help="artifacts and checkpoints (default %(default)s)")
    p.add_argument("--name", default="tinypair", help="the pair's folder under --models-dir (default %(default)s)")
    p.add_argument("--models-dir", type=Path, default=Path("data/models"), help="where 'export' writes")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary (default %(default)s)")
    p.add_argument("--tokenizer-from", type=Path, default=None,
                   help="stage 'tokenizer': copy this model folder's tokenizer instead of training one")
    p.add_argument("--target", default="6,256,4", help="target n_layer,n_embd,n_head (from scratch)")
    p.add_argument("--draft", default="1,128,2", help="draft n_layer,n_embd,n_head (from scratch)")
    p.add_argument("--target-role", default="target", help="checkpoint name of the target")
    p.add_argument("--draft-role", default="draft", help="checkpoint name of the draft (to train several)")
    p.add_argument("--grow-from", type=Path, default=None, help="stage 'grow': the trained model folder to grow")
    p.add_argument("--grow-width", type=int, default=2, help="stage 'grow': width multiplier (default %(default)s)")
    p.add_argument("--grow-layers", type=int, default=None, help="stage 'grow': total depth after growing")
    p.add_argument("--grow-noise", type=float, default=0.002, help="stage 'grow': symmetry-breaking noise")
    p.add_argument("--target-init", type=Path, default=None,
                   help="stage 'target': start from these weights (default: the grown model if 'grow' ran)")
    p.add_argument("--draft-init", type=Path, default=None, help="stage 'draft': start from these weights")
    p.add_argument("--teacher", type=Path, default=None,
                   help="stage 'draft': distil from this model (default: the target checkpoint)")
    p.add_argument("--distill-alpha", type=float, default=0.7, help="weight of the KL term (default %(default)s)")
    p.add_argument("--no-distill", action="store_true", help="train the draft on cross-entropy only")
    p.add_argument("--target-budget-min", type=float, default=78.0,
                   help="target training wall-clock budget, minutes (default %(default)s)")
    p.add_argument("--draft-budget-min", type=float, default=8.0,
                   help="draft training wall-clock budget, minutes (default %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default %(default)s)")
    p.add_argument("--target-batch", type=int, default=None, help="target's batch (default --batch)")
    p.add_argument("--block", type=int, default=512, help="tokens per sequence (default %(default)s)")
    p.add_argument("--target-lr", type=float, default=1.5e-3, help="target peak learning rate (default %(default)s)")
    p.add_argument("--draft-lr", type=float, default=3e-3, help="draft peak learning rate (default %(default)s)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="training precision: bf16 autocast only where the CPU has native bf16 (auto)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    p.add_argument("--log-file", type=Path, default=None, help="log file (default <work-dir>/train.log)")
    p.add_argument("--prompts-per-category", type=int, default=200,
                   help="stage 'prompts': prompts of each category (default %(default)s)")
    p.add_argument("--prompts-seed", type=int, default=0, help="stage 'prompts': sampling seed (default %(default)s)")
    p.add_argument("--prompts-id-prefix", default="", help="stage 'prompts': prefix of the prompt ids")
    p.add_argument("--prompts-out", type=Path, default=None, help="held-out prompts JSONL (stage 'prompts'; "
                   "default <work-dir>/prompts.jsonl)")
    p.add_argument("--card-profile", type=Path, default=None, help="stage 'card': the pair's measured profile")
    p.add_argument("--card-workloads", default="", help="stage 'card': comma-separated recorded workloads")
    p.add_argument("--card-figures", type=Path, default=None, help="stage 'card': live benchmark JSON")
    p.add_argument("--card-notes", type=Path, default=None, help="stage 'card': markdown with the pair's history")


def _run(args: argparse.Namespace) -> int:
    require("hf", "train-lm-pair")
    return run(args)

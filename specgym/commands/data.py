"""``specgym data generate``: prompts and answers the target writes, at scale and resumable
(:mod:`specgym.training.models.data_gen`); ``specgym data eval-prompts``: a frozen evaluation prompts file of a
finished data folder's val and test prompts, with its manifest (:mod:`specgym.training.models.eval_prompts`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specgym.commands.args import float_range, int_range, nonneg_int, parse_splits, path_type, positive_int
from specgym.deps import require
from specgym.errors import SpecgymError
from specgym.training.models.data_gen import DataConfig, check_output_folder, format_summary, generate
from specgym.training.models.eval_prompts import DEFAULT_PER_CATEGORY, EVAL_SPLITS, build, check_outputs, write
from specgym.training.models.magpie import CATEGORIES, check_categories


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``data``."""
    p = sub.add_parser("data", help="training data the target writes (Magpie prompts, its answers)")
    dsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    g = dsub.add_parser("generate", help="the target writes prompts (Magpie), then answers them greedily and "
                                         "sampled: de-duplicated, split by source, sharded, resumable")
    g.add_argument("--target", default="smollm2",
                   help="the target: a folder, a .gguf file or a shipped pair's target name (default %(default)s)")
    g.add_argument("--out", type=path_type, default=Path("build/data-smollm2"),
                   help="the data folder (default %(default)s)")
    g.add_argument("--prompts", type=positive_int, default=6000,
                   help="prompts kept after filters and de-duplication (default %(default)s)")
    g.add_argument("--oversample", type=float_range(1.0), default=1.4,
                   help="user turns sampled per prompt kept (default %(default)s)")
    g.add_argument("--categories", default="all",
                   help=f"comma-separated, from {','.join(CATEGORIES)}, or all (default %(default)s)")
    g.add_argument("--splits", default="0.8,0.1,0.1",
                   help="train,val,test fractions of the sources (default %(default)s)")
    g.add_argument("--max-new-tokens", type=positive_int, default=256, help="longest answer (default %(default)s)")
    g.add_argument("--samples", type=nonneg_int, default=1,
                   help="sampled answers per prompt besides the greedy one (default %(default)s)")
    g.add_argument("--temperature", type=float_range(0.0, lo_open=True), default=0.7,
                   help="the sampled answers' temperature (default %(default)s)")
    g.add_argument("--prompt-temperature", type=float_range(0.0, lo_open=True), default=0.7,
                   help="the user turns' sampling temperature (default %(default)s)")
    g.add_argument("--prompt-top-p", type=float_range(0.0, 1.0, lo_open=True), default=0.9,
                   help="the user turns' nucleus mass (default %(default)s)")
    g.add_argument("--per-passage", type=positive_int, default=2,
                   help="long-input prompts per passage (default %(default)s)")
    g.add_argument("--target-passages", type=float_range(0.0, 1.0), default=0.5,
                   help="fraction of passages the target writes; the rest are standard-library docstrings (PSF-2.0) "
                        "(default %(default)s)")
    g.add_argument("--batch", type=positive_int, default=32,
                   help="rows decoded side by side (continuous batching's slots; rows per generate call for a model "
                        "outside the Llama family) (default %(default)s)")
    g.add_argument("--shard-size", type=positive_int, default=64,
                   help="prompts per shard file, the unit of resumption (default %(default)s)")
    g.add_argument("--seed", type=nonneg_int, default=0, help="seed of every draw (default %(default)s)")
    g.add_argument("--answer-prompts", type=nonneg_int, default=0, metavar="N",
                   help="answer only the first N prompts (whole shards; the prompts file takes the categories in turn "
                        "and mixes the splits); 0: every prompt; the one option --resume may change (raise it to "
                        "answer more) (default %(default)s)")
    g.add_argument("--workers", type=int_range(1, 64), default=2,
                   help="processes of one torch thread each (default %(default)s: both cores here)")
    g.add_argument("--resume", action="store_true", help="continue an existing data folder (same options)")
    g.add_argument("--force", action="store_true", help="start an existing data folder over (specgym's files only)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.set_defaults(func=_generate)
    e = dsub.add_parser("eval-prompts", help="a frozen evaluation prompts file: a finished data folder's val and test "
                                             "prompts, sampled per category, with a manifest (hashes, seed, counts)")
    e.add_argument("--data", type=path_type, default=Path("build/data-smollm2"), metavar="DIR",
                   help="the finished data folder (default %(default)s)")
    e.add_argument("--out", type=path_type, required=True, metavar="FILE",
                   help="the prompts file to write (.jsonl); its manifest goes beside it as NAME.manifest.json")
    e.add_argument("--per-category", type=positive_int, default=DEFAULT_PER_CATEGORY, metavar="N",
                   help="prompts per category of each split, val and test (default %(default)s)")
    e.add_argument("--seed", type=nonneg_int, default=0, metavar="S", help="the sample's seed (default %(default)s)")
    e.add_argument("--force", action="store_true", help="replace --out and its manifest")
    e.set_defaults(func=_eval_prompts)


def _generate(args: argparse.Namespace) -> int:
    categories = check_categories([c.strip() for c in args.categories.split(",") if c.strip()])
    try:
        splits = parse_splits(args.splits)
    except SpecgymError as exc:
        raise SpecgymError(f"{exc}: e.g. --splits 0.8,0.1,0.1") from None
    cfg = DataConfig(target=args.target, prompts=args.prompts, oversample=args.oversample, categories=categories,
                     splits=splits, max_new_tokens=args.max_new_tokens, samples=args.samples,
                     temperature=args.temperature, prompt_temperature=args.prompt_temperature,
                     prompt_top_p=args.prompt_top_p, per_passage=args.per_passage,
                     target_passages=args.target_passages, batch=args.batch, shard_size=args.shard_size,
                     seed=args.seed, answer_prompts=args.answer_prompts).check()
    check_output_folder(args.out, cfg, args.resume, args.force)  # before torch is imported: a refusal is instant
    require("hf", "data generate")
    summary = generate(cfg, args.out, workers=args.workers, resume=args.resume, force=args.force, quiet=args.quiet)
    print(format_summary(summary))
    print(json.dumps({"summary": str(Path(args.out) / "summary.json")}))
    return 0


def _eval_prompts(args: argparse.Namespace) -> int:
    check_outputs(args.out, args.force)  # an existing --out is refused before the data folder is read
    ev = build(args.data, per_category=args.per_category, seed=args.seed)
    command = (f"specgym data eval-prompts --data {args.data} --out {args.out} --per-category {args.per_category} "
               f"--seed {args.seed}")
    man_path = write(ev, args.out, force=args.force, command=command)
    man = ev.manifest
    for lk in ev.excluded:
        print(f"left out (leak): {lk.line()}")
    per_split = ", ".join(f"{s} {sum(man['counts'][s].values())}" for s in EVAL_SPLITS)
    print(f"wrote {args.out}: {man['prompts']} prompts ({per_split}; at most {args.per_category} per category, "
          f"seed {args.seed}) from {args.data} (config sha256 {man['data']['config_sha256'][:12]}); sha256 "
          f"{man['sha256'][:12]}; {len(ev.excluded)} leak(s) left out")
    print(json.dumps({"prompts": str(args.out), "manifest": str(man_path)}))
    return 0

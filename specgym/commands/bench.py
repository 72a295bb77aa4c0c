"""``specgym bench``: speed benchmarks that print figures (and ratios to their targets)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import specgym.catalogue as catalogue
from specgym.commands.args import k_max_type, positive_int
from specgym.console import make_console
from specgym.envs.workloads.specdecode import input_files
from specgym.errors import SpecgymError
from specgym.eval.bench import DEFAULT_SECTIONS, SECTIONS, section
from specgym.eval.bench.live import DEFAULT_PER_CATEGORY, DEFAULT_REPEATS, live_config
from specgym.eval.bench.machine import machine_calibration, machine_line
from specgym.io import atomic_write_text, check_output
from specgym.paths import default_workload_name


def _count(default: int, what: str) -> dict[str, Any]:
    """The keywords of a positive-count flag whose help ends with its default."""
    return dict(type=positive_int, default=default, help=f"{what} (default %(default)s)")


#: Each section's own flags: ``section -> [(flag, dest, add_argument keywords)]``. The dest keeps the section's
#: prefix (``vllm_concurrency``) so the section code reads one namespace; the flag does not (``specgym bench vllm
#: --concurrency``). Sections not named here take only the common flags (``--workload``, ``--json``).
SECTION_FLAGS: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    "eval": [("--requests", "eval_requests", dict(
        type=positive_int, default=10_000,
        help="requests of synthetic speclane-mix for the evaluation-speed section (default %(default)s)"))],
    "policy": [("--policy", "policy", dict(default=None, help="exported policy (name or folder)"))],
    "live": [
        ("--prompts", "live_prompts", dict(type=positive_int, default=DEFAULT_PER_CATEGORY,
                                           help="test prompts per category (default %(default)s)")),
        ("--repeats", "live_repeats", dict(type=positive_int, default=DEFAULT_REPEATS,
                                           help="runs of every (prompt, controller); a prompt's time is their median "
                                                "(default %(default)s)")),
        ("--controllers", "live_controllers", dict(
            default=None, help="comma-separated controller specs (default: plain, fixed:1..6, every baseline, the "
                               "pair's predictor, every shipped policy, and on a greedy workload with ranks the trees "
                               "tree-sequoia, tree-static:2-2-1, tree-static:3-2-1, tree-eagle; tree specs "
                               "(tree-static:W1-W2-.., tree-sequoia[:BUDGET], tree-eagle[:D:B:M], tree-chain:SPEC) "
                               "decode with live tree verification; plain decoding is always added, and fixed:1 "
                               "when no fixed K is named)")),
        ("--profile", "live_profile", dict(default=None, help="cost profile (name or path) for controllers and the "
                                                              "replay prediction (default: fit one to the engine's "
                                                              "rounds on this machine first)")),
        ("--draft", "live_draft", dict(default=None, help="your draft model (folder or hub name; default: the pair "
                                                          "the workload was recorded from)")),
        ("--target", "live_target", dict(default=None, help="your target model (with --draft)")),
        ("--device", "live_device", dict(default="cpu", help="cpu, cuda, cuda:1 ... (default %(default)s)")),
    ],
    "scale": [
        ("--requests", "scale_requests", dict(type=positive_int, default=1_000_000,
                                              help="requests of the synthetic sharded workload (default %(default)s)")),
        ("--shard-requests", "scale_shard_requests", _count(20_000, "requests per shard")),
        ("--dir", "scale_dir", dict(type=Path, default=None, help="where the synthetic sharded workload is written "
                                                                  "and reused (default out/scale-synthetic-N)")),
        ("--record-prompts", "scale_record_prompts", dict(
            type=positive_int, default=32, help="prompts recorded with 1 process and with Ray workers (default "
                                                "%(default)s)")),
        ("--record-workers", "scale_record_workers", _count(2, "Ray workers of the recording comparison")),
    ],
    "vllm": [
        ("--concurrency", "vllm_concurrency", dict(default="1,4,16", help="concurrent sequences (default "
                                                                          "%(default)s)")),
        ("--k-max", "vllm_k_max", dict(type=k_max_type, default=6,
                                       help="num_speculative_tokens: fixed K = 0..this, and the largest K of the "
                                            "table and plugin (default %(default)s)")),
        ("--requests", "vllm_requests", _count(8, "test requests per run (at least 2 x the concurrency)")),
        ("--max-tokens", "vllm_max_tokens", dict(type=positive_int, default=None,
                                                 help="cut every request to this many new tokens (default: the "
                                                      "recorded lengths)")),
        ("--repeats", "vllm_repeats", _count(3, "repetitions of every (concurrency, policy) run, interleaved")),
        ("--plugins", "vllm_plugins", dict(default="goodput", help="batch controller specs run inside vLLM by "
                                                                   "specgym's plugin, comma-separated (default "
                                                                   "%(default)s)")),
        ("--no-mixed", "vllm_no_mixed", dict(action="store_true", help="skip the mixed-concurrency runs")),
        ("--mixed", "vllm_mixed", dict(default="mixed,phased",
                                       help="mixed-concurrency cells, comma-separated: mixed (the concurrency changes "
                                            "with the clock, --mixed-segment-ms per concurrency) and phased (each "
                                            "concurrency serves its own cell's requests, one phase after another) "
                                            "(default %(default)s)")),
        ("--mixed-requests", "vllm_mixed_requests", _count(32, "requests of a mixed-concurrency run")),
        ("--mixed-segment-ms", "vllm_mixed_segment_ms", _count(4000, "duration of each concurrency segment of the "
                                                                     "mixed runs, ms")),
        ("--profile", "vllm_profile", dict(default=None, help="a vLLM-measured batched profile to use (default: "
                                                              "measure one first, on train prompts)")),
        ("--profile-batches", "vllm_profile_batches", dict(default="1,2,4,8,16", help="batch sizes of the measured "
                                                                                      "profile (default "
                                                                                      "%(default)s)")),
        ("--profile-tokens", "vllm_profile_tokens", _count(48, "new tokens per request of the profiling runs")),
        ("--profile-repeats", "vllm_profile_repeats", dict(
            type=positive_int, default=1, help="profiling runs per (batch, K) cell before the runs (default "
                                               "%(default)s; one more pass follows every repetition, for the "
                                               "prediction)")),
        ("--eager", "vllm_eager", dict(action="store_true",
                                       help="enforce_eager: no torch.compile (faster engine start, slower steps)")),
        ("--out", "vllm_out", dict(type=Path, default=Path("out/bench-vllm"),
                                   help="folder of the measured profile, plots and vllm.json (vllm-proposer.json "
                                        "with --proposer specgym) (default %(default)s)")),
        ("--proposer", "vllm_proposer", dict(
            choices=("draft_model", "specgym"), default="draft_model",
            help="draft_model: vLLM's draft_model proposer with K per step (fixed K, specgym's table, the plugin) "
                 "on the default pair; specgym: specgym's custom proposer (K per request, --controllers) against "
                 "no speculation, vLLM's ngram at --ngram-k and vLLM's draft_model at --draft-k, on the real pair "
                 "(--workload default smollm2-greedy; --k-max, --plugins, --mixed and --profile* do not apply) "
                 "(default %(default)s)")),
        ("--ngram-k", "vllm_ngram_k", dict(default="2,3,4,5,6,7,8",
                                           help="--proposer specgym: the K of vLLM's ngram rows; the largest is the "
                                                "proposer's num_speculative_tokens (default %(default)s)")),
        ("--draft-k", "vllm_draft_k", dict(
            default="2,3,4", help="--proposer specgym: the K of vLLM's draft_model rows (draft:K, the pair's draft; "
                                  "one engine at the largest K); empty or none skips them, and they are skipped with "
                                  "one line where vLLM cannot build that engine here (default %(default)s)")),
        ("--controllers", "vllm_controllers", dict(
            default="batch-marginal,marginal@ngram,drafter-marginal,fixed:0@ngram",
            help="--proposer specgym: drafter specs that specgym's proposer runs over its two drafters (ngram and "
                 "the pair's draft model), one row each: batch-marginal named bare chooses every row's lookup K "
                 "together on step costs measured first in the proposer's engine (proposer-steps.json, a batched "
                 "cost profile); drafter-marginal named bare gets a run predictor fitted on "
                 "the workload's fit split; lookup-rule:N drafts with the model where the lookup finds no N-token "
                 "match; fixed:0@ngram chooses K = 0 for every request (default %(default)s)")),
        ("--proposer-profile", "vllm_proposer_profile", dict(
            default=None, help="--proposer specgym: the single-request cost profile (name or path) the proposer's "
                               "controller prices rounds with (default: cpu-PAIR)")),
    ],
}
_DATA_FLAG = ("--data", "data", dict(type=Path, default=None,
                                     help="your copy of SpecDecode-Bench's published traces (the folder of "
                                          "combined_<dataset>.jsonl files, or one file)"))
SECTION_FLAGS["specdecode-bench"] = SECTION_FLAGS["specdecode-eval"] = [_DATA_FLAG]
SECTION_FLAGS["draft-vocab"] = [
    ("--pair", "vocab_pair", dict(default="smollm2", help="a shipped pair whose draft ships draft-vocab-N.json lists "
                                                          "(default %(default)s)")),
    ("--tokens", "vocab_tokens", _count(48, "one-token forwards timed per run")),
    ("--repeats", "vocab_repeats", _count(5, "runs; the median is reported")),
]
SECTION_HELP = {"vllm": "real vLLM on this CPU; run from the vLLM environment (make vllm-env)",
                "live": "the live engine: measured tok/s of every controller vs replay's prediction",
                "scale": "the sharded workload at scale and recording on Ray workers",
                "draft-vocab": "a draft token's cost with its full and reduced output layers, beside a target token "
                               "and the held-out acceptance of each (the real pair)"}
#: the spellings before sub-commands (``--vllm-concurrency``, ``--live-prompts``, ``--eval-requests`` ...) -> the
#: sub-command and flag that replace them; refused with that pointer.
OLD_FLAGS: dict[str, tuple[str, str]] = {
    "--" + dest.replace("_", "-") if dest not in ("policy", "data") else flag: (section, flag)
    for section, flags in SECTION_FLAGS.items() for flag, dest, _ in flags
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``bench`` and one sub-command per section, each with its own flags."""
    p = sub.add_parser("bench", help="speed benchmarks (env, replay, controllers, evaluation, live engine); "
                                     "`specgym bench SECTION --help` for one section's flags")
    defaults = {dest: kw.get("default", False if kw.get("action") == "store_true" else None)
                for flags in SECTION_FLAGS.values() for _, dest, kw in flags}
    _common(p, None)
    _old_spellings(p)
    p.set_defaults(func=_run, section=None, **defaults)
    sections = p.add_subparsers(dest="section", metavar="SECTION",
                                help=f"one section (default: {','.join(DEFAULT_SECTIONS)} in turn)")
    for name in SECTIONS:
        sp = sections.add_parser(name, help=SECTION_HELP.get(name, f"the {name} section"))
        _common(sp, argparse.SUPPRESS)  # given after the section name; SUPPRESS keeps one given before it
        for flag, dest, kw in SECTION_FLAGS.get(name, []):
            sp.add_argument(flag, dest=dest, **({"metavar": flag[2:].upper().replace("-", "_")} | kw
                                                if kw.get("action") != "store_true" else kw))
        _old_spellings(sp)
        sp.set_defaults(func=_run, command=f"bench {name}")  # errors say `specgym bench live: error: ...`


def _common(p: argparse.ArgumentParser, default: Any) -> None:
    p.add_argument("--workload", default=default, help="workload name or path (default: the default workload)")
    p.add_argument("--json", type=Path, default=default, help="also write the figures as JSON here")
    p.add_argument("--force", action="store_true", default=False if default is None else default,
                   help="replace an existing --json file (and bench vllm's earlier results in --out)")


def _old_spellings(p: argparse.ArgumentParser) -> None:
    """The flags of the one-command ``bench``, accepted only to be refused with a pointer (hidden from --help)."""
    p.add_argument("--sections", dest="old_sections", default=None, help=argparse.SUPPRESS)
    for old in OLD_FLAGS:
        if old not in {a for act in p._actions for a in act.option_strings}:
            p.add_argument(old, dest="old_flag", nargs="?", const=old, default=None, type=_named(old),
                           help=argparse.SUPPRESS)


def _named(old: str) -> Callable[[str], str]:
    """An argparse type that records which old flag was given (its value is dropped: the flag is refused)."""
    return lambda _value: old


def _run(args: argparse.Namespace) -> int:
    if args.old_sections is not None:
        first = next((x.strip() for x in args.old_sections.split(",") if x.strip() in SECTIONS), "load")
        raise SpecgymError(f"--sections is gone: each section is a sub-command with its own flags (specgym bench "
                           f"{first} ...; `specgym bench --help` lists them)")
    if args.old_flag is not None:
        where, flag = OLD_FLAGS[args.old_flag]
        raise SpecgymError(f"{args.old_flag} is gone: run `specgym bench {where} {flag} ...` (each section is a "
                           f"sub-command with its own flags)")
    sections = [args.section] if args.section else list(DEFAULT_SECTIONS)
    console = make_console()
    workload = args.workload or default_workload_name()
    catalogue.resolve("workload", workload)
    if args.json:  # an earlier figures file is replaced only with --force; never a folder, device or link
        check_output(args.json, args.force, "file", "--json", "pass --force to replace it", suffixes=(".json",))
    vllm_json = Path(args.vllm_out) / ("vllm-proposer.json" if args.vllm_proposer == "specgym" else "vllm.json")
    if "vllm" in sections and vllm_json.exists() and not args.force:
        raise SpecgymError(f"--out {args.vllm_out}: holds an earlier run's {vllm_json.name} (pass --force to replace "
                           f"its results, or name another --out)")
    if "live" in sections:  # every live option checked once, before anything runs; the live section runs this
        args.live_config = live_config(args, workload)
    if any(s.startswith("specdecode") for s in sections):
        if args.data is None:
            raise SpecgymError(f"bench {sections[0]} needs --data DIR (a copy of SpecDecode-Bench's "
                               f"data/llama3.1-8B folder)")
        input_files(args.data)  # a missing folder fails before anything runs
    machine = machine_calibration()
    figures: dict[str, Any] = {"workload": workload, "cpu_count": os.cpu_count(), "machine": machine}
    console.print(f"[bold]specgym bench[/bold] on workload {workload}")
    console.print(machine_line(machine), highlight=False)
    for name in sections:
        figures.update(section(name)(args, workload, console))
    if args.json:
        atomic_write_text(args.json, json.dumps(figures, indent=2, default=float) + "\n", overwrite=args.force)
    return 0

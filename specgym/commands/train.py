"""``specgym train`` and ``specgym export``: PPO training runs and their deployable artifacts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import specgym.catalogue as catalogue
from specgym.agents.artifact import load_policy, policy_mode
from specgym.agents.modes import MODES
from specgym.agents.sglang_export import SGLANG_MAX_BATCH, require_batch_policy, write_sglang_module
from specgym.commands.args import int_range, k_max_type, nonneg_int, path_type, positive_int
from specgym.deps import require
from specgym.envs.core.kinds import MODE_NAMES
from specgym.envs.profiles import load_batch_profile
from specgym.errors import SpecgymError
from specgym.io import check_output
from specgym.paths import default_workload_name
from specgym.training.config import RunConfig, parse_overrides
from specgym.training.export import check_deployable, export_run, load_run_model, run_artifact, run_metrics
from specgym.training.ppo import TrainRequest, train
from specgym.training.run import load_run_predictor
from specgym.training.run_folder import RunFiles


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``train`` and ``export``."""
    p = sub.add_parser("train", help="train a PPO policy (stable-baselines3) on a workload's train split")
    p.add_argument("--workload", default=None, help="workload name or .parquet path (default: the default workload)")
    p.add_argument("--mode", choices=MODE_NAMES, default=None,
                   help="k: choose K per round; token: continue/stop after each draft token; batch: the K of each "
                        "serving step of a batch (specgym/SpecDecodeBatch-v0); tree: the draft tree of each round "
                        "(specgym/SpecDecodeTree-v0, greedy traces with ranks; priced with gpu-like-published unless "
                        "--hyperparams profile=...); drafter: the drafter and K of each round "
                        "(specgym/SpecDecodeDrafter-v0, a workload with two drafters) (default k)")
    p.add_argument("--timesteps", type=positive_int, default=None,
                   help="total env steps, a multiple of the config's n_envs (16); the run stops exactly there "
                        "(default: the config's)")
    p.add_argument("--k-max", type=k_max_type, default=None,
                   help="largest draft cap, 1..16 (default: the config's, 8)")
    p.add_argument("--domains", choices=("generalist",), default=None,
                   help="train on a domain-randomised distribution (workloads x cost profiles) instead of one "
                        "workload: 'generalist' (see envs/workloads/domains.py)")
    p.add_argument("--seed", type=nonneg_int, default=None, help="training seed (default 0)")
    p.add_argument("--out", type=path_type, default=None, help="run folder (default runs/WORKLOAD-MODE)")
    p.add_argument("--config", default=None, help="hyperparameter YAML (default training/configs/MODE.yaml)")
    p.add_argument("--hyperparams", nargs="+", default=None, metavar="KEY=VALUE",
                   help="override hyperparameters, e.g. learning_rate=1e-4 net_arch=[128,128]")
    p.add_argument("--init-from", default=None, metavar="SPEC",
                   help="behaviour-clone the actor from a baseline (e.g. confidence:0.4) before PPO "
                        "(config key bc_init; 'none' disables a config's bc_init)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted/finished run in --out, as it was configured (only --timesteps may "
                        "change: a larger target extends it)")
    p.add_argument("--force", action="store_true", help="replace an existing run folder")
    p.set_defaults(func=_train)

    e = sub.add_parser("export", help="export a training run to a pickle-free policy artifact (npz + json), or a "
                                      "batch policy to a self-contained SGLang policy module (--to sglang)")
    e.add_argument("run", type=path_type,
                   help="run folder written by 'specgym train' (--to sglang: or an exported batch policy folder)")
    e.add_argument("--to", choices=("artifact", "sglang"), default="artifact",
                   help="artifact: policy.json + policy.npz (default); sglang: one numpy-only .py module whose "
                        "make_policy() is SGLang's AdaptiveSpecPolicy (docs/guides/sglang.md)")
    e.add_argument("--profile", default=None,
                   help="--to sglang: the batched cost profile (name or JSON path) the policy prices steps with, "
                        "measured where SGLang runs (required)")
    e.add_argument("--candidate-steps", default=None,
                   help="--to sglang: comma-separated step counts SGLang builds runtime states for (default 0..k_max)")
    e.add_argument("--max-batch", type=int_range(1, SGLANG_MAX_BATCH), default=512,
                   help=f"--to sglang: batch sizes the profile is tabulated at, 1..N, N <= {SGLANG_MAX_BATCH} "
                        f"(default %(default)s)")
    e.add_argument("--out", type=path_type, default=None,
                   help="artifact folder (default RUN/policy); --to sglang: the .py file (default "
                        "RUN/sglang_policy.py)")
    e.add_argument("--which", choices=("best", "final"), default="best",
                   help="best model by validation speedup (default) or the final one")
    e.add_argument("--force", action="store_true",
                   help="replace an existing artifact folder or module; and export a policy its validation found "
                        "below the best fixed K or its teacher (the export then carries the warning)")
    e.set_defaults(func=_export)


def _overrides(args: argparse.Namespace) -> dict:
    over = parse_overrides(args.hyperparams)
    if args.domains is not None:
        over["domains"] = args.domains
    if args.k_max is not None:
        over["k_max"] = args.k_max
    if args.init_from is not None:
        over["bc_init"] = None if args.init_from.lower() == "none" else args.init_from
    return over


def _train(args: argparse.Namespace) -> int:
    require("train", "training")
    if args.resume and args.out is None:
        raise SpecgymError("--resume needs --out RUN_FOLDER")
    if args.domains is not None and args.workload is not None:
        raise SpecgymError(f"--domains {args.domains} trains on its own workloads x profiles: drop --workload "
                           f"{args.workload}")
    if args.resume:
        _check_resume_options(args, args.out)
    workload = args.workload or default_workload_name()
    mode = args.mode or "k"
    out = args.out or Path("runs") / f"{args.domains or Path(workload).stem}-{mode}"
    req = TrainRequest(workload=workload, mode=mode, out=out, timesteps=args.timesteps,
                       seed=0 if args.seed is None else args.seed,
                       config_file=args.config, overrides=_overrides(args), resume=args.resume,
                       force=args.force)
    train(req)
    print(f"run folder: {out}  (summary.md, tensorboard: tensorboard --logdir {out.parent})")
    return 0  # a policy below the best fixed K is reported in the summary (bold red), not as a failure


def _check_resume_options(args: argparse.Namespace, out: Path) -> None:
    """``--resume`` continues a run as it was configured: an option that would change it is refused, not ignored
    (the same value as the run's is fine)."""
    for opt, value in (("--config", args.config), ("--hyperparams", args.hyperparams), ("--init-from", args.init_from)):
        if value is not None:
            raise SpecgymError(f"{opt}: not with --resume (the run continues as {out / 'config.yaml'} says; start a "
                               f"new run with another --out to change it)")
    config = out / "config.yaml"
    if not config.is_file():
        return  # the resume itself says there is nothing to resume
    cfg = RunConfig.from_file(config)
    same_workload = True
    if args.workload is not None:
        try:
            same_workload = (catalogue.resolve("workload", args.workload).resolve()
                             == catalogue.resolve("workload", cfg.workload_path).resolve())
        except SpecgymError:
            same_workload = False
    for opt, value, current, same in (
            ("--workload", args.workload, cfg.workload_path, same_workload),
            ("--mode", args.mode, cfg.mode, args.mode in (None, cfg.mode)),
            ("--seed", args.seed, cfg.seed, args.seed in (None, cfg.seed)),
            ("--k-max", args.k_max, cfg.ppo.k_max, args.k_max in (None, cfg.ppo.k_max)),
            ("--domains", args.domains, cfg.ppo.domains, args.domains in (None, cfg.ppo.domains))):
        if not same:
            raise SpecgymError(f"{opt} {value}: the run in {out} was started with {opt} {current}; --resume "
                               f"continues it as configured (start a new run with another --out)")


def _export(args: argparse.Namespace) -> int:
    if args.to == "sglang":
        return _export_sglang(args)
    for opt in ("profile", "candidate_steps"):
        if getattr(args, opt) is not None:
            raise SpecgymError(f"--{opt.replace('_', '-')}: with --to sglang only")
    _refuse_shipped_name(args.run, "export")
    require("train", "training")
    out = export_run(args.run, args.out, which=args.which, overwrite=args.force, force=args.force)
    mode = MODES.get(json.loads((Path(out) / "policy.json").read_text()).get("mode"))
    spec = mode.spec_prefix if mode else "ppo"
    print(f"exported policy: {out}/policy.json + policy.npz (use it as {spec}:{out})")
    return 0


def _export_sglang(args: argparse.Namespace) -> int:
    """``specgym export --to sglang``: a batch policy (an exported folder, or a run's) as one SGLang module."""
    if args.profile is None:
        raise SpecgymError("--to sglang needs --profile: the batched cost profile the policy prices steps with "
                           "(e.g. the one `specgym profile --batch-sizes` measures where SGLang runs)")
    steps = None
    if args.candidate_steps is not None:
        try:
            steps = [int(s) for s in args.candidate_steps.split(",") if s.strip()]
        except ValueError:
            raise SpecgymError(f"--candidate-steps: comma-separated integers, got {args.candidate_steps!r}") from None
        if steps and max(steps) < 1:
            raise SpecgymError(f"--candidate-steps {args.candidate_steps}: the module could only choose no "
                               f"speculation; name at least one step of 1 or more")
    folder = Path(args.run)
    if not folder.exists() and str(args.run) in catalogue.names("policy"):  # a shipped policy named by its name
        folder = catalogue.resolve("policy", str(args.run))
        shipped = load_policy(folder)
        require_batch_policy(shipped, f"{args.run}: a shipped policy of mode {shipped.mode}")
        if args.out is None:
            raise SpecgymError(f"{args.run}: a shipped policy: name the module to write with --out FILE.py")
    out = check_output(args.out or folder / "sglang_policy.py", args.force, "file")
    profile = load_batch_profile(args.profile)
    if (folder / "policy.json").is_file():
        art = load_policy(folder)
        what = str(args.run)
    elif (folder / "policy" / "policy.json").is_file():
        art = load_policy(folder / "policy")
        what = str(folder / "policy")
    else:
        require("train", "training")
        run = RunFiles(folder)
        model, vecnorm, picked, cfg = load_run_model(run, args.which)
        art = run_artifact(model, vecnorm, cfg, load_run_predictor(cfg),
                           {"training": {"run": folder.resolve().name}, "metrics": run_metrics(run, picked) or {}})
        what = f"{args.run} ({picked} model)"
    require_batch_policy(art)
    warning = check_deployable(art.meta.get("metrics"), art.mode, what, args.force)
    if art.teacher is None:
        print(f"note: {what} carries no training range (exported before batch policies recorded one): the module "
              f"has no guard; export its run folder instead to give it one", file=sys.stderr)
    write_sglang_module(art, profile, out, steps, args.max_batch, overwrite=args.force, warning=warning)
    print(f"exported SGLang policy module: {out} (numpy only; make_policy(initial_steps=N) is the "
          f"AdaptiveSpecPolicy; see docs/guides/sglang.md)")
    return 0


def _refuse_shipped_name(run: Path, command: str) -> None:
    """A shipped policy's name given where a run folder is expected: say what it is (not "not a training run")."""
    if not run.exists() and str(run) in catalogue.names("policy"):
        mode = MODES.get(policy_mode(catalogue.resolve("policy", str(run))) or "")
        raise SpecgymError(f"{run}: a shipped policy of mode {mode.name if mode else '?'}, already exported; "
                           f"{command} takes a run folder written by 'specgym train' (use the policy as "
                           f"{mode.spec_prefix if mode else 'ppo'}:{run})")

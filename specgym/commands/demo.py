"""``specgym demo`` (``make demo``): the whole story on the shipped default workload in a few minutes.

1. Train a PPO policy in K mode (and in token mode unless ``--no-token``) with a small budget on the train split
   (``specgym train``), keeping the best model by validation speedup.
2. Export each to a pickle-free artifact (``specgym export``), with ``--force``: a policy its validation found below
   the best fixed K is exported anyway, with the warning in its ``policy.json``, so the demo can evaluate it.
3. Evaluate them with every baseline, the fixed-K references and the oracle on the test split, through the same
   code path as ``specgym eval`` (report, JSON, plots).
4. Print the table and where everything is.

Everything goes into one folder, ``runs/demo-WORKLOAD/`` (``k/``, ``token/``, ``report/``). An existing demo folder
is refused unless ``--force``, which replaces the whole folder (so no stale run of an earlier demo is left beside
the new one) — only if specgym wrote everything in it (a user's file there is a one-line refusal, nothing deleted).
``make demo`` passes ``--force``, so it runs again after a finished or an interrupted demo.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specgym.agents.artifact import load_policy
from specgym.commands.args import nonneg_int, path_type, positive_int
from specgym.commands.eval import eval_to_folder
from specgym.console import make_console
from specgym.deps import require
from specgym.envs.workloads.trace_format import cached_workload
from specgym.io import check_output, make_owned_dir, remove_owned
from specgym.paths import default_workload_name
from specgym.training.export import export_run
from specgym.training.ppo import TrainRequest, train

DEFAULT_STEPS = {"k": 300_000, "token": 800_000}  # ~2-3 min in all on 2 busy cores


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``demo``."""
    p = sub.add_parser("demo", help="train, export and evaluate PPO policies on the shipped default workload")
    p.add_argument("--workload", default=None, help="workload name or path (default: the default workload)")
    p.add_argument("--k-steps", type=positive_int, default=DEFAULT_STEPS["k"],
                   help="K-mode training timesteps (default %(default)s)")
    p.add_argument("--token-steps", type=positive_int, default=DEFAULT_STEPS["token"],
                   help="token-mode training timesteps (default %(default)s)")
    p.add_argument("--no-token", action="store_true", help="train the K-mode policy only")
    p.add_argument("--out", type=path_type, default=None, help="the demo folder (default runs/demo-WORKLOAD)")
    p.add_argument("--force", action="store_true", help="replace an existing demo folder")
    p.add_argument("--seed", type=nonneg_int, default=0, help="training seed (default %(default)s)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    require("train", "specgym demo")
    console = make_console(stderr=True)
    t_start = time.perf_counter()
    workload = args.workload or default_workload_name()
    wl = cached_workload(workload)
    stem = Path(workload).stem
    root = args.out or Path("runs") / f"demo-{stem}"
    check_output(root, args.force, hint="pass --force to replace the whole demo folder, or --out")
    if root.exists():
        remove_owned(root)
    make_owned_dir(root, "specgym demo", [])  # k/, token/ and report/ carry their own markers
    modes = ["k"] if args.no_token else ["k", "token"]
    steps = {"k": args.k_steps, "token": args.token_steps}
    runs = {m: root / m for m in modes}

    console.rule(f"[bold]specgym demo[/bold]: {wl.label}")
    summaries = {}
    for i, mode in enumerate(modes, 1):
        console.print(f"\n[bold]{i}. train PPO, {mode} mode[/bold] ({steps[mode]:,} timesteps, train split; "
                      f"validation on the val split)", highlight=False)
        summaries[mode] = train(TrainRequest(workload=workload, mode=mode, out=runs[mode], timesteps=steps[mode],
                                             seed=args.seed), console)
        # forced: the demo evaluates what its small budget trained even below the best fixed K (the export then
        # says so on stderr and in policy.json, and the verdicts at the end repeat it)
        export_run(runs[mode], runs[mode] / "policy", force=True)
        below = " (forced: below the best fixed K, evaluated anyway; do not deploy it)" \
            if summaries[mode]["below_best_fixed"] else ""
        console.print(f"exported: {runs[mode] / 'policy'}{below}", highlight=False)

    k_max = max(load_policy(runs[m] / "policy").k_max for m in modes)  # the cap the policies were trained for
    console.print(f"\n[bold]{len(modes) + 1}. evaluate on the test split[/bold] (every baseline, fixed "
                  f"K=1..{k_max}, the policies and the oracle)\n")
    policies = ",".join(f"ppo:{runs[m] / 'policy'}" for m in modes)
    report_dir = root / "report"
    eval_to_folder(workload, f"all,{policies}", report_dir, split="test", seed=args.seed, k_max=k_max)

    elapsed = time.perf_counter() - t_start
    print(f"\nwhere everything is (demo took {elapsed / 60:.1f} min):")
    print(f"  {'report:':<19}{report_dir}/report.md (report.json, plots: {report_dir}/*.png)")
    for m in modes:
        print(f"  {m + '-mode run:':<19}{runs[m]}/ (summary.md, config.yaml, model.zip, vecnormalize.pkl)")
        print(f"  {m + '-mode policy:':<19}{runs[m]}/policy/ (policy.npz + policy.json; ppo:{runs[m]}/policy)")
    print(f"  {'tensorboard:':<19}tensorboard --logdir {root}")
    print("\nvalidation verdicts (small demo budget; full-budget figures: docs/results/ and 'specgym train' defaults):")
    for m in modes:
        v = summaries[m]["val"]
        note = "BELOW the best fixed K" if summaries[m]["below_best_fixed"] else "above the best fixed K"
        print(f"  {m}-mode policy: {v['speedup_vs_best_fixed']:.3f}x vs best fixed K on val ({note})")
    return 0

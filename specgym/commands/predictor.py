"""``specgym predictor``: train and measure acceptance predictors (:mod:`specgym.envs.core.acceptance_predictor`).

* ``specgym predictor train --workload W --out FILE``: fit every model kind on W's train split, keep the one with the
  lowest validation log loss, write it (pickle-free JSON with its signal groups, version and checksum); with
  ``--drafter head``, a predictor of the draft head's tokens (``predicted:FILE@head``) on a recording with
  ``topk_head`` and ``runs_head``, shown beside the head's calibrated confidence (a ``conf``-only logistic);
* ``specgym predictor eval --predictor P --workload W``: prediction quality vs calibrated confidence, the
  ``predicted:P`` controller's speed vs ``marginal``, the best fixed K and both oracles (paired intervals), an
  ablation per signal group, every figure split by requests with and without repetition loops
  (:mod:`specgym.training.predictor_report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import specgym.catalogue as catalogue
from specgym.agents.specs import resolve
from specgym.baselines.drafter_marginal import fit_on_fit_split
from specgym.commands.args import bootstrap_type, int_range, path_type
from specgym.console import make_progress
from specgym.envs.core.acceptance_predictor import (
    HEAD_GROUPS,
    MODEL_KINDS,
    PREDICTOR_DRAFTERS,
    SignalSource,
    check_groups,
    load_predictor,
    save_predictor,
)
from specgym.envs.core.kinds import HEAD_DRAFTER
from specgym.envs.core.run_predictor import save_run_predictor
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import SPLITS, cached_workload
from specgym.errors import SpecgymError
from specgym.io import atomic_write_text, check_output
from specgym.paths import MODEL_ROOTS, default_workload_name
from specgym.training.predictor import predictor_metrics, select_kind, select_predictor, workload_dataset
from specgym.training.predictor_report import predictor_report, report_markdown

DEFAULT_GROUPS = "conf,shape,position,lookup"
#: The groups of a predictor of the draft head's tokens unless told (``--drafter head``).
HEAD_DEFAULT_GROUPS = ",".join(HEAD_GROUPS)
#: The fewest train positions a predictor is fitted on (``--max-rows``): fewer fit noise.
MIN_TRAIN_ROWS = 1000


def max_rows_type(text: str) -> int:
    """An argparse type: 0 (every position) or at least :data:`MIN_TRAIN_ROWS`."""
    value = int_range(0)(text)
    if 0 < value < MIN_TRAIN_ROWS:
        raise argparse.ArgumentTypeError(f"must be 0 (all positions) or at least {MIN_TRAIN_ROWS:,}, got {value}: a "
                                         f"predictor fitted on so few positions predicts noise")
    return value


max_rows_type.__name__ = "integer"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``predictor train`` and ``predictor eval``."""
    p = sub.add_parser("predictor", help="train and measure acceptance predictors (recorded context signals)")
    psub = p.add_subparsers(dest="predictor_command", metavar="ACTION")
    t = psub.add_parser("train", help="fit a predictor on a workload's train split (model kind chosen on val; a "
                                          "workload whose draft was trained on its train prompts: val, alternately)")
    t.add_argument("--workload", default=None,
                   help="workload name or path with v2 signals, or several comma-separated (one pair's greedy and "
                        "sampled traces: one predictor for every temperature) (default: the default workload)")
    t.add_argument("--groups", default=None,
                   help=f"signal groups, from conf,shape,position,lookup,hidden (default {DEFAULT_GROUPS}); with "
                        f"--drafter head from {HEAD_DEFAULT_GROUPS} (default: all)")
    t.add_argument("--drafter", choices=PREDICTOR_DRAFTERS, default=PREDICTOR_DRAFTERS[0],
                   help="whose draft tokens it predicts: the pair's draft model (default) or the draft head "
                        "(head: one example per greedy start and depth of topk_head/runs_head; use it as "
                        "predicted:FILE@head)")
    t.add_argument("--kinds", default="logistic,mlp", help="model kinds to try (default %(default)s)")
    t.add_argument("--name", default=None, help="predictor name (default: the output file's stem)")
    t.add_argument("--max-rows", type=max_rows_type, default=200_000,
                   help=f"subsample the train split to this many positions (at least {MIN_TRAIN_ROWS:,}), 0 = all "
                        f"(default %(default)s)")
    t.add_argument("--out", type=path_type, required=True, help="the predictor JSON to write")
    t.add_argument("--force", action="store_true", help="overwrite --out")
    t.set_defaults(func=_train)
    r = psub.add_parser("train-runs", help="fit the run predictor of drafter choice (every drafter's expected "
                                           "tokens per round) on a workload's fit split (train; val where the draft "
                                           "was trained on the train prompts)")
    r.add_argument("--workload", required=True, help="workload name or path (two or more drafters' runs)")
    r.add_argument("--profile", default=None, help="cost profile the fitting rollout is priced with (default: the "
                                                  "workload's own)")
    r.add_argument("--split", choices=SPLITS, default=None,
                   help="fit on this split instead (default: the fit split); a fit on data unlike use shows how a "
                        "rule fares when its fit is wrong")
    r.add_argument("--out", type=path_type, required=True, help="the run predictor JSON to write")
    r.add_argument("--force", action="store_true", help="overwrite --out")
    r.set_defaults(func=_train_runs)
    e = psub.add_parser("eval", help="prediction quality and decoding speed of a predictor, ablation, loop split")
    e.add_argument("--predictor", required=True, help="shipped predictor name or predictor JSON path")
    e.add_argument("--workload", default=None, help="workload name or path (default: the default workload)")
    e.add_argument("--split", default="test", choices=("train", "val", "test", "all"),
                   help="requests measured (default %(default)s)")
    e.add_argument("--profile", default=None, help="cost profile override (default: the workload's own)")
    e.add_argument("--no-ablation", action="store_true", help="skip the per-signal-group ablation")
    e.add_argument("--controllers", default="",
                   help="more controller specs to show beside it, e.g. ppo:midpair-token (comma-separated)")
    e.add_argument("--bootstrap", type=bootstrap_type, default=2000,
                   help="bootstrap resamples of the paired 95%% intervals: 0 = none, else 100..100000 (default "
                        "%(default)s)")
    e.add_argument("--json", type=path_type, default=None, help="also write the report as JSON here")
    e.add_argument("--md", type=path_type, default=None, help="also write the report as Markdown here")
    e.add_argument("--force", action="store_true", help="overwrite --json / --md")
    e.set_defaults(func=_eval)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def _workload(name: str | None):
    return cached_workload(catalogue.resolve("workload", name or default_workload_name()))


def _train_runs(args: argparse.Namespace) -> int:
    """Fit and save the run predictor of ``drafter-marginal`` (:mod:`specgym.envs.core.run_predictor`)."""
    check_output(args.out, args.force, "file", suffixes=(".json",))
    wl = _workload(args.workload)
    profile = load_profile(args.profile) if args.profile else wl.profile
    pred = fit_on_fit_split(wl, profile, split=args.split)
    save_run_predictor(pred, args.out, overwrite=args.force)
    print(f"wrote {args.out}: run predictor of drafters {', '.join(pred.drafters)} on {wl.name} "
          f"({pred.meta['split']} split: {pred.meta['positions']:,} positions, {pred.meta['rounds']:,} rollout "
          f"rounds); use it as drafter-marginal:{args.out} or drafter-online:{args.out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    """Fit, choose and save a predictor."""
    check_output(args.out, args.force, "file", suffixes=(".json",))
    head = args.drafter == HEAD_DRAFTER
    text = args.groups or (HEAD_DEFAULT_GROUPS if head else DEFAULT_GROUPS)
    groups = check_groups([g.strip() for g in text.split(",") if g.strip()], "--groups", args.drafter)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    bad = [k for k in kinds if k not in MODEL_KINDS]
    if bad or not kinds:
        raise SpecgymError(f"--kinds: unknown model kind(s) {bad}; choose from {', '.join(MODEL_KINDS)}")
    wls = [_workload(w.strip()) for w in (args.workload or default_workload_name()).split(",") if w.strip()]
    sources = [SignalSource.of_workload(wl, MODEL_ROOTS) for wl in wls]
    for src in sources[1:]:  # one predictor is one pair's function of one sketch
        for field, what in (("target", "target model"), ("draft", "draft model"), ("sketch", "hidden sketch")):
            if field == "sketch" and "hidden" not in groups:
                continue
            if getattr(src, field) != getattr(sources[0], field):
                raise SpecgymError(f"--workload: {src.where} has another {what} than {sources[0].where} "
                                   f"({getattr(src, field)} vs {getattr(sources[0], field)}): one predictor is "
                                   f"trained on one pair's traces")
    name = args.name or args.out.stem
    with make_progress(transient=True) as bar:  # fits, decision thresholds, continuation models
        task = bar.add_task("fitting the predictor", total=None)
        pred, candidates = select_predictor(wls, groups, name, kinds, max_rows=args.max_rows or None,
                                            progress=lambda i, n: bar.update(task, completed=i, total=n),
                                            drafter=args.drafter)
        if head:  # what it adds to the head's own confidence, calibrated (Platt), on the same rows
            candidates["confidence"] = select_kind(wls, ("conf",), f"{name}-confidence", ("logistic",),
                                                   args.max_rows or None, drafter=args.drafter)[1]["logistic"]
    chosen = candidates[pred.kind]
    if not chosen["positions"] or not chosen["auc"] > 0.5:
        raise SpecgymError(f"{args.out}: not written: the {pred.kind} predictor's validation AUC is "
                           f"{chosen['auc']:.3f} on {chosen['positions']:,} positions, no better than chance (train "
                           f"on more positions: --max-rows 0, or a larger workload)")
    tests = {}
    for wl in wls:
        test = workload_dataset(wl, "test", groups, drafter=args.drafter)
        if len(test.y):
            tests[wl.name] = predictor_metrics(pred.predict_matrix(test.x), test.y)
    workloads = ",".join(wl.name for wl in wls)
    pred = dataclasses.replace(pred, meta={
        "workload": workloads, "workloads": [wl.name for wl in wls], "synthetic": any(wl.is_synthetic for wl in wls),
        "pair_target": sources[0].target, "pair_draft": None if head else sources[0].draft,
        **({"drafter": HEAD_DRAFTER} if head else {}),
        **({"hidden_sketch": sources[0].sketch} if "hidden" in groups else {}), "groups": list(groups),
        "validation": candidates, "test": tests,
        "reproduce": f"specgym predictor train --workload {workloads} --groups {','.join(groups)}"
                     f"{' --drafter head' if head else ''} --out {args.out}"})
    save_predictor(pred, args.out, overwrite=args.force)
    for kind in kinds + (("confidence",) if head else ()):
        m = candidates[kind]
        print(f"  {kind:<9} validation AUC {m['auc']:.3f}, log loss {m['log_loss']:.4f}, ECE {m['ece']:.3f}"
              + (" (the head's confidence alone, calibrated)" if kind == "confidence" else ""))
    for wname, speed in candidates["threshold"]["val_tok_s"].items():
        print(f"  decision threshold {pred.threshold:g}; {wname} validation tok/s by threshold: "
              + ", ".join(f"{t} {v:.1f}" for t, v in speed.items()))
    if pred.fallback is not None:
        fb = candidates["fallback"]
        m = fb[pred.fallback.kind]
        print(f"  fallback  {pred.fallback.kind} on {', '.join(fb['groups'])} (where a step lacks the hidden sketch): "
              f"validation AUC {m['auc']:.3f}, log loss {m['log_loss']:.4f}")
    extra = "".join(f"; {w} test AUC {m['auc']:.3f}, log loss {m['log_loss']:.4f}" for w, m in tests.items())
    use = f"; use it as predicted:{args.out}@head" if head else ""
    print(f"wrote {args.out}: {pred.kind} on {', '.join(groups)} ({len(pred.columns)} inputs){extra}{use}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    """Measure a predictor (prediction, speed, ablation, loop split)."""
    for path, option in ((args.json, "--json"), (args.md, "--md")):
        if path is not None:
            check_output(path, args.force, "file", option, suffixes=(f".{option[2:]}",))
    pred = load_predictor(catalogue.resolve("predictor", args.predictor))
    if pred.on_head:
        raise SpecgymError(f"{args.predictor}: predictor eval measures predictors of the draft model's tokens; this "
                           f"one predicts the draft head's: measure it with specgym eval --controllers "
                           f"predicted:{args.predictor}@head,marginal@head,confidence:0.4@head")
    wl = _workload(args.workload)
    active, note = pred.for_source(SignalSource.of_workload(wl, MODEL_ROOTS))  # another pair's: refused in one line
    if active is None:
        why = (note or "no model of its chain fits").rstrip(".")
        raise SpecgymError(f"{why}: nothing of predictor {pred.name!r} can be measured on it")
    extra = tuple((r.spec, r.controller) for r in resolve(args.controllers, kinds=("chain",))) if args.controllers \
        else ()
    report = predictor_report(wl, pred, args.split, load_profile(args.profile) if args.profile else None,
                              ablation=not args.no_ablation, bootstrap=args.bootstrap, extra_controllers=extra)
    md = report_markdown(report)
    for line in report["notes"]:
        print(f"specgym predictor eval: note: {line}", file=sys.stderr)
    print(md)
    if args.json:
        atomic_write_text(args.json, json.dumps(report, indent=1, default=float) + "\n", overwrite=args.force)
    if args.md:
        atomic_write_text(args.md, md, overwrite=args.force)
    return 0

"""``specgym workloads make|show|merge|split|list|import``: synthetic workload generation, trace summaries, sharded
workloads and the importer of published traces."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

import specgym.catalogue as catalogue
from specgym.commands.args import MAX_SYNTHETIC_REQUESTS, int_range, nonneg_int, path_type
from specgym.envs.core.acceptance_predictor import load_predictor
from specgym.envs.profiles import load_batch_profile, load_profile
from specgym.envs.workloads.dataset import (
    DEFAULT_SHARD_REQUESTS,
    check_shard_files,
    merge_workloads,
    split_workload,
)
from specgym.envs.workloads.specdecode import DRAFTERS, check_drafters, check_name, import_file, input_files
from specgym.envs.workloads.synthetic import PRESETS, generate_workload
from specgym.envs.workloads.trace_format import (
    META_KEY,
    SPLITS,
    Workload,
    load_workload,
    open_dataset,
    save_workload,
    save_workloads,
)
from specgym.envs.workloads.vllm_metrics import import_metrics
from specgym.envs.workloads.vllm_metrics import input_files as vllm_input_files
from specgym.errors import SpecgymError
from specgym.io import atomic_dir, check_output
from specgym.paths import portable_name


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``workloads``."""
    p = sub.add_parser("workloads", help="make, show and list workload traces")
    wsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    mk = wsub.add_parser("make", help="generate a synthetic workload (labelled synthetic)")
    mk.add_argument("--preset", required=True, choices=sorted(PRESETS), help="synthetic family")
    mk.add_argument("--requests", type=int_range(1, MAX_SYNTHETIC_REQUESTS), default=2000,
                    help=f"number of requests, 1..{MAX_SYNTHETIC_REQUESTS:,} (default %(default)s)")
    mk.add_argument("--seed", type=nonneg_int, default=0, help="generator seed (default %(default)s)")
    mk.add_argument("--profile", default=None, help="cost profile name or path (default: the preset's)")
    mk.add_argument("--name", default=None, help="workload name (default: the preset name)")
    mk.add_argument("--out", required=True, type=path_type, help="the .parquet file to write")
    mk.add_argument("--force", action="store_true", help="overwrite an existing output file")
    mk.set_defaults(func=_make)

    sh = wsub.add_parser("show", help="summarise a workload")
    sh.add_argument("workload", help="shipped workload name or path to a .parquet file")
    sh.add_argument("--split", choices=SPLITS, default=None,
                    help="summarise one split's requests only (e.g. the held-out test split's acceptance)")
    sh.set_defaults(func=_show)

    mg = wsub.add_parser("merge", help="concatenate workloads (files or sharded folders) of one recording setup: "
                                       "one pair, temperature, dtype and signal set (names and summaries may differ)")
    mg.add_argument("sources", nargs="+", help="workload files or sharded workload folders, in order")
    mg.add_argument("--out", required=True, type=path_type,
                    help="a .parquet file (one file), or a folder (a sharded workload of the sources' shards)")
    mg.add_argument("--name", default=None,
                    help="the merged workload's name where the sources' names differ (default: --out's stem)")
    mg.add_argument("--force", action="store_true", help="overwrite an existing output")
    mg.set_defaults(func=_merge)

    sp = wsub.add_parser("split", help="a workload file as a sharded workload folder (docs/guides/scale.md)")
    sp.add_argument("source", help="shipped workload name or path to a .parquet file")
    sp.add_argument("--out", required=True, type=path_type, help="the folder to write")
    sp.add_argument("--shard-requests", type=int_range(1, MAX_SYNTHETIC_REQUESTS), default=DEFAULT_SHARD_REQUESTS,
                    help="requests per shard (default %(default)s)")
    sp.add_argument("--force", action="store_true", help="overwrite an existing output folder specgym wrote")
    sp.set_defaults(func=_split)

    ls = wsub.add_parser("list", help="list what the package ships: workloads, cost profiles, model pairs, prompts "
                                      "files, acceptance predictors and policies")
    ls.set_defaults(func=_list)

    im = wsub.add_parser("import", help="import traces as workloads: published ones (SpecDecode-Bench's "
                                        "Llama-3.1-8B EAGLE/n-gram traces) or your own vLLM server's per-request "
                                        "spec-decode metrics")
    im.add_argument("format", choices=["specdecode-bench", "vllm-metrics"],
                    help="the traces' format: specdecode-bench (combined_<dataset>.jsonl) or vllm-metrics (vLLM "
                         "responses with metrics.speculative_decoding, --per-request-spec-decode-metrics detailed; "
                         "see docs/guides/vllm-engine-traces.md)")
    im.add_argument("source", type=path_type, help="a .jsonl file, or a folder of them (specdecode-bench: one workload "
                                              "each; vllm-metrics: one workload, category = each file's stem)")
    im.add_argument("--out", required=True, type=path_type,
                    help="the .parquet file to write (specdecode-bench with a folder source: a folder, "
                         "<out>/<name>.parquet each)")
    im.add_argument("--name", default=None, help="workload name (default specdecode-<dataset> / vllm-<stem>)")
    im.add_argument("--drafters", default=None,
                    help=f"specdecode-bench: drafters to keep, the default first (default {','.join(DRAFTERS)}: "
                         "both, cut to the shorter list; one drafter keeps its own length); vllm-metrics: the "
                         "drafter's name in the workload (default vllm)")
    im.add_argument("--method", default=None,
                    help="vllm-metrics: the speculative_config method the server ran (eagle, eagle3, draft_model, "
                         "mtp, ngram, suffix...; provenance, and ngram/suffix make the drafter a lookup)")
    im.add_argument("--profile", default=None,
                    help="vllm-metrics: cost profile the replay prices rounds with (default h100-llama31-8b, "
                         "published; measure yours with specgym profile)")
    im.add_argument("--temperature", type=float, default=0.0,
                    help="vllm-metrics: the temperature the requests ran at (provenance; default 0)")
    im.add_argument("--force", action="store_true", help="overwrite existing output files")
    im.set_defaults(func=_import, keeps_out_folder=True)  # a folder --out gets files added, never replaced


def _make(args: argparse.Namespace) -> int:
    check_output(args.out, args.force, "file", suffixes=(".parquet",))
    profile = load_profile(args.profile) if args.profile else None
    wl = generate_workload(args.preset, args.requests, seed=args.seed, name=args.name, profile=profile)
    save_workload(wl, args.out, overwrite=args.force)
    print(f"wrote {args.out}: {wl.n_requests} requests, {wl.n_positions} tokens ({wl.label})")
    return 0


def signal_lines(columns: list[str], signal_meta: dict, version: int | None) -> list[str]:
    """The trace format version, the signal columns and the hidden sketch of a workload (``workloads show``)."""
    sketch = (signal_meta or {}).get("hidden_sketch")
    fmt = f"v{version}" if version is not None else "?"
    lines = [f"format    {fmt}; signal columns: {', '.join(columns) if columns else 'none (conf and entropy only)'}"]
    if sketch:
        lines.append(f"sketch    hidden_sketch of {sketch.get('dim')} dims (draft hidden size "
                     f"{sketch.get('hidden_size')}, projection seed {sketch.get('seed')}): "
                     f"{4 * int(sketch.get('dim', 0))} bytes per token")
    elif columns:
        lines.append("sketch    none (recorded without --hidden-sketch: predictors reading it use their fallback)")
    return lines


def _import(args: argparse.Namespace) -> int:
    if args.format == "vllm-metrics":
        return _import_vllm(args)
    for opt in ("method", "profile"):
        if getattr(args, opt) is not None:
            raise SpecgymError(f"--{opt}: vllm-metrics only (specdecode-bench traces carry their own provenance)")
    files = input_files(args.source)
    drafters = check_drafters((args.drafters or ",".join(DRAFTERS)).split(","))
    folder = args.source.is_dir()
    if folder and args.name is not None:
        raise SpecgymError("--name names one workload: give a file, not a folder, or drop --name")
    new_folder = folder and not os.path.lexists(args.out)
    if folder and not new_folder and not (args.out.is_dir() and not args.out.is_symlink()):
        check_output(args.out, False, "dir")  # a link or a file where the folder should be: one line
    done = [import_file(f, drafters, args.name) for f in files]  # every input parsed before anything is written
    if folder:
        by_name: dict[str, Path] = {}
        for imp in done:
            first = by_name.setdefault(imp.workload.name, imp.path)
            if first != imp.path:
                raise SpecgymError(f"{first} and {imp.path} both become workload {imp.workload.name!r} "
                                   f"({args.out / (imp.workload.name + '.parquet')}): import them one at a time, "
                                   f"each with its own --name; nothing was written")
    outs = [args.out / f"{imp.workload.name}.parquet" for imp in done] if folder else [args.out]
    for out in outs:
        check_output(out, args.force, "file", suffixes=(".parquet",))
    items = [(imp.workload, out) for imp, out in zip(done, outs)]
    if new_folder:  # all or nothing: the folder appears complete, with its marker, or not at all
        with atomic_dir(args.out, owner="specgym workloads import") as tmp:
            save_workloads([(wl, tmp / out.name) for wl, out in items])
    else:
        if not folder:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        save_workloads(items, overwrite=args.force)
    for imp, out in zip(done, outs):
        print(imp.summary())
        print(f"wrote {out}: {imp.workload.label}")
    return 0


def _import_vllm(args: argparse.Namespace) -> int:
    """``workloads import vllm-metrics``: one workload of the responses (:mod:`.vllm_metrics`)."""
    vllm_input_files(args.source)  # a missing or empty source: said before the output is checked
    check_output(args.out, args.force, "file", suffixes=(".parquet",))
    if args.name is not None:
        check_name(args.name)
    drafter = (args.drafters or "vllm").strip()  # checked, with --method and --temperature, by import_metrics
    profile = load_profile(args.profile) if args.profile else None
    imp = import_metrics(args.source, args.name, drafter=drafter, method=args.method, profile=profile,
                         temperature=args.temperature)  # every input parsed before anything is written
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_workload(imp.workload, args.out, overwrite=args.force)
    print(imp.summary())
    print(f"wrote {args.out}: {imp.workload.label}, profile {imp.workload.profile.name} "
          f"(evaluate: specgym eval --workload {args.out})")
    return 0


def summarize(wl: Workload, version: int | None = None) -> str:
    """Human-readable summary: requests, tokens, categories, mean p_accept per category, split sizes, the trace
    format version (``version``: as stored in the file), signal columns and hidden sketch."""
    lines = [
        f"workload  {wl.label}",
        f"source    {_describe_source(wl.source)}",
        f"profile   {wl.profile.name} ({wl.profile.source}): draft {wl.profile.draft_ms:g} ms, "
        f"t_AR {wl.profile.t_ar_ms:g} ms, cost ratio {wl.profile.cost_ratio:.3f}",
        f"requests  {wl.n_requests}    tokens {wl.n_positions}    length {int(wl.lengths.min())}-"
        f"{int(wl.lengths.max())} (mean {wl.lengths.mean():.1f})",
        "splits    " + "  ".join(f"{s} {int((wl.split == s).sum())}" for s in SPLITS),
        "temperature " + ", ".join(f"{t:g}" for t in np.unique(wl.temperature)),
        *signal_lines(wl.signal_names, wl.signal_meta, version),
        "drafters  " + ", ".join(f"{d['name']} ({d['kind']}, {d['runs']})" for d in wl.drafters)
        if wl.drafters else "drafters  draft (per-position)",
        "",
    ]
    req_of_pos = np.repeat(np.arange(wl.n_requests), wl.lengths)
    cols = [(c, c.replace("draft_", "")) for c in ("p_accept", "draft_conf", "draft_entropy") if getattr(wl, c) is not
            None]
    runs = list(wl.runs)
    lines.append(f"{'category':<14}{'requests':>9}{'tokens':>10}" + "".join(f"{h:>10}" for _, h in cols)
                 + "".join(f"{'run ' + d:>12}" for d in runs))
    for cat in wl.categories():
        reqs = wl.category == cat
        pos = reqs[req_of_pos]
        lines.append(f"{cat:<14}{int(reqs.sum()):>9}{int(pos.sum()):>10}"
                     + "".join(f"{getattr(wl, c)[pos].mean():>10.3f}" for c, _ in cols)
                     + "".join(f"{wl.runs[d][pos].mean():>12.2f}" for d in runs))
    if runs:
        lines.append("run = mean accepted draft tokens of a round starting at a position (long enough draft)")
    return "\n".join(lines)


def _describe_source(src: dict) -> str:
    if src.get("kind") == "synthetic":
        return f"SYNTHETIC ({src.get('generator')}, preset {src.get('preset')}, seed {src.get('seed')})"
    if src.get("kind") == "imported":
        return (f"IMPORTED engine metrics, replayed ({src.get('engine')} {src.get('format')}, method "
                f"{src.get('method')}; files {', '.join(f['file'] for f in src.get('files', []))}; not a specgym live "
                f"run)")
    if src.get("kind") == "published":
        return (f"PUBLISHED trace, replayed ({src.get('dataset')}: {src.get('target_model')}, {src.get('serving')}; "
                f"file {src.get('file')})")
    return f"recorded: draft {src.get('draft_model')}, target {src.get('target_model')}"


def _show(args: argparse.Namespace) -> int:
    if Path(args.workload).is_dir():  # a sharded workload: the record and every shard's footer, not its columns
        if args.split is not None:
            raise SpecgymError(f"--split {args.split}: summarise a sharded workload's split after merging it "
                               f"(specgym workloads merge ... --out F.parquet, then show F --split {args.split})")
        ds = open_dataset(args.workload)
        check_shard_files(ds)
        first = ds.shard(0)
        print(f"workload  {ds.label}\nsharded   {len(ds.shards)} shards, {ds.n_requests} requests, "
              f"{ds.n_positions} tokens: every shard's file checked (a whole Parquet file, its row count the "
              f"record's); columns checked: shard 0, the others as they are read")
        print("\n".join(signal_lines(first.signal_names, first.signal_meta, ds.metadata.get("format_version"))))
        print("(a full summary: specgym workloads merge ... --out F.parquet, then show F)")
        return 0
    path = catalogue.resolve("workload", args.workload)
    wl = load_workload(path)
    if args.split is not None:
        wl = wl.subset(wl.split_indices(args.split))
        if not wl.n_requests:
            raise SpecgymError(f"--split {args.split}: workload {wl.name} has no {args.split} requests")
    print(summarize(wl, stored_version(path)))
    return 0


def stored_version(path: Path) -> int | None:
    """The trace format version a workload file says it is (its schema metadata; None if unreadable)."""
    import pyarrow.parquet as pq

    try:
        meta = json.loads((pq.read_schema(path).metadata or {}).get(META_KEY, b"{}"))
        return int(meta["format_version"])
    except Exception:  # noqa: BLE001 - load_workload has already named any defect
        return None


def _merge(args: argparse.Namespace) -> int:
    notes: list[str] = []
    merged = merge_workloads(args.sources, args.out, overwrite=args.force, name=args.name, notes=notes)
    for note in notes:
        print(f"specgym workloads merge: note: {note}", file=sys.stderr)
    print(f"wrote {args.out}: {merged.n_requests} requests, {merged.n_positions} tokens ({merged.label})")
    return 0


def _split(args: argparse.Namespace) -> int:
    ds = split_workload(args.source, args.out, args.shard_requests, overwrite=args.force)
    print(f"wrote {args.out}: {len(ds.shards)} shards, {ds.n_requests} requests, {ds.n_positions} tokens "
          f"({ds.label})")
    return 0


def _list(args: argparse.Namespace) -> int:
    print("shipped workloads:")
    for name in catalogue.names("workload"):
        path = catalogue.resolve("workload", name)
        wl = load_workload(path)
        kind = "SYNTHETIC" if wl.is_synthetic else "recorded"
        sketch = (wl.signal_meta.get("hidden_sketch") or {}).get("dim")
        signals = f"v{stored_version(path)}" + (" + signals" if wl.signal_names else "") + \
            (f" + {sketch}-d sketch" if sketch else "")
        print(f"  {name:<22} {kind:<10} {wl.n_requests:>6} requests {wl.n_positions:>9,} tokens  "
              f"profile {wl.profile.name}; {signals}")
    print("shipped cost profiles:")
    for name in catalogue.names("profile"):
        p = load_profile(name)
        print(f"  {name:<22} {p.source:<10} draft {p.draft_ms:g} ms, t_AR {p.t_ar_ms:g} ms, cost ratio "
              f"{p.cost_ratio:.3f}")
        if p.description:
            print(f"  {'':<22} {p.description}")
    print("shipped batched cost profiles (specgym tune):")
    for name in catalogue.names("batch_profile"):
        bp = load_batch_profile(name)
        print(f"  {name:<22} {bp.source:<10} batch sizes {bp.batch_sizes[0]}..{bp.batch_sizes[-1]}, one step "
              f"{bp.verify(1, 1):.3f} ms at batch 1")
        if bp.description:
            print(f"  {'':<22} {bp.description}")
    print("shipped model pairs (specgym record/generate --draft/--target; default: the first):")
    for name in catalogue.names("pair"):
        draft, target = catalogue.pair_models(name)
        print(f"  {name:<22} draft {portable_name(draft)}, target {portable_name(target)}")
    print("shipped prompts files (specgym record --prompts NAME):")
    for name in catalogue.names("prompts"):
        n = sum(1 for line in catalogue.resolve("prompts", name).read_text(encoding="utf-8").splitlines()
                if line.strip())
        print(f"  {name:<22} {n} prompts")
    print("shipped acceptance predictors (predicted:NAME, planned:NAME, tree-predicted:NAME):")
    for name in catalogue.names("predictor"):
        pred = load_predictor(catalogue.resolve("predictor", name))
        meta = pred.meta or {}
        fallback = f"; fallback on {', '.join(pred.fallback.groups)}" if pred.fallback is not None else ""
        print(f"  {name:<22} {pred.kind} on {', '.join(pred.groups)}{fallback}; pair {meta.get('pair_target')}, "
              f"trained on {meta.get('workload')}")
    print("shipped policies (ppo:NAME; tree policies tree-ppo:NAME):")
    for name in catalogue.names("policy"):
        doc = json.loads((catalogue.resolve("policy", name) / "policy.json").read_text(encoding="utf-8"))
        train = doc.get("training") or {}
        print(f"  {name:<22} {doc.get('mode')} mode, trained on {train.get('workload', '?')}")
    return 0

"""Re-run the results pages' deterministic replay tables and commit the commands' own output beside each page.

    python docs/results/scripts/replays.py              # every replay table (~4 min on one core), then render.py
    python docs/results/scripts/replays.py trees ...    # only the named tables
    python docs/results/scripts/replays.py --list       # the tables and their commands
    python docs/results/scripts/replays.py --rebuild    # run nothing: rows again from the stored outputs

Each table here comes from commands whose figures do not depend on the machine (replays of shipped recordings and
profiles, or synthetic workloads of a fixed seed) and run in seconds to a minute. The command's output, trimmed to
what the table shows, is stored in ``docs/results/data/NAME.json`` under ``output`` with ``source.provenance =
"machine output"``, and the table's rows are built from it by this file's ``rows`` functions, so
``tests/test_results_pages.py`` can check that the published rows are exactly what the stored output gives. The
other tables of the pages (live runs, long trainings, data not shipped) are transcribed, and say so.

Part of the docs, not of the installed package.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import render  # noqa: E402

SPECGYM = [sys.executable, "-m", "specgym"]
CI_FORMAT = "{:.3f}x [{:.3f}, {:.3f}]"
CI_FIELDS = ["ratio", "ci95_low", "ci95_high"]
Output = dict[str, Any]
Table = dict[str, Any]


@dataclass
class Recipe:
    """One replay table: the commands that make its output, how to trim that output, and how rows come from it.

    Attributes:
        name: The table's file, ``docs/results/data/NAME.json``.
        commands: The shell commands as published (``OUT`` is the folder outputs go to).
        collect: Runs the commands in a scratch folder and returns the trimmed output.
        table: The table (``columns``, ``rows``, optional ``plot``) built from that output.
        test_split: For a test-split result: which split, and how often it was measured.
        note: One line on what else the figures rest on.
    """

    name: str
    commands: list[str]
    collect: Callable[[Path], Output]
    table: Callable[[Output], Table]
    test_split: str | None = None
    note: str | None = None


def run(argv: list[str]) -> str:
    """Runs one specgym command on one thread; its stdout (a failure stops everything, naming the command)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:])} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return r.stdout


def eval_report(tmp: Path, args: list[str], keep: list[str]) -> Output:
    """``specgym eval ARGS`` (no plots), its report.json trimmed to the run's settings and the rows in ``keep``."""
    out = tmp / f"eval-{len(list(tmp.iterdir()))}"
    run([*SPECGYM, "eval", *args, "--no-plots", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    wanted = set(keep)
    rows = [{k: v for k, v in r.items() if k != "categories"} for r in report["rows"] if r["spec"] in wanted]
    missing = wanted - {r["spec"] for r in rows} - {"oracle", "oracle:informed"}
    if missing:
        raise SystemExit(f"specgym eval {' '.join(args)}: no rows for {sorted(missing)}")
    workload = {k: report["workload"][k] for k in ("name", "split", "requests", "tokens", "synthetic")}
    drop = ("categories",)
    return {"workload": workload, "profile": report["profile"]["name"], "seed": report["seed"],
            "k_max": report["k_max"], "bootstrap": report["bootstrap"], "reference": report["reference"],
            "best_single_drafter": report["best_single_drafter"], "best_static_tree": report["best_static_tree"],
            "lookup_rule": report["lookup_rule"],
            "oracle": {k: v for k, v in report["oracle"].items() if k not in drop},
            "informed_oracle": {k: v for k, v in report["informed_oracle"].items() if k not in drop},
            "rows": rows, "specgym_version": report["specgym_version"]}


def row_of(report: Output, controller: str) -> Output:
    """A controller's row of a trimmed report, by its spec (the two oracles included)."""
    if controller == "oracle":
        return report["oracle"]
    if controller == "oracle:informed":
        return report["informed_oracle"]
    return next(r for r in report["rows"] if r["spec"] == controller)


def ratio(row: Output, key: str) -> list[float] | float:
    """A ratio with its 95% interval where the report has one (``[ratio, low, high]``), else the ratio alone."""
    ci = row.get("ci95", {}).get(key)
    return [row[key], *ci] if ci else row[key]


def cell(value: list[float] | float, fmt: str = CI_FORMAT) -> Any:
    """A ratio for a column formatted with its interval: bare when it has one, else a cell of its own format."""
    if isinstance(value, list):
        return value
    return {"format": fmt.split(" [")[0], "values": [value]}


def plain_tok_s(report: Output) -> float:
    """Plain decoding's tok/s in a report: the tokens over the fixed-K reference's time at K = 0."""
    tokens = report["rows"][0]["tokens"]
    return tokens / (report["reference"]["fixed_time_ms"]["0"] / 1000)


# --- replay-midpair: every controller on the recorded midpair workloads -------------------------------------------

MIDPAIR_ROWS = [("oracle", "oracle (clairvoyant limit)"),
                ("oracle:informed", "oracle:informed (knows p_accept, not the draws)"),
                ("ppo:midpair-token", "`ppo:midpair-token` (shipped, guarded)"),
                ("marginal", "`marginal` (the best baseline on both)"),
                ("ppo:generalist-token", "`ppo:generalist-token` (shipped, guarded)"),
                ("best", "best fixed K"), ("hf-heuristic", "hf-heuristic"), ("assc", "assc"), ("speclane", "speclane"),
                ("confidence:0.4", "confidence:0.4"), ("plain", "plain decoding")]
MIDPAIR_CONTROLLERS = "all,ppo:midpair-token,ppo:generalist-token"


def midpair_collect(tmp: Path) -> Output:
    """Both midpair workloads' test-split evals: the table's rows and every fixed K (the best one is a row)."""
    keep = [c for c, _ in MIDPAIR_ROWS if c not in ("best", "plain")] + [f"fixed:{k}" for k in range(1, 9)]
    return {w: eval_report(tmp, ["--workload", w, "--controllers", MIDPAIR_CONTROLLERS], keep)
            for w in ("midpair-greedy", "midpair-t08")}


def midpair_table(out: Output) -> Table:
    """Each controller's tok/s and ratio to the best fixed K, on both workloads side by side."""
    columns: list[dict[str, Any]] = [{"key": "controller", "header": "controller"}]
    rows: list[dict[str, Any]] = [{"controller": label} for _, label in MIDPAIR_ROWS]
    for w, report in out.items():
        k = report["reference"]["best_fixed_k"]
        best = row_of(report, f"fixed:{k}")
        columns += [{"key": f"{w}_tok_s", "header": f"{w} tok/s", "align": "right", "format": "{:.1f}"},
                    {"key": f"{w}_vs_best", "header": f"vs best fixed (K={k})", "align": "right",
                     "format": CI_FORMAT, "fields": CI_FIELDS}]
        for row, (controller, _) in zip(rows, MIDPAIR_ROWS):
            if controller == "plain":
                tok = plain_tok_s(report)
                row.update({f"{w}_tok_s": tok, f"{w}_vs_best": cell(tok / best["throughput_tok_s"])})
                continue
            r = best if controller == "best" else row_of(report, controller)
            vs = {"format": "{:.3f}x", "values": [1.0]} if controller == "best" else \
                cell(ratio(r, "speedup_vs_best_fixed"))
            row.update({f"{w}_tok_s": r["throughput_tok_s"], f"{w}_vs_best": vs})
    first = columns[2]["header"]
    return {"plot": first, "columns": columns, "rows": rows}


# --- trees: tree drafts on the midpair under gpu-like-published --------------------------------------------------

TREE_ROWS = [("tree-oracle", "`tree-oracle` (64-node budget)"), ("tree-predicted:midpair", "`tree-predicted:midpair`"),
             ("planned:midpair", "`planned:midpair` (chain)"), ("predicted:midpair", "`predicted:midpair` (chain)"),
             ("tree-sequoia", "`tree-sequoia`"), ("tree-eagle", "`tree-eagle` (approximate in replay)"),
             ("tree-ppo:midpair-tree", "`tree-ppo:midpair-tree`"), ("tree-static:2-2-1", "`tree-static:2-2-1`")]


def trees_collect(tmp: Path) -> Output:
    """The midpair-greedy eval under gpu-like-published, every tree row and every fixed K."""
    keep = [c for c, _ in TREE_ROWS] + [f"fixed:{k}" for k in range(1, 9)]
    args = ["--workload", "midpair-greedy", "--controllers", "all,tree-ppo:midpair-tree", "--profile",
            "gpu-like-published"]
    return {"midpair-greedy": eval_report(tmp, args, keep)}


def trees_table(out: Output) -> Table:
    """Each tree and chain row against the best chain and the best static tree."""
    report = out["midpair-greedy"]
    k, tree = report["reference"]["best_fixed_k"], report["best_static_tree"]
    vs_chain = f"vs the best chain (fixed K = {k})"
    columns = [{"key": "controller", "header": "controller"},
               {"key": "tok_s", "header": "tok/s", "align": "right", "format": "{:.1f}"},
               {"key": "vs_best_chain", "header": vs_chain, "align": "right", "format": CI_FORMAT,
                "fields": CI_FIELDS},
               {"key": "vs_best_static_tree", "header": f"vs `{tree}` (the best static tree)", "align": "right",
                "format": CI_FORMAT, "fields": CI_FIELDS}]
    rows = []
    for controller, label in TREE_ROWS:
        r = row_of(report, controller)
        rows.append({"controller": label, "tok_s": r["throughput_tok_s"],
                     "vs_best_chain": cell(ratio(r, "speedup_vs_best_fixed")),
                     "vs_best_static_tree": cell(ratio(r, "speedup_vs_best_static_tree"))})
    return {"plot": vs_chain, "columns": columns, "rows": rows}


# --- trees-head: the real pair's head trees, the hybrid and the tree policy (smollm2-greedy, val) ----------------

HEAD_TREE_ROWS = [("tree-online@head", "`tree-online@head` (drafter-online: lookup chain, head tree or plain; "
                                       "approximate)"),
                  ("tree-hybrid@head", "`tree-hybrid@head` (lookup chain or the fitted EAGLE-2 tree; approximate)"),
                  ("tree-ppo:smollm2-head-tree", "`tree-ppo:smollm2-head-tree` (approximate)"),
                  ("tree-eagle:fit@head", "`tree-eagle:fit@head` (approximate)"),
                  ("lookup-switch", "`lookup-switch` (chain)"), ("drafter-online", "`drafter-online` (chain)"),
                  ("drafter-marginal", "`drafter-marginal` (chain)"),
                  ("confidence:0.4@head", "`confidence:0.4@head` (chain)"),
                  ("marginal@head", "`marginal@head` (chain)"),
                  ("tree-static:2-2-1@head", "`tree-static:2-2-1@head`"),
                  ("tree-eagle@head", "`tree-eagle@head` (EAGLE-2's published 5:4:16; approximate)")]
HEAD_TREE_SPECS = ",".join([f"fixed:{k}@{d}" for d in ("head", "ngram") for k in range(1, 9)] +
                           [f"fixed:{k}" for k in range(1, 9)] + [c for c, _ in HEAD_TREE_ROWS])


def trees_head_collect(tmp: Path) -> Output:
    """The smollm2-greedy val-split eval under cpu-smollm2: every fixed K of every drafter and the head-tree rows."""
    args = ["--workload", "smollm2-greedy", "--split", "val", "--profile", "cpu-smollm2", "--controllers",
            HEAD_TREE_SPECS]
    keep = [c for c, _ in HEAD_TREE_ROWS] + [f"fixed:{k}@head" for k in range(1, 9)]
    return {"smollm2-greedy": eval_report(tmp, args, keep)}


def trees_head_table(out: Output) -> Table:
    """Each row against plain decoding, the best single drafter at a fixed K and the fitted lookup switch."""
    report = out["smollm2-greedy"]
    single = report["best_single_drafter"]
    columns = [{"key": "controller", "header": "controller"},
               {"key": "tok_s", "header": "replay tok/s", "align": "right", "format": "{:.1f}"},
               {"key": "vs_plain", "header": "vs plain [95% CI]", "align": "right", "format": CI_FORMAT,
                "fields": CI_FIELDS},
               {"key": "vs_single", "header": f"vs the best single drafter (`{single}`) [95% CI]", "align": "right",
                "format": CI_FORMAT, "fields": CI_FIELDS},
               {"key": "vs_switch", "header": "vs `lookup-switch` [95% CI]", "align": "right", "format": CI_FORMAT,
                "fields": CI_FIELDS}]
    rows = []
    for controller, label in [(single, f"`{single}` (the best single drafter)"), *HEAD_TREE_ROWS]:
        r = row_of(report, controller)
        rows.append({"controller": label, "tok_s": r["throughput_tok_s"], "vs_plain": cell(ratio(r, "speedup_vs_ar")),
                     "vs_single": cell(ratio(r, "speedup_vs_best_single_drafter")),
                     "vs_switch": cell(ratio(r, "speedup_vs_lookup_rule"))})
    return {"plot": "vs plain [95% CI]", "columns": columns, "rows": rows}


# --- vllm-table: the Dynamic SD table under the A100 roofline model ----------------------------------------------

def vllm_table_collect(tmp: Path) -> Output:
    """`specgym tune vllm`'s JSON (its table, ranges and closed-loop checks)."""
    out = tmp / "tuned.json"
    run([*SPECGYM, "tune", "vllm", "--workload", "midpair-greedy", "--profile", "batch-a100-7b-roofline",
         "--max-batch", "512", "--out", str(out)])
    return json.loads(out.read_text())


def vllm_table_table(out: Output) -> Table:
    """One row per batch-size range of the tuned table."""
    columns = [{"key": "batch_sizes", "header": "batch sizes"},
               {"key": "k", "header": "K", "align": "right"},
               {"key": "speedup", "header": "predicted speedup vs no speculation", "align": "right",
                "format": "{:.2f}x"}]
    rows = [{"batch_sizes": f"{r['start_bs']}-{r['end_bs']}", "k": r["k"], "speedup": r["speedup_vs_no_spec"]}
            for r in out["ranges"]]
    return {"plot": columns[2]["header"], "columns": columns, "rows": rows}


# --- serving-under-load: the recorded midpair under the CPU batched profile --------------------------------------

SWEEP_ROWS = ["budget:predictor:midpair", "vllm-adaptive:predictor:midpair", "budget:logistic",
              "vllm-adaptive:logistic", "vllm-adaptive:ema", "sglang-adaptive", "trtllm-off:3:32", "goodput",
              "oracle-clairvoyant", "oracle-request-rates"]


def sweep_collect(tmp: Path) -> Output:
    """The sweep's JSON, its rows trimmed to the table's controllers and the best fixed K per concurrency."""
    out = tmp / "midpair.json"
    run([*SPECGYM, "tune", "sweep", "--workload", "midpair-greedy", "--profile", "batch-cpu-midpair", "--k-max", "8",
         "--concurrency", "1,4,16,64,128,256", "--controllers", "all", "--json", str(out)])
    sweep = json.loads(out.read_text())
    rows = [r for r in sweep["rows"] if r["controller"] in SWEEP_ROWS or r["controller"].startswith("best-fixed")]
    keep = ("schema", "workload", "profile", "concurrencies", "replications", "k_max", "measure")
    return {**{k: sweep[k] for k in keep}, "rows": rows}


def sweep_table(out: Output) -> Table:
    """The best fixed K per concurrency, then each controller's ratio to it with its interval."""
    cs = out["concurrencies"]
    columns = [{"key": "controller", "header": "controller"}]
    columns += [{"key": f"c{c}", "header": f"c={c}", "align": "right", "format": CI_FORMAT, "fields": CI_FIELDS}
                for c in cs]
    by = {(r["controller"], r["concurrency"]): r for r in out["rows"]}
    best = {r["concurrency"]: r for r in out["rows"] if r["controller"].startswith("best-fixed")}
    rows: list[dict[str, Any]] = [{"controller": "best fixed K (hindsight)", **{
        f"c{c}": {"format": "K={}, {:.0f} tok/s", "values": [best[c]["best_fixed_k"], best[c]["tok_s"]]}
        for c in cs}}]
    for controller in SWEEP_ROWS:
        rows.append({"controller": controller, **{
            f"c{c}": [by[controller, c][k] for k in ("vs_best_fixed", "ci95_low", "ci95_high")] for c in cs}})
    return {"columns": columns, "rows": rows}


# --- live-smollm2: replay of the real pair's test split ------------------------------------------------------------

SMOL_ROWS = [("drafter-oracle", "`drafter-oracle` (clairvoyant drafter and K, planned)"),
             ("round-oracle", "`round-oracle` (clairvoyant per round)"),
             ("drafter-online", "`drafter-online`"), ("drafter-marginal", "`drafter-marginal`"),
             ("lookup-switch", "`lookup-switch` (the fitted two-line rule)"),
             ("fixed:3@head", "`fixed:3@head`"), ("marginal@head", "`marginal@head` (adaptive K, the head alone)"),
             ("marginal@ngram", "`marginal@ngram` (adaptive K, prompt lookup alone)"),
             ("fixed:5@ngram", "`fixed:5@ngram`"),
             ("predicted:smollm2", "`predicted:smollm2`"), ("marginal", "`marginal`"),
             ("fixed:1", "`fixed:1` (the draft model's best fixed K)"), ("lookup-rule:3", "`lookup-rule:3`")]


def smollm2_collect(tmp: Path) -> Output:
    """The smollm2-greedy test-split eval under cpu-smollm2 (every drafter-choice row)."""
    args = ["--workload", "smollm2-greedy", "--split", "test", "--profile", "cpu-smollm2", "--controllers", "all"]
    return {"smollm2-greedy": eval_report(tmp, args, [c for c, _ in SMOL_ROWS])}


def smollm2_table(out: Output) -> Table:
    """Each drafter-choice row against plain decoding, the best single drafter and the fitted switch."""
    report = out["smollm2-greedy"]
    single, switch = report["best_single_drafter"], report["lookup_rule"]
    vs_single = f"vs the best single drafter (`{single}`) [95% CI]"
    columns = [{"key": "controller", "header": "controller"},
               {"key": "tok_s", "header": "replay tok/s", "align": "right", "format": "{:.1f}"},
               {"key": "vs_plain", "header": "vs plain [95% CI]", "align": "right", "format": CI_FORMAT,
                "fields": CI_FIELDS},
               {"key": "vs_single", "header": vs_single, "align": "right", "format": CI_FORMAT, "fields": CI_FIELDS},
               {"key": "vs_switch", "header": f"vs `{switch}` [95% CI]", "align": "right", "format": CI_FORMAT,
                "fields": CI_FIELDS}]
    rows = []
    for controller, label in SMOL_ROWS:
        r = row_of(report, controller)
        rows.append({"controller": label, "tok_s": r["throughput_tok_s"], "vs_plain": cell(ratio(r, "speedup_vs_ar")),
                     "vs_single": cell(ratio(r, "speedup_vs_best_single_drafter")),
                     "vs_switch": cell(ratio(r, "speedup_vs_lookup_rule"))})
    return {"columns": columns, "rows": rows}


def smollm2_runs_collect(tmp: Path) -> Output:
    """The per-category table `specgym workloads show` prints for the test split (it has no JSON)."""
    text = run([*SPECGYM, "workloads", "show", "smollm2-greedy", "--split", "test"])
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("category"))
    return {"stdout": [line.rstrip() for line in lines[start:] if line.strip()]}


def smollm2_runs_table(out: Output) -> Table:
    """Each category's mean run of the head and of prompt lookup, longest head runs first."""
    header, *body = out["stdout"]
    names = header.split()
    assert names[:4] == ["category", "requests", "tokens", "p_accept"] and header.endswith("run ngram    run head"), \
        f"specgym workloads show printed an unexpected header: {header!r}"
    columns = [{"key": "category", "header": "category"},
               {"key": "requests", "header": "test prompts", "align": "right"},
               {"key": "tokens", "header": "tokens", "align": "right"},
               {"key": "run_head", "header": "the head: mean run", "align": "right", "format": "{:.2f}"},
               {"key": "run_ngram", "header": "prompt lookup: mean run", "align": "right", "format": "{:.2f}"},
               {"key": "p_accept", "header": "the draft model: p_accept", "align": "right", "format": "{:.3f}"}]
    rows = []
    for line in body:
        if not re.match(r"^[a-z]+\s+\d", line):
            continue
        f = line.split()
        rows.append({"category": f[0], "requests": int(f[1]), "tokens": int(f[2]), "run_head": float(f[-1]),
                     "run_ngram": float(f[-2]), "p_accept": float(f[3])})
    rows.sort(key=lambda r: -r["run_head"])
    return {"plot": "the head: mean run", "columns": columns, "rows": rows}


# --- write-ups: the two source write-ups' claims on synthetic workloads -------------------------------------------

#: The SpecLane write-up's published rows (quoted: tok/s, vs K=4, waste), not measured here.
SPECLANE_CLAIMS = {"fixed:4": ("fixed K=4", 45.45, "1.00x", 0.725), "fixed:8": ("fixed K=8", 35.91, "0.79x", 0.845),
                   "speclane": ("SpecLane", 48.93, "1.077x", 0.564)}
#: The ASSC write-up's published rows (quoted: speedup, waste, tokens per step), not measured here.
ASSC_CLAIMS = {"fixed:2": ("fixed K=2", "1.65x", "12.4%", "1.82"), "fixed:5": ("fixed K=5", "2.24x", "38.6%", "3.65"),
               "fixed:8": ("fixed K=8", "1.82x", "54.2%", "3.88"),
               "assc": ("ASSC", "2.74x", "18.2%", "4.28 (mean K 4.3)")}


def speclane_collect(tmp: Path) -> Output:
    """Both synthetic SpecLane workloads, made at seed 0 and evaluated over all their requests."""
    out = {}
    for preset, n, name in (("speclane-mix", 10000, "slm10k"), ("speclane-uniform", 2000, "uniform")):
        path = tmp / f"{name}.parquet"
        run([*SPECGYM, "workloads", "make", "--preset", preset, "--requests", str(n), "--seed", "0", "--out",
             str(path)])
        out[preset] = eval_report(tmp, ["--workload", str(path), "--split", "all", "--controllers",
                                        "fixed:2,fixed:4,fixed:8,speclane,speclane:ratio"],
                                  ["fixed:2", "fixed:4", "fixed:8", "speclane", "speclane:ratio"])
    return out


def speclane_table(out: Output) -> Table:
    """The write-up's rows beside ours on the mix and at uniform acceptance 0.55, and the best fixed K."""
    columns = [{"key": "controller", "header": "controller"},
               {"key": "claim_tok_s", "header": "write-up tok/s", "align": "right", "format": "{:.2f}"},
               {"key": "claim_vs_k4", "header": "write-up vs K=4", "align": "right"},
               {"key": "claim_waste", "header": "write-up waste", "align": "right", "format": "{:.3f}"},
               {"key": "mix", "header": "ours, `speclane-mix` 10k", "align": "right"},
               {"key": "uniform", "header": "ours, `speclane-uniform` (alpha 0.55)", "align": "right"}]
    rows = []
    for controller, (label, tok, vs, waste) in SPECLANE_CLAIMS.items():
        row: dict[str, Any] = {"controller": label, "claim_tok_s": tok, "claim_vs_k4": vs, "claim_waste": waste}
        for key, preset in (("mix", "speclane-mix"), ("uniform", "speclane-uniform")):
            r = row_of(out[preset], controller)
            fmt, values = "{:.2f} tok/s, waste {:.3f}", [r["throughput_tok_s"], r["draft_waste"]]
            if controller != "fixed:4":
                fmt, values = "{:.2f} ({:.3f}x), waste {:.3f}", [values[0], r["speedup_vs_k4"], values[1]]
            row[key] = {"format": fmt, "values": values}
        rows.append(row)
    best: dict[str, Any] = {"controller": "best fixed K", "claim_tok_s": "–", "claim_vs_k4": "–", "claim_waste": "–"}
    for key, preset in (("mix", "speclane-mix"), ("uniform", "speclane-uniform")):
        report = out[preset]
        k = report["reference"]["best_fixed_k"]
        times = report["reference"]["fixed_time_ms"]
        tok = report["rows"][0]["tokens"] / (times[str(k)] / 1000)
        best[key] = {"format": "K={}: {:.2f} ({:.3f}x)", "values": [k, tok, times["4"] / times[str(k)]]}
    rows.append(best)
    return {"plot": "ours, `speclane-mix` 10k", "columns": columns, "rows": rows}


def assc_collect(tmp: Path) -> Output:
    """The assc-regimes eval over all its requests."""
    controllers = ["fixed:2", "fixed:4", "fixed:5", "fixed:8", "assc", "speclane"]
    args = ["--workload", "assc-regimes", "--split", "all", "--controllers", ",".join(controllers)]
    return {"assc-regimes": eval_report(tmp, args, controllers)}


def assc_table(out: Output) -> Table:
    """The write-up's rows beside ours on assc-regimes."""
    report = out["assc-regimes"]
    columns = [{"key": "controller", "header": "controller"},
               {"key": "claim_speedup", "header": "write-up speedup", "align": "right"},
               {"key": "claim_waste", "header": "write-up waste", "align": "right"},
               {"key": "claim_tokens", "header": "write-up tokens/step", "align": "right"},
               {"key": "speedup", "header": "ours: speedup vs AR", "align": "right", "format": "{:.3f}x"},
               {"key": "waste", "header": "waste", "align": "right", "format": "{:.1f}%"},
               {"key": "accept_len", "header": "tokens/round", "align": "right", "format": "{:.2f}"}]
    rows = []
    for controller, (label, speedup, waste, tokens) in ASSC_CLAIMS.items():
        r = row_of(report, controller)
        speed: Any = r["speedup_vs_ar"]
        if controller == "assc":
            speed = {"format": "{:.3f}x (mean K {:.2f})", "values": [r["speedup_vs_ar"], r["mean_k"]]}
        rows.append({"controller": label, "claim_speedup": speedup, "claim_waste": waste, "claim_tokens": tokens,
                     "speedup": speed, "waste": 100 * r["draft_waste"], "accept_len": r["mean_accept_len"]})
    return {"columns": columns, "rows": rows}


def eval_command(workload: str, controllers: str, extra: str = "") -> str:
    """The published form of an eval command (the report folder is the default one)."""
    return f"specgym eval --workload {workload}{extra} --controllers {controllers}"


RECIPES = [
    Recipe("replay-midpair", [eval_command("midpair-greedy", MIDPAIR_CONTROLLERS),
                              eval_command("midpair-t08", MIDPAIR_CONTROLLERS)], midpair_collect, midpair_table,
           test_split="midpair-greedy and midpair-t08, 240 requests each; how often measured: not recorded "
                      "(every session's replays read them)"),
    Recipe("trees", [eval_command("midpair-greedy", "all,tree-ppo:midpair-tree", " --profile gpu-like-published")],
           trees_collect, trees_table,
           test_split="midpair-greedy, 240 requests; how often measured: not recorded"),
    Recipe("trees-head", [eval_command("smollm2-greedy", HEAD_TREE_SPECS, " --split val --profile cpu-smollm2")],
           trees_head_collect, trees_head_table,
           note="smollm2-greedy's val split, its fit split: the fitted rules (tree-eagle:fit, tree-hybrid, "
                "lookup-switch, drafter-*) are scored on the rows they were fitted on (in-sample), the tree policy "
                "learned on half of them; its test split was not read"),
    Recipe("vllm-table", ["specgym tune vllm --workload midpair-greedy --profile batch-a100-7b-roofline "
                          "--max-batch 512 --out tuned.json"], vllm_table_collect, vllm_table_table,
           note="a roofline model of a 7B target on an A100, not a measurement"),
    Recipe("serving-under-load-midpair", ["specgym tune sweep --workload midpair-greedy --profile batch-cpu-midpair "
                                          "--k-max 8 --concurrency 1,4,16,64,128,256 --controllers all "
                                          "--json midpair.json"], sweep_collect, sweep_table,
           test_split="midpair-greedy; how often measured: not recorded"),
    Recipe("live-smollm2-replay", [eval_command("smollm2-greedy", "all", " --split test --profile cpu-smollm2")],
           smollm2_collect, smollm2_table,
           test_split="smollm2-greedy's 36 test prompts, not a clean held-out split (see the page's header)"),
    Recipe("live-smollm2-runs", ["specgym workloads show smollm2-greedy --split test"], smollm2_runs_collect,
           smollm2_runs_table, test_split="smollm2-greedy's 36 test prompts (a summary of the recording)"),
    Recipe("write-ups-speclane", [
        "specgym workloads make --preset speclane-mix --requests 10000 --seed 0 --out slm10k.parquet",
        eval_command("slm10k.parquet", "fixed:2,fixed:4,fixed:8,speclane,speclane:ratio", " --split all"),
        "specgym workloads make --preset speclane-uniform --requests 2000 --seed 0 --out uniform.parquet",
        eval_command("uniform.parquet", "fixed:2,fixed:4,fixed:8,speclane,speclane:ratio", " --split all")],
        speclane_collect, speclane_table, note="synthetic workloads; the write-up columns quote the SpecLane write-up"),
    Recipe("write-ups-assc", [eval_command("assc-regimes", "fixed:2,fixed:4,fixed:5,fixed:8,assc,speclane",
                                           " --split all")], assc_collect, assc_table,
           note="synthetic workload; the write-up columns quote the ASSC write-up"),
]


def machine() -> str:
    """Where the replay ran (its figures do not depend on it)."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "unknown CPU"
    return f"deterministic, from shipped data or a fixed seed (any machine gives these figures); run on {cpu} " \
           f"({os.cpu_count()} CPUs)"


def build(recipe: Recipe, output: Output, date: str, where: str) -> Table:
    """The table JSON of a recipe: source, the rows built from ``output``, and ``output`` itself."""
    source: dict[str, str] = {"command": " && ".join(recipe.commands), "machine": where, "date": date,
                              "provenance": render.MACHINE}
    if recipe.test_split:
        source["test_split"] = recipe.test_split
    if recipe.note:
        source["note"] = recipe.note
    return {"source": source, **recipe.table(output), "output": output}


def main(argv: list[str] | None = None) -> int:
    """Re-runs (or, with --rebuild, rebuilds) the named tables, then renders every page."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="tables to re-run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the tables and their commands")
    parser.add_argument("--rebuild", action="store_true",
                        help="run nothing: rebuild the rows from each file's stored output (after editing a table)")
    args = parser.parse_args(argv)
    known = {r.name: r for r in RECIPES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"no replay table {', '.join(unknown)} (known: {', '.join(known)})")
    if args.list:
        for r in RECIPES:
            print(f"{r.name}: {' && '.join(r.commands)}")
        return 0
    date, where = datetime.date.today().isoformat(), machine()
    for name in args.names or list(known):
        path = render.DATA / f"{name}.json"
        if args.rebuild:
            stored = render.load_table(path)
            table = {"source": stored["source"], **known[name].table(stored["output"]), "output": stored["output"]}
        else:
            with tempfile.TemporaryDirectory() as tmp:
                table = build(known[name], known[name].collect(Path(tmp)), date, where)
        path.write_text(render.dump_table(table))
        print(f"wrote {path.relative_to(render.RESULTS.parent.parent)}")
    return render.main([])


if __name__ == "__main__":
    sys.exit(main())

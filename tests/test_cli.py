"""The ``specgym`` commands do what they say: workloads make/show/list, bench and tune tables, eval reports and
plots, generate's summary (live trees, token-level controllers), shipped pairs and prompts by name, help for every
spec and option, and valid but unusual inputs (inline batch-size tables) that must run.

Their errors are tested by concern: ``test_cli_errors_options.py`` (bad flags and values),
``test_cli_errors_inputs.py`` (bad files, fields and workloads), ``test_cli_outputs.py`` (outputs: overwrites,
atomic writes, interrupts), ``test_cli_fuzz.py`` (every command with a table of bad values).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specgym.cli import build_parser, main
from specgym.envs.workloads.trace_format import load_workload
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.report import markdown_table
from specgym.paths import MODELS_DIR

ROOT = Path(__file__).resolve().parent.parent


# -------------------------------------------------------------------------------------------- workloads
def test_workloads_make_and_show(tmp_path, capsys):
    out = tmp_path / "w.parquet"
    assert main(["workloads", "make", "--preset", "assc-regimes", "--requests", "30", "--seed", "4",
                 "--out", str(out)]) == 0
    wl = load_workload(out)
    assert wl.n_requests == 30 and wl.is_synthetic and wl.source["seed"] == 4
    assert main(["workloads", "show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SYNTHETIC" in text and "splits" in text and "reasoning" in text
    n_test = int((wl.split == "test").sum())
    assert main(["workloads", "show", str(out), "--split", "test"]) == 0  # one split's requests only
    text = capsys.readouterr().out
    assert f"requests  {n_test} " in text and f"splits    train 0  val 0  test {n_test}" in text
    # same seed -> identical file content
    out2 = tmp_path / "w2.parquet"
    main(["workloads", "make", "--preset", "assc-regimes", "--requests", "30", "--seed", "4", "--out", str(out2)])
    assert (load_workload(out2).p_accept == wl.p_accept).all()


def test_workloads_show_says_format_signals_and_sketch(capsys):
    assert main(["workloads", "show", "midpair-greedy"]) == 0
    out = capsys.readouterr().out
    assert "format    v2; signal columns: token_id," in out and "hidden_sketch of 16 dims" in out
    assert "64 bytes per token" in out
    assert main(["workloads", "show", "speclane-mix"]) == 0
    assert "format    v1; signal columns: none" in capsys.readouterr().out


def test_workloads_list_labels_synthetic_and_says_what_the_package_ships(capsys):
    import specgym.catalogue as catalogue
    from specgym.envs.profiles import load_profile

    assert main(["workloads", "list"]) == 0
    out = capsys.readouterr().out
    assert "assc-regimes" in out and "SYNTHETIC" in out.split("assc-regimes", 1)[1].splitlines()[0]
    for name in catalogue.names("profile"):
        desc = load_profile(name).description
        assert desc in out  # whole, never cut mid-word
    for heading in ("shipped model pairs", "shipped prompts files", "shipped acceptance predictors",
                    "shipped policies"):
        assert heading in out
    assert "midpair-prompts" in out and "midpair-predicted" in out and "trained on midpair-greedy" in out
    assert "fallback on conf, shape, position, lookup" in out


def test_shipped_pairs_and_prompts_by_name_from_any_folder(tmp_path, monkeypatch):
    import specgym
    import specgym.catalogue as catalogue
    from specgym.errors import SpecgymError
    from specgym.paths import WORKLOADS_DIR

    monkeypatch.chdir(tmp_path)  # not the checkout root
    shipped = WORKLOADS_DIR / "midpair-prompts.jsonl"
    assert catalogue.resolve("prompts", "midpair-prompts") == shipped
    assert catalogue.resolve("prompts", "data/workloads/midpair-prompts.jsonl") == shipped
    elsewhere = Path("elsewhere/midpair-prompts.jsonl")
    assert catalogue.resolve("prompts", elsewhere) == elsewhere  # no guess
    with pytest.raises(SpecgymError, match="no shipped model pair 'nopair'"):
        specgym.load_pair("nopair")
    pytest.importorskip("transformers")
    tok, draft, target = specgym.load_pair("tinypair")
    assert tok("def f():")["input_ids"] and draft.config.vocab_size == target.config.vocab_size


# ---------------------------------------------------------------------------------------- bench and tune
def test_bench_vector_prints_its_figures_on_one_line_when_piped():
    r = subprocess.run([sys.executable, "-m", "specgym", "bench", "vector", "--workload",
                        "assc-regimes"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "rounds/s" in r.stdout and "assc-regimes" in r.stdout
    row = [ln for ln in r.stdout.splitlines() if "rounds/s" in ln]
    assert row and ("MISSED" in row[0] or "met" in row[0])  # figure, measured and target on the same line


def test_tune_compare_reference_row_is_not_a_loser(capsys):
    assert main(["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline",
                 "--controllers", "goodput,static:1", "--replications", "2", "--requests", "8",
                 "--max-batch", "8"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| goodput")]
    assert rows == [rows[0]] and "(reference)" in rows[0] and "/2" not in rows[0]


def test_tune_vllm_prints_one_column_when_the_best_static_k_is_no_speculation():
    from specgym.eval.tune import describe

    result = {"workload": "w", "synthetic": True, "profile": "p", "profile_source": "measured", "max_batch": 8,
              "vllm_fragment": "[]", "static_k": 0, "checks": [], "no_worse_than_static_everywhere": True,
              "seconds": 0.1, "ranges": [{"start_bs": 1, "end_bs": 8, "k": 0, "speedup_vs_static": 1.0,
                                          "speedup_vs_no_spec": 1.0}]}
    lines = describe(result)
    row = next(ln for ln in lines if ln.strip().startswith("1 -"))
    assert row.count("1.000x") == 1
    result["static_k"] = 2
    row = next(ln for ln in describe(result) if ln.strip().startswith("1 -"))
    assert row.count("x") == 2


def test_tune_sweep_default_k_max_fits_the_shipped_batch_profiles(capsys):
    """The report: ``tune sweep`` failed on both shipped batch profiles with its default ``--k-max 12``."""
    for profile in ("batch-a100-7b-roofline", "batch-cpu-midpair"):
        assert main(["tune", "sweep", "--workload", "assc-regimes", "--profile", profile, "--replications", "1",
                     "--concurrency", "1,4", "--controllers", "goodput"]) == 0, capsys.readouterr().err
        assert "K in 0..8" in capsys.readouterr().out


# ------------------------------------------- valid but unusual inputs: they must work (new-user run 5, F1)
UNUSUAL_OK: list[list[str]] = [
    ["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
     "--requests", "4", "--controllers", "table:[[1,32,3]],goodput"],
    ["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
     "--requests", "4", "--controllers", "goodput,table:[[1,8,3],[9,256,1]], static:2"],
    ["tune", "sweep", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
     "--concurrency", "1,4", "--k-max", "8", "--controllers", "table:[[1,8,3],[9,32,1]]"],
]


@pytest.mark.parametrize("argv", UNUSUAL_OK, ids=[" ".join(a[:2]) + "|" + a[-1] for a in UNUSUAL_OK])
def test_valid_inline_tables_run(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    for spec in argv[-1].split("]],"):  # every inline table is a row of the report, as written
        if spec.strip().startswith("table:"):
            assert spec.strip() + ("" if spec.strip().endswith("]]") else "]]") in out, out


# ---------------------------------------------------------------------------------------------- eval
def test_help_lists_every_spec_and_every_option_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    eval_help = sub.choices["eval"].format_help()
    assert "speclane[:ratio]" in eval_help and "ppo:NAME|DIR" in eval_help
    missing = []
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help" and not action.help:
                missing.append(f"{name} {action.option_strings[0]}")
    assert not missing, missing
    assert "--k-max" in sub.choices["train"].format_help()


def test_help_groups_the_model_building_commands_under_their_heading(capsys):
    """``specgym --help`` lists train-lm-pair, data, train-draft and train-head together, last, under one heading (the
    PPO ``train`` stays with the replay commands)."""
    assert main(["--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [ln.split()[0] for ln in lines if ln.startswith("    ") and not ln.startswith("     ")]
    heading = lines.index("  model building:")
    below = [ln.split()[0] for ln in lines[heading + 1:] if ln.startswith("    ") and not ln.startswith("     ")]
    assert below == ["train-lm-pair", "data", "train-draft", "train-head"]
    assert names[-4:] == below and "train" in names[:-4] and lines[heading - 1] == ""
    assert sum(ln.strip().endswith(":") and ln.startswith("  ") and not ln.startswith("   ") for ln in lines) == 1


def test_eval_label_is_the_spec_the_user_typed(tmp_path, capsys):
    from specgym.agents.artifact import random_artifact, write_artifact

    write_artifact(random_artifact("k"), tmp_path / "pol")
    out = tmp_path / "ev"
    assert main(["eval", "--workload", "assc-regimes", "--controllers", f"fixed:2,ppo:{tmp_path / 'pol'}",
                 "--max-requests", "5", "--no-plots", "--out", str(out)]) == 0
    rows = json.loads((out / "report.json").read_text())["rows"]
    assert {r["controller"] for r in rows} == {"fixed:2", f"ppo:{tmp_path / 'pol'}"}


def test_tree_oracle_closes_no_headroom_against_the_chain_limit(tmp_path):
    wl = load_workload("midpair-greedy")
    sub = wl.subset(np.concatenate([wl.split_indices(s)[:4] for s in ("train", "test")]))
    rep = evaluate(EvalConfig(workload=sub, controllers="fixed:3,tree-oracle", bootstrap=0))
    table = markdown_table(rep)
    oracle_line = next(line for line in table.splitlines() if line.startswith("| tree-oracle"))
    cells = [c.strip() for c in oracle_line.strip("|").split("|")]
    assert cells[6] == cells[7] == "–"  # headroom closed (clairvoyant / informed): a limit, not a controller
    assert "clairvoyant limit of chain drafts" in table


def test_k_over_time_ticks_are_whole_numbers_and_the_title_says_what_is_shown(tmp_path):
    import matplotlib.pyplot as plt

    from specgym.eval.plots import plot_k_over_time

    out = tmp_path / "ev"
    assert main(["eval", "--workload", "assc-regimes", "--controllers", "assc,marginal,fixed:3", "--k-max", "3",
                 "--max-requests", "6", "--bootstrap", "0", "--out", str(out)]) == 0
    fig = plot_k_over_time(json.loads((out / "report.json").read_text()))
    try:
        for ax in fig.axes:
            assert all(float(t).is_integer() for t in ax.get_yticks())
        assert "adaptive controllers only" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------- live: generate, profile
def test_generate_runs_a_live_tree_and_refuses_a_replay_only_one(capsys, one_line_error):
    pytest.importorskip("torch")
    tiny = ["--draft", str(MODELS_DIR / "tinypair" / "draft"), "--target", str(MODELS_DIR / "tinypair" / "target")]
    assert main(["generate", *tiny, "--prompt", "def f(x):", "--controller", "tree-static:2-1",
                 "--max-new-tokens", "12", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["greedy_identical"] and res["tokens"] == 12 and set(res["nodes_per_round"]) <= {0, 1, 2, 4}
    assert main(["generate", *tiny, "--prompt", "x", "--controller", "tree-predicted:midpair"]) == 2
    one_line_error(capsys, "runs in replay only")


def test_token_level_generate_shows_what_was_drafted(capsys):
    """The cap of a token-level controller is k_max every round; what it decided is how many it drafted."""
    pytest.importorskip("transformers")
    pair = ["--draft", str(MODELS_DIR / "tinypair" / "draft"), "--target", str(MODELS_DIR / "tinypair" / "target")]
    assert main(["generate", *pair, "--prompt", "def f(x):", "--controller", "confidence:0.4",
                 "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "(token-level); drafted per round:" in out and "K per round" not in out
    assert main(["generate", *pair, "--prompt", "def f(x):", "--controller", "confidence:0.4",
                 "--max-new-tokens", "12", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sum(doc["drafted_per_round"]) == doc["drafted"]


def test_profile_reports_progress():
    pytest.importorskip("torch")
    from specgym.envs.engines.live.model_loading import load_pair
    from specgym.envs.engines.live.profiler import measure_profile

    pair = load_pair(str(MODELS_DIR / "tinypair" / "draft"), str(MODELS_DIR / "tinypair" / "target"),
                     fast_kernels=False)
    seen: list[float] = []
    measure_profile(pair, k_max=2, context=16, repeats=3, warmup=1, progress=seen.append)
    assert seen and seen == sorted(seen) and 0.0 <= seen[0] and seen[-1] < 1.0

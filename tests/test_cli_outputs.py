"""CLI outputs say what they mean: a demo run twice or after an interrupt, the reference row of ``tune``, whole-number
plot ticks and titles, shipped pairs and prompts by name from any folder, what a token-level ``generate`` drafted."""

from __future__ import annotations

import json
from pathlib import Path

from specgym.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_make_demo_can_run_twice():
    """``make demo`` passes --force: a demo folder specgym wrote (finished or interrupted) is replaced."""
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:")[1].split("\n\n")[0]
    assert "specgym demo --force" in recipe


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


def test_shipped_pairs_and_prompts_by_name_from_any_folder(tmp_path, monkeypatch):
    import pytest

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


def test_token_level_generate_shows_what_was_drafted(capsys):
    """The cap of a token-level controller is k_max every round; what it decided is how many it drafted."""
    import pytest

    pytest.importorskip("transformers")
    from specgym.paths import MODELS_DIR

    pair = ["--draft", str(MODELS_DIR / "tinypair" / "draft"), "--target", str(MODELS_DIR / "tinypair" / "target")]
    assert main(["generate", *pair, "--prompt", "def f(x):", "--controller", "confidence:0.4",
                 "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "(token-level); drafted per round:" in out and "K per round" not in out
    assert main(["generate", *pair, "--prompt", "def f(x):", "--controller", "confidence:0.4",
                 "--max-new-tokens", "12", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sum(doc["drafted_per_round"]) == doc["drafted"]


def test_an_interrupted_demo_can_be_run_again_with_force(tmp_path, monkeypatch):
    """Ctrl-C in the middle of a demo leaves a folder specgym owns: the next ``make demo`` (--force) replaces it."""
    import pytest

    pytest.importorskip("stable_baselines3")
    from specgym.training.rewards import TokenValueReward

    calls = {"n": 0}
    original = TokenValueReward.step

    def interrupting(self, action):
        calls["n"] += 1
        if calls["n"] == 300:
            raise KeyboardInterrupt
        return original(self, action)

    root = tmp_path / "demo"
    args = ["demo", "--workload", "assc-regimes", "--out", str(root), "--k-steps", "512", "--no-token", "--force"]
    monkeypatch.setattr(TokenValueReward, "step", interrupting)
    assert main(args) == 130
    monkeypatch.undo()
    assert main(args) == 0
    assert (root / "report" / "report.md").is_file()


def test_bench_json_refuses_an_existing_file_without_force(tmp_path, capsys):
    """The report (F6): ``bench vector --json out/important.json`` replaced the user's file. Now it is refused like
    every other output, and ``--force`` replaces it."""
    mine = tmp_path / "important.json"
    mine.write_text('{"mine": 1}\n')
    assert main(["bench", "vector", "--workload", "assc-regimes", "--json", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"--json {mine}: already exists (pass --force to replace it)" in err
    assert mine.read_text() == '{"mine": 1}\n'
    assert main(["bench", "vector", "--workload", "assc-regimes", "--json", str(mine), "--force"]) == 0
    assert json.loads(mine.read_text())["workload"] == "assc-regimes"
    (tmp_path / "bench-vllm").mkdir()
    (tmp_path / "bench-vllm" / "vllm.json").write_text("{}\n")  # an earlier `bench vllm` run's results
    assert main(["bench", "vllm", "--out", str(tmp_path / "bench-vllm")]) == 2  # refused before vLLM is needed
    assert "holds an earlier run's vllm.json (pass --force" in capsys.readouterr().err
    commands = (ROOT / "Makefile").read_text().replace("\\\n", " ").splitlines()  # one line per command
    benches = [c for c in commands if " bench " in c and "--json" in c]
    assert len(benches) >= 4 and all("--force" in c for c in benches)  # make's re-runs replace their figures


def test_bench_and_tune_errors_name_the_sub_command(capsys):
    """The report: some errors printed as ``specgym bench:``, others as ``specgym bench live:``."""
    assert main(["bench", "live", "--device", "tpu"]) == 2
    assert capsys.readouterr().err.startswith("specgym bench live: error: --device 'tpu'")
    assert main(["tune", "sweep", "--workload", "assc-regimes", "--profile", "batch-cpu-midpair", "--k-max", "12"]) == 2
    assert capsys.readouterr().err.startswith("specgym tune sweep: error: --k-max 12: batch profile "
                                              "'batch-cpu-midpair' prices K up to 8")


def test_tune_sweep_default_k_max_fits_the_shipped_batch_profiles(capsys):
    """The report: ``tune sweep`` failed on both shipped batch profiles with its default ``--k-max 12``."""
    for profile in ("batch-a100-7b-roofline", "batch-cpu-midpair"):
        assert main(["tune", "sweep", "--workload", "assc-regimes", "--profile", profile, "--replications", "1",
                     "--concurrency", "1,4", "--controllers", "goodput"]) == 0, capsys.readouterr().err
        assert "K in 0..8" in capsys.readouterr().out

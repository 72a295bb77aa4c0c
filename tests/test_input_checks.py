"""Input checks: every doubtful input is decided explicitly, never accepted silently: an error where the input
cannot mean what it says, a warning where the result is an extrapolation, a label that names what it compares with."""

from __future__ import annotations

import json

import pytest

from specgym.cli import main
from specgym.errors import SpecgymError


@pytest.mark.parametrize("argv,fragment", [
    (["generate", "--prompt", "x", "--k", "2", "--controller", "assc"], "not both"),  # used to run fixed:2
    (["train", "--domains", "generalist", "--workload", "assc-regimes"], "drop --workload"),  # ignored X
    (["eval", "--suite", "generalization", "--workload", "assc-regimes"], "drop --workload"),
    (["eval", "--suite", "generalization", "--profile", "speclane-table"], "drop --profile"),
    (["profile", "--batch-sizes", "", "--out", "p.json"], "--batch-sizes"),  # used to measure a plain profile
    (["train", "--workload", "assc-regimes", "--timesteps", "1"], "multiple of n_envs = 16"),  # ran 16 steps
])
def test_contradictory_or_impossible_options_are_refused(argv, fragment, capsys, tmp_path, monkeypatch, one_line_error):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    one_line_error(capsys, fragment)
    assert list(tmp_path.iterdir()) == []


def test_an_implausible_profile_time_is_refused(tmp_path):
    from specgym.envs.profiles import load_profile

    doc = load_profile("speclane-table").to_dict()
    doc["draft_ms"] = 1e300
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecgymError, match="not a plausible time"):
        load_profile(path)


def test_tune_vllm_warns_when_it_extrapolates_the_profile(capsys):
    assert main(["tune", "vllm", "--workload", "assc-regimes", "--profile", "batch-cpu-midpair",
                 "--max-batch", "64"]) == 0
    assert "extrapolation" in capsys.readouterr().err
    assert main(["tune", "vllm", "--workload", "assc-regimes", "--profile", "batch-cpu-midpair",
                 "--max-batch", "16"]) == 0
    assert "extrapolation" not in capsys.readouterr().err


def test_eval_columns_name_the_k_they_compare_with(tmp_path, capsys):
    assert main(["eval", "--workload", "assc-regimes", "--k-max", "1", "--max-requests", "5", "--bootstrap", "0",
                 "--no-plots", "--out", str(tmp_path / "e")]) == 0
    head = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| controller")][0]
    assert "vs K=1" in head and "vs best fixed (K=1)" in head and "vs K=4" not in head


def test_the_suite_report_says_it_looked_at_a_few_requests_only():
    from specgym.envs.workloads.domains import Cell
    from specgym.eval.suite import markdown, run_suite

    rep = run_suite(["confidence:0.4"], cells=[Cell("speclane-mix@777000", "speclane-table", "all")], bootstrap=0,
                    max_requests=5)
    assert "only the first 5 requests of each cell" in markdown(rep)

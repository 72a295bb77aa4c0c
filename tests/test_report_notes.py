"""Runs that are valid but not what a user may assume carry a note, never silence: a profile pricing a drafter it was
not measured with, a run predictor fitted on another workload, a drafter-choice policy on one drafter, serving on the
default drafter of several (new-user run 5, F10)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from specdecode_files import synthetic_file

from specgym.agents.drafter_policy import DrafterPolicyController
from specgym.cli import main
from specgym.envs.profiles import load_profile


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Two SYNTHETIC SpecDecode-Bench-format workloads (eagle and n-gram runs), imported."""
    tmp = tmp_path_factory.mktemp("imp")
    for ds in ("cnn", "gsm8k"):
        synthetic_file(tmp / "src" / f"combined_{ds}.jsonl", n=40, seed=len(ds))
    assert main(["workloads", "import", "specdecode-bench", str(tmp / "src"), "--out", str(tmp / "w")]) == 0
    return tmp / "w"


def test_a_profile_without_the_traces_drafters_says_how_it_prices_them():
    drafters = [("eagle", "model"), ("ngram", "lookup")]
    notes = load_profile("cpu-midpair").pricing_notes(drafters)
    assert notes == ["cost profile 'cpu-midpair' has no 'eagle' drafter: its rounds are priced as the draft model",
                     "cost profile 'cpu-midpair' has no 'ngram' drafter: its rounds are priced as prompt lookup (no "
                     "draft cost: the verify and the overheads)"]
    assert load_profile("h100-llama31-8b").pricing_notes(drafters) == []
    assert load_profile("cpu-midpair").pricing_notes([("draft", "model")]) == []  # one drafter: nothing to say


def test_eval_notes_a_run_predictor_fitted_elsewhere(imported, tmp_path, capsys):
    rp = tmp_path / "rp.json"
    assert main(["predictor", "train-runs", "--workload", str(imported / "specdecode-cnn.parquet"), "--out",
                 str(rp)]) == 0
    capsys.readouterr()
    assert main(["eval", "--workload", str(imported / "specdecode-gsm8k.parquet"), "--profile", "cpu-midpair",
                 "--k-max", "8", "--split", "all", "--max-requests", "3", "--controllers",
                 f"drafter-marginal:{rp},fixed:4", "--bootstrap", "0", "--no-plots", "--out",
                 str(tmp_path / "ev")]) == 0
    err = capsys.readouterr().err
    assert "its run predictor was fitted on specdecode-cnn, not on specdecode-gsm8k" in err, err
    assert "cost profile 'cpu-midpair' has no 'ngram' drafter" in err, err


def test_tune_says_which_drafter_serving_replays(imported, capsys):
    assert main(["tune", "vllm", "--workload", str(imported / "specdecode-cnn.parquet"), "--profile",
                 "h100-llama31-8b", "--max-batch", "4"]) == 0
    assert "serving replays the default one, eagle" in capsys.readouterr().err


def test_a_drafter_policy_on_one_drafter_says_so():
    ctrl = object.__new__(DrafterPolicyController)  # prepare reads only the workload (and fits a guard's teacher)
    ctrl.teacher = None  # an unguarded policy
    assert ctrl.prepare(SimpleNamespace(drafter_names=["eagle"]), None) == [
        "a drafter-choice policy on a workload with one drafter (eagle): it chooses only that drafter's K or no draft"]
    assert ctrl.prepare(SimpleNamespace(drafter_names=["eagle", "ngram"]), None) == []

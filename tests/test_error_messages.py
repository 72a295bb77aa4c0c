"""Error lines say what is wrong, in one short line: the bad part named, never an internal path, never advice that
leads back to the same error (the new-user runs' misleading messages)."""

from __future__ import annotations

import pytest

import specgym
from specgym.cli import main
from specgym.errors import SpecgymError

TUNE = ["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
        "--requests", "4"]


def _line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv, says, never", [
    (["eval", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--no-plots"],
     "'batch-a100-7b-roofline' is a batched serving profile", "__editable__"),
    (["train", "--mode", "drafter", "--workload", "midpair-greedy", "--timesteps", "64"],
     "holds one drafter", "verify_ms"),
    (["eval", "--workload", "assc-regimes", "--controllers", "fixed:17@ngram", "--no-plots"],
     "K in 0..8 (e.g. 4@ngram)", "10@ngram"),
    ([*TUNE, "--controllers", "per-seq:fixed:4@ngram"], "'@DRAFTER' picks a drafter", "integer K"),
    (["generate", "--prompt", "hi", "--controller", "drafter-marginal", "--temperature", "0.5"],
     "fits itself on a recording of the pair at temperature 0.5", "integer K"),
    (["tune", "sweep", "--workload", "assc-regimes", "--profile", "h100-llama31-8b", "--capture-sizes", "0,-1"],
     "capture sizes must be 1..4096", "concurrencies"),
    ([*TUNE, "--controllers", "bogus"], "'specgym tune compare --help' lists the valid forms", "goodput"),
])
def test_messages_name_the_real_problem(tmp_path, capsys, monkeypatch, argv, says, never):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = _line(capsys)
    assert says in err and never not in err, err
    assert len(err) < 300, err
    assert list(tmp_path.iterdir()) == []


def test_make_controller_with_a_list_says_so():
    with pytest.raises(SpecgymError, match="one spec expected, got a comma-separated list"):
        specgym.make_controller("fixed:4,assc")

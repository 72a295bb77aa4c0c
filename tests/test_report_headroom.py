"""The report's headroom share: computed only over a gap worth sharing (a gap within noise gives a dash, not a
share such as -69649%)."""

from __future__ import annotations

import pytest

from specgym.eval.metrics import MIN_HEADROOM, headroom_closed
from specgym.eval.report import headroom_section


def test_headroom_share_of_a_real_gap():
    assert headroom_closed(100.0, 95.0, 90.0) == pytest.approx(0.5)
    assert headroom_closed(100.0, 104.0, 90.0) == pytest.approx(-0.4)


def test_no_share_of_a_gap_within_noise():
    # the informed oracle 0.001% faster than the best fixed K, a controller 0.7% slower: was -69,649%
    assert headroom_closed(100.0, 100.7, 99.999) is None
    assert headroom_closed(100.0, 99.0, 100.0 * (1 - MIN_HEADROOM / 2)) is None
    assert headroom_closed(100.0, 101.0, 100.5) is None  # an oracle slower than the best fixed K (luck)


def test_the_report_prints_a_dash_for_it():
    report = {"headroom": {"chance_share": None, "clairvoyant_tok_s": 50.0, "informed_tok_s": 40.0,
                           "best_fixed_tok_s": 40.0, "chance_tok_s": 10.0, "removable_tok_s": 0.0},
              "rows": [{"controller": "marginal", "throughput_tok_s": 39.7, "prediction_decision_tok_s": 0.3,
                        "headroom_closed": -0.03, "headroom_closed_informed": headroom_closed(25.0, 25.2, 24.9999)}]}
    line = headroom_section(report).splitlines()[-1]
    assert line.endswith("| – |") and "-3.0%" in line


def test_a_drafter_evaluation_is_measured_against_the_drafter_oracle():
    """On the real pair's recording the chain oracle (the draft model alone) is passed by drafter choice; the table
    leads with the drafter oracle, and every ratio and headroom share is taken against it (the report's F9)."""
    from specgym.eval.harness import EvalConfig, evaluate
    from specgym.eval.report import markdown_table

    rep = evaluate(EvalConfig("smollm2-greedy", "fixed:3@head,drafter-marginal", split="test",
                              profile="cpu-smollm2", bootstrap=0))
    limit, rows = rep["drafter_oracle"], {r["spec"]: r for r in rep["rows"]}
    assert limit["drafters"] == ["draft", "ngram", "head"] and limit["oracle_ratio"] == pytest.approx(1.0)
    assert rows["drafter-marginal"]["throughput_tok_s"] > rep["oracle"]["throughput_tok_s"]  # passes the chain oracle
    for row in (*rows.values(), rep["oracle"]):
        assert 0 < row["oracle_ratio"] <= 1.0 and row["headroom_closed_informed"] is None, row
    assert rows["fixed:3@head"]["headroom_closed"] == pytest.approx(0.0)  # the best single drafter closes none
    assert 0 < rows["drafter-marginal"]["headroom_closed"] < 1
    table = markdown_table(rep).splitlines()
    assert table[2].startswith("| **drafter oracle** (clairvoyant limit of drafter choice among draft, ngram, head)")
    assert "of the default drafter, draft, alone" in table[3]

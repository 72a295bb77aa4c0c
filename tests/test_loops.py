"""Repetition loops: one definition (:func:`specgym.envs.workloads.loops.is_looped`), read per request from a
workload (:meth:`Workload.looped`) by every table that reports figures also without the looping answers."""

from __future__ import annotations

import numpy as np

from specgym.catalogue import resolve
from specgym.envs.workloads.loops import is_looped, loop_share
from specgym.envs.workloads.parquet_io import read_workload_file
from specgym.envs.workloads.synthetic import generate_workload


def test_is_looped_needs_a_periodic_tail():
    assert is_looped([1, 2, 3] * 30)
    assert not is_looped(list(range(100)))
    assert not is_looped([7] * 10)  # shorter than the tail: never a loop


def test_workload_looped_matches_the_recorders_summary():
    wl = read_workload_file(resolve("workload", "smollm2-greedy"))
    flags = wl.looped()
    assert flags is not None and flags.dtype == bool and len(flags) == wl.n_requests
    assert 0 < flags.sum() < wl.n_requests
    assert flags.mean() == wl.extra["loop_share"]
    completions = [wl.token_id[wl.span(r)].tolist() for r in range(wl.n_requests)]
    assert flags.mean() == loop_share(completions)
    r = int(np.flatnonzero(flags)[0])
    assert is_looped(completions[r])


def test_a_trace_without_tokens_has_no_loop_flags():
    assert generate_workload("speclane-mix", 20, seed=0).looped() is None


def test_eval_reports_every_row_also_without_the_looping_answers(tmp_path):
    """``specgym eval`` on a recording with loops repeats each row's ratios on the requests that do not loop, with
    paired intervals over those requests; left out: exactly the looping requests."""
    from specgym.eval.harness import EvalConfig, evaluate
    from specgym.eval.report import markdown_report

    report = evaluate(EvalConfig(workload="smollm2-greedy", controllers="fixed:3@head,fixed:4@ngram", bootstrap=200,
                                 per_request=True))
    loops = report["without_loops"]
    wl = read_workload_file(resolve("workload", "smollm2-greedy"))
    test = wl.split_indices("test")
    flags = wl.looped()[test]
    assert loops["looped_requests"] == int(flags.sum()) > 0 and loops["requests"] == int((~flags).sum())
    assert set(loops["looped_ids"]) == set(wl.request_id[test][flags].tolist())
    times = report["per_request_time_ms"]
    head, ngram = np.asarray(times["fixed:3@head"]), np.asarray(times["fixed:4@ngram"])
    row = loops["rows"]["fixed:4@ngram"]
    assert row["speedup_vs_best_single_drafter"] == np.float64(head[~flags].sum() / ngram[~flags].sum())
    assert row["speedup_vs_best_single_drafter"] != report["rows"][1]["speedup_vs_best_single_drafter"]
    lo, hi = row["ci95"]["speedup_vs_best_single_drafter"]
    assert lo <= row["speedup_vs_best_single_drafter"] <= hi
    assert "Without the looping answers" in markdown_report(report, plots=False)
    synthetic = evaluate(EvalConfig(workload="speclane-mix", controllers="fixed:2", max_requests=5, bootstrap=0))
    assert "without_loops" not in synthetic

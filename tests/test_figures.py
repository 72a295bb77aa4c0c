"""One home for an evaluation's figures: the references (computed once, reused by ``fixed:K`` rows and shards), the
``Figures`` record of every row, one ``ValidationResult`` for training, one paired bootstrap, one geometric mean."""

from __future__ import annotations

import math

import numpy as np
import pytest

import specgym.eval.harness as harness
import specgym.eval.stats as stats
from specgym.agents.artifact import load_policy
from specgym.baselines.fixed import FixedK
from specgym.catalogue import resolve
from specgym.envs.profiles import load_batch_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.eval.batch_eval import compare
from specgym.eval.harness import EvalConfig, evaluate, open_replay, resolve_controllers, run_controllers
from specgym.eval.metrics import figures, oracle_figures
from specgym.eval.references import References, references
from specgym.eval.stats import PairedBootstrap, geomean
from specgym.training.validation import ValidationResult, validate_policy


def test_a_fixed_k_row_is_its_reference_run(mix_workload):
    replay = open_replay(mix_workload, "all", seed=4, k_max=6)
    refs = references(replay.engine, replay.requests)

    class Stubborn(FixedK):  # a subclass may behave differently: it is run, not taken from the references
        pass

    named = [("fixed:3", FixedK(3)), ("mine", Stubborn(3))]
    same, own = run_controllers(replay, named, refs)
    assert same.time_ms is refs.fixed[3].time_ms and same.name == "fixed:3"
    assert own.time_ms is not refs.fixed[3].time_ms
    np.testing.assert_array_equal(own.time_ms, refs.fixed[3].time_ms)  # ... and the reuse changes nothing


def test_figures_are_the_documented_ratios(mix_workload):
    replay = open_replay(mix_workload, "all", seed=1, k_max=8)
    refs = references(replay.engine, replay.requests)
    (run,) = run_controllers(replay, resolve_controllers("assc", 8), refs)
    f = figures(run, refs)
    t = run.time_ms.sum()
    assert f.speedup_vs_best_fixed == pytest.approx(refs.fixed[refs.best_k].time_ms.sum() / t)
    assert f.speedup_vs_ar == pytest.approx(refs.lengths.sum() * refs.t_ar_ms / t)
    assert f.oracle_ratio == pytest.approx(refs.oracle_ms.sum() / t) and f.oracle_ratio <= 1.0
    assert f.mean_accept_len == pytest.approx(run.tokens.sum() / run.rounds.sum())
    assert f.headroom_closed == pytest.approx((refs.t_best - t) / (refs.t_best - refs.t_oracle))
    oracle = oracle_figures(refs)
    assert oracle.oracle_ratio == 1.0 and oracle.rounds is None
    assert "mean_k" not in oracle.to_dict() and "mean_k" in f.to_dict()  # no rounds, no round figures


def test_references_of_shards_concatenate_to_the_whole(mix_workload):
    replay = open_replay(mix_workload, "all", seed=2, k_max=5)
    whole = references(replay.engine, replay.requests)
    half = len(replay.requests) // 2
    parts = References.concat([references(replay.engine, replay.requests[:half]),
                               references(replay.engine, replay.requests[half:])])
    for k in whole.fixed:
        np.testing.assert_allclose(parts.fixed[k].time_ms, whole.fixed[k].time_ms)
    np.testing.assert_allclose(parts.oracle_ms, whole.oracle_ms)
    np.testing.assert_allclose(parts.informed.time_ms, whole.informed.time_ms)
    assert parts.best_k == whole.best_k and parts.tokens == whole.tokens
    assert parts.informed_expected_ms == pytest.approx(whole.informed_expected_ms)


def test_validation_reports_the_rows_figures_without_bootstrap(monkeypatch):
    art = load_policy(resolve("policy", "midpair-token"))
    report = evaluate(EvalConfig(workload="midpair-greedy", controllers="speclane,confidence:0.4", split="val",
                                 k_max=art.k_max, bootstrap=0))
    rows = {r["spec"]: r for r in report["rows"]}

    def no_bootstrap(*a, **k):
        raise AssertionError("a validation resampled")

    monkeypatch.setattr(harness, "PairedBootstrap", no_bootstrap)
    res = validate_policy(art, "midpair-greedy")
    assert res.best_fixed_k == report["reference"]["best_fixed_k"] and res.requests == report["workload"]["requests"]
    assert res.baseline_tok_s["speclane"] == pytest.approx(rows["speclane"]["throughput_tok_s"])
    assert res.figure("speedup_vs_confidence") == pytest.approx(
        res.throughput_tok_s / rows["confidence:0.4"]["throughput_tok_s"])
    assert res.oracle_tok_s == pytest.approx(report["oracle"]["throughput_tok_s"])
    flat = res.to_dict()
    assert flat["speedup_vs_speclane"] == res.vs["speclane"] and flat["best_fixed_k"] == res.best_fixed_k
    assert "cells" not in flat and res.figure("speedup_vs_goodput") is None  # not measured: absent, not NaN


def test_validation_result_reads_and_describes_every_mode():
    cells = ValidationResult(speedup_vs_best_fixed=1.02, split="val cells", requests=600, vs={"marginal": 0.99},
                             speedup_vs_ar=1.8, oracle_ratio=0.9, cells=12)
    assert cells.figure("speedup_vs_marginal") == 0.99 and cells.figure("throughput_tok_s") is None
    assert "geo-mean of 12 cells" in cells.describe() and "vs marginal 0.990x" in cells.describe()
    batch = ValidationResult(speedup_vs_best_fixed=1.1, split="val", requests=384, vs={"goodput": 1.01},
                             throughput_tok_s=900.0, replications=4)
    assert "4 mixed-concurrency replications" in batch.describe() and "oracle" not in batch.describe()


def test_one_paired_bootstrap_serves_the_batch_comparison():
    wl = cached_workload("speclane-mix")
    res = compare(wl, load_batch_profile("batch-cpu-midpair"), ["static:2", "static:0"], replications=5,
                  requests=16, max_batch=16, split="val")
    thr = {k: np.asarray(v) for k, v in res["per_replication_tok_s"].items()}
    lo, hi = PairedBootstrap(5, 2000, seed=0).ratio_ci(thr["static:0"], thr["static:2"])
    row = {r["controller"]: r for r in res["rows"]}["static:0"]
    assert row["vs_reference_ci95"] == pytest.approx([lo, hi])
    assert lo <= row["vs_reference"] <= hi


def test_one_geometric_mean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0) and math.isnan(geomean([]))
    np.testing.assert_allclose(geomean(np.array([[1.0, 4.0], [4.0, 9.0]]), axis=0), [2.0, 6.0])
    assert stats.geomean is geomean


def test_the_suite_builds_each_controller_once_per_cell(monkeypatch):
    from specgym.envs.workloads.domains import suite_cells
    from specgym.eval import suite as suite_mod

    calls = []
    real = suite_mod.resolve_controllers
    monkeypatch.setattr(suite_mod, "resolve_controllers", lambda *a, **k: calls.append(1) or real(*a, **k))
    cells = suite_cells()[:2]
    rep = suite_mod.run_suite(["marginal"], cells=cells, bootstrap=0, max_requests=3)
    assert len(calls) == len(cells) and len(rep["cells"]) == 2  # the fail-fast build serves the first cell

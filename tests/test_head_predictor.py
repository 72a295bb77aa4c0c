"""``predicted:NAME@head``: the learned-acceptance marginal rule on the draft head, from the head's own top-8.

A head predictor is trained on one example per greedy start and depth of ``topk_head`` / ``runs_head`` and priced in
deployment from ``DraftStep.drafter_topk`` through the same feature function: the rows are proved equal here, on the
same numbers, and so are the probabilities. Training on a recording where the head's acceptance follows its confidence
finds it (validation AUC well above chance, log loss below the constant's); the replayed rule is not ``marginal@head``;
a predictor of the other drafter's tokens is refused in one line naming its file; old predictor files load unchanged.

The workload is a few requests of the shipped ``smollm2-greedy`` recording (its head's cost profile, splits and
lengths) with *synthetic* head columns: random top-8 rows, and runs drawn so that the head's token at depth ``j`` is
accepted with probability its top-1 (labelled synthetic: not the head's real behaviour).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from specgym.agents.specs import build, make
from specgym.envs.core.acceptance_predictor import (
    HEAD_GROUPS,
    AcceptancePredictor,
    head_design_matrix,
    head_features,
    load_predictor,
    save_predictor,
)
from specgym.envs.core.kinds import HEAD_DRAFTER
from specgym.envs.engines.replay.trace_engine import TraceEngine, head_topk
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.envs.workloads.workload import HEAD_TOPK_SCALE
from specgym.errors import SpecgymError
from specgym.eval.drafter_runner import run_drafter_controller
from specgym.eval.runner import run_controller
from specgym.training.predictor import head_dataset, predictor_metrics, select_kind, select_predictor

K_MAX = 8
DATA = Path(__file__).resolve().parents[1] / "data" / "predictors"


def _synthetic(seed: int = 0):
    """A few requests of each split of ``smollm2-greedy`` with synthetic ``topk_head`` / ``runs_head``: top-1 uniform
    in (0.05, 0.99), the head's token at depth ``j`` accepted iff a uniform falls below it (runs: the leading
    accepted depths, at most 8)."""
    full = cached_workload("smollm2-greedy")
    reqs = np.concatenate([full.split_indices(s)[:n] for s, n in (("train", 2), ("val", 10), ("test", 2))])
    wl = full.subset(reqs)
    rng = np.random.default_rng(seed)
    n, depth = wl.n_positions, 8
    top1 = rng.uniform(0.05, 0.99, (n, depth))
    rest = rng.dirichlet(np.ones(9), (n, depth))[:, :, :7] * (1.0 - top1)[:, :, None]
    top = -np.sort(-np.concatenate([top1[:, :, None], rest], axis=2), axis=2)
    accepted = rng.uniform(size=(n, depth)) < top[:, :, 0]
    runs = np.where(accepted.all(axis=1), depth, np.argmin(accepted, axis=1)).astype(np.int16)
    cols = wl.flat_columns()
    cols["topk_head"] = np.rint(top * HEAD_TOPK_SCALE).astype(np.uint16).reshape(n, depth * 8)
    cols["runs_head"] = runs
    return wl.with_columns(cols, name="smollm2-greedy-synthetic-head")


@pytest.fixture(scope="module")
def synthetic():
    wl = _synthetic()
    return wl, TraceEngine(wl, load_profile("cpu-smollm2"), K_MAX)


@pytest.fixture(scope="module")
def trained(synthetic, tmp_path_factory):
    """A head predictor trained on the synthetic workload (fits, kind choice, threshold) and its file."""
    wl, _ = synthetic
    pred, candidates = select_predictor(wl, HEAD_GROUPS, "syn-head", drafter=HEAD_DRAFTER)
    path = tmp_path_factory.mktemp("pred") / "syn-head.json"
    save_predictor(pred, path)
    return pred, candidates, path


def test_training_rows_are_the_replayed_draft_steps_features(synthetic, trained):
    """For every start of a request and every depth the head's earlier tokens were accepted at: the training row
    (head_dataset) equals the features of the replayed head ``DraftStep`` at that token (its ``drafter_topk`` the
    recorded top-8, its ``conf`` their first), and the predictor's probability of the step is that of the row."""
    wl, eng = synthetic
    pred = trained[0]
    r = int(wl.split_indices("val")[0])
    data = head_dataset(wl, HEAD_GROUPS, np.array([r]))
    sl = wl.span(r)
    runs, n = wl.runs[HEAD_DRAFTER][sl], sl.stop - sl.start
    want = [(g, j) for g in range(n) for j in range(1, 9) if j <= n - g - 1 and runs[g] >= j - 1]
    assert len(want) == len(data.y) > 50
    probs = pred.predict_matrix(data.x)
    req = eng.start(r)
    assert HEAD_DRAFTER in req.context.drafter_conf
    for row, (g, j) in enumerate(want):
        req.position = g
        step = req._other_step(HEAD_DRAFTER)(j, K_MAX)
        assert (step.index, step.position) == (j, g + j - 1)
        assert step.conf == pytest.approx(step.drafter_topk[0], abs=0) and math.isnan(step.entropy)
        np.testing.assert_array_equal(head_features(pred.groups, step.drafter_topk, step.position, step.index),
                                      data.x[row])
        assert pred.predict_step(step, 0.0) == pytest.approx(probs[row], rel=1e-9, abs=1e-12)
        assert data.y[row] == float(runs[g] >= j)
    # the matrix is the row function's, row by row; a step without the head's top-8 is not priced
    top = head_topk(wl.topk_head[sl])[:, 0]
    np.testing.assert_array_equal(head_design_matrix(pred.groups, top, np.arange(n), np.ones(n, np.int64)),
                                  [head_features(pred.groups, t, p, 1) for t, p in zip(top.tolist(), range(n))])
    step = req._other_step(HEAD_DRAFTER)(1, K_MAX)
    step.drafter_topk = None
    assert pred.predict_step(step, 0.0) is None


def test_training_finds_acceptance_in_the_heads_confidence(synthetic, trained):
    """Validation AUC far above chance and log loss below the constant's (the base rate); the conf-only logistic is
    about as good (acceptance here is the top-1 itself); the artifact records the drafter and its head columns."""
    wl, _ = synthetic
    pred, candidates, path = trained
    m = candidates[pred.kind]
    val = head_dataset(wl, HEAD_GROUPS, wl.learning_requests()[1])
    base = float(val.y.mean())
    constant = predictor_metrics(np.full(len(val.y), base), val.y)
    assert m["positions"] == len(val.y) > 300
    assert m["auc"] > 0.7 and m["log_loss"] < constant["log_loss"] - 0.05
    conf_only = select_kind([wl], ("conf",), "conf", ("logistic",), drafter=HEAD_DRAFTER)[1]["logistic"]
    assert conf_only["auc"] > 0.7
    assert pred.on_head and pred.columns[:1] == ["logit_conf"] and "entropy" not in pred.columns
    assert "index_1" in pred.columns and pred.continuation == {}
    d = json.loads(path.read_text())
    assert d["drafter"] == HEAD_DRAFTER and load_predictor(path).on_head


def test_the_replayed_rule_prices_the_heads_tokens_and_is_not_marginal(synthetic, trained):
    wl, eng = synthetic
    path = trained[2]
    reqs = wl.split_indices("test")
    ctrl = make(f"predicted:{path}@head", K_MAX, kinds=("drafter",))
    assert ctrl.inner.needs == frozenset({"draft_conf"}) and ctrl.inner.serves == HEAD_DRAFTER
    res = run_drafter_controller(eng, reqs, ctrl)
    base = run_drafter_controller(eng, reqs, make("marginal@head", K_MAX, kinds=("drafter",)))
    assert ctrl.inner.predicted > 50 and ctrl.inner.fallbacks == 0
    assert int(res.tokens.sum()) == int(base.tokens.sum())
    assert not np.array_equal(res.drafted, base.drafted)
    # a spec string parses the same
    assert build(f"predicted:{path}@head", K_MAX, kinds=("drafter",)).controller.name == f"predicted:{path}@head"


def test_a_predictor_on_the_other_drafter_is_refused_in_one_line(synthetic, trained):
    wl, eng = synthetic
    path = trained[2]
    for spec, fragment in (
            ("predicted:midpair@head", r"predicted:midpair@head: predictor \S*midpair.json predicts the draft model's "
                                       r"tokens.*--drafter head"),
            (f"predicted:{path}@ngram", r"predicts the draft head's tokens .*use it as predicted:\S+@head")):
        with pytest.raises(SpecgymError, match=fragment) as err:
            build(spec, K_MAX, kinds=("drafter",))
        assert "\n" not in str(err.value)
    plain = make(f"predicted:{path}", K_MAX)  # parses as a chain rule; refused before it serves
    for run in (lambda: run_controller(eng, wl.split_indices("test")[:1], plain),
                lambda: plain.reset(eng.context(0))):
        with pytest.raises(SpecgymError, match=rf"predicted:{path}: predictor {path} predicts the draft head's "
                                               rf"tokens.*use it as predicted:{path}@head") as err:
            run()
        assert "\n" not in str(err.value)
    for rule, kind in (("planned", "chain"), ("tree-predicted", "tree")):  # the draft model's rules refuse it
        with pytest.raises(SpecgymError, match=rf"\({rule}:{path}: predictor {path} predicts the draft head's tokens"
                                               rf".*it runs as predicted:{path}@head\)") as err:
            make(f"{rule}:{path}", K_MAX, kinds=(kind,))
        assert "\n" not in str(err.value)


def test_old_predictor_files_load_and_the_drafter_is_in_the_checksum(trained, tmp_path):
    """The shipped files have no ``drafter`` field: they load as the draft model's, and write back byte-identical
    function fields (same checksum); a head predictor's drafter is covered by its checksum; an unknown one is
    refused in one line."""
    for f in sorted(DATA.glob("*.json")):
        d = json.loads(f.read_text())
        assert "drafter" not in d
        pred = load_predictor(f)
        assert pred.drafter == "draft" and not pred.on_head
        assert pred.to_dict()["sha256"] == d["sha256"] and "drafter" not in pred.to_dict()
    d = trained[0].to_dict()
    for value, fragment in (("draft", "field 'groups'|checksum mismatch"), ("ngram", "field 'drafter' must be one")):
        bad = tmp_path / f"{value}.json"
        bad.write_text(json.dumps({**d, "drafter": value}))
        with pytest.raises(SpecgymError, match=fragment) as err:
            load_predictor(bad)
        assert "\n" not in str(err.value)
    assert AcceptancePredictor.from_dict(json.loads(json.dumps(d))).drafter == HEAD_DRAFTER


def test_cli_trains_a_head_predictor_beside_the_heads_confidence(synthetic, tmp_path, capsys):
    """``specgym predictor train --drafter head`` on the synthetic recording: it prints the head's calibrated
    confidence beside the fits, writes a head predictor with its provenance; a draft-model group, a workload without
    the head's columns and ``predictor eval`` of it are refused in one line."""
    from specgym.cli import main
    from specgym.envs.workloads.trace_format import save_workload

    wl, _ = synthetic
    path = save_workload(wl, tmp_path / "syn-head.parquet")
    out = tmp_path / "head.json"
    assert main(["predictor", "train", "--drafter", "head", "--workload", str(path), "--out", str(out),
                 "--kinds", "logistic"]) == 0
    text = capsys.readouterr().out
    assert "confidence validation AUC" in text and f"predicted:{out}@head" in text
    pred = load_predictor(out)
    assert pred.on_head and pred.groups == HEAD_GROUPS and pred.meta["drafter"] == HEAD_DRAFTER
    assert pred.meta["pair_draft"] is None and "--drafter head" in pred.meta["reproduce"]
    assert pred.meta["validation"]["confidence"]["auc"] > 0.7
    bare = save_workload(wl.with_columns({k: v for k, v in wl.flat_columns().items() if k != "topk_head"}),
                         tmp_path / "bare.parquet")
    for argv, fragment in ((["--groups", "conf,lookup", "--workload", str(path)], "unknown signal group"),
                           (["--workload", str(bare)], "lacks the draft head's column(s) 'topk_head': record")):
        assert main(["predictor", "train", "--drafter", "head", "--out", str(tmp_path / "x.json"), *argv]) == 2
        err = capsys.readouterr().err
        assert fragment in err and "\n" not in err.strip()
    assert main(["predictor", "eval", "--predictor", str(out), "--workload", str(path)]) == 2
    assert f"predicted:{out}@head" in capsys.readouterr().err

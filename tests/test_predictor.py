"""The acceptance predictor: features shared by training and deployment, fitting, metrics, the pickle-free artifact,
the ``predicted:`` controller and its fall-back to calibrated confidence.

The workloads here are SYNTHETIC v2 traces built in the test (acceptance driven by the lookup signal), not
recordings.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from synthetic_v2 import PROFILE, v2_workload

from specgym import make_controller
from specgym.baselines.marginal import MarginalStop
from specgym.baselines.predicted_marginal import PredictedMarginal
from specgym.envs.core.acceptance_predictor import (
    AcceptancePredictor,
    check_groups,
    design_matrix,
    group_columns,
    load_predictor,
    save_predictor,
)
from specgym.envs.core.rounds import DraftStep
from specgym.envs.core.signals import TOPK
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.errors import SpecgymError
from specgym.eval.runner import run_controller
from specgym.training.predictor import (
    fit_predictor,
    predictor_metrics,
    select_predictor,
    soft_auc,
    workload_dataset,
)

ALL = ("conf", "shape", "position", "lookup")

@pytest.fixture(scope="module")
def wl():
    return v2_workload()


@pytest.fixture(scope="module")
def trained(wl):
    return select_predictor(wl, ALL, name="synthetic-v2")


def test_groups_and_columns():
    assert check_groups(["lookup"]) == ("conf", "lookup")
    assert group_columns(("conf", "hidden"), hidden_dim=3) == ["logit_conf", "hidden_0", "hidden_1", "hidden_2"]
    with pytest.raises(SpecgymError, match="unknown signal group"):
        check_groups(["bogus"])


def test_design_matrix_is_none_without_a_needed_signal():
    conf = np.array([0.5, 0.9])
    assert design_matrix(("conf", "position"), conf, conf, np.array([0, 1]), 0.0).shape == (2, 3)
    assert design_matrix(("conf", "lookup"), conf, conf, np.array([0, 1]), 0.0) is None
    assert design_matrix(("conf", "shape"), conf, conf, np.array([0, 1]), 0.0) is None


def test_lookup_signal_beats_confidence(wl, trained):
    pred, candidates = trained
    assert {"logistic", "mlp"} <= set(candidates) and pred.kind in candidates
    speed = candidates["threshold"]["val_tok_s"]["synthetic-v2"]
    assert speed[str(pred.threshold)] == max(speed.values())  # the threshold is the fastest on validation
    conf_only, _ = select_predictor(wl, ("conf",), name="conf")
    test = workload_dataset(wl, "test", ALL)
    test_conf = workload_dataset(wl, "test", ("conf",))
    m_full = predictor_metrics(pred.predict_matrix(test.x), test.y)
    m_conf = predictor_metrics(conf_only.predict_matrix(test_conf.x), test_conf.y)
    assert m_full["auc"] > m_conf["auc"] + 0.05
    assert m_full["log_loss"] < m_conf["log_loss"]
    assert abs(m_full["mean_pred"] - m_full["mean_label"]) < 0.05  # calibrated on held-out data


def test_soft_labels_and_auc():
    assert soft_auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1.0])) == 1.0
    assert soft_auc(np.array([0.5, 0.5]), np.array([0, 1.0])) == 0.5
    sampled = v2_workload(n_req=40, temperature=0.8, seed=1)
    pred, _ = select_predictor(sampled, ALL, name="t08", kinds=("logistic",))
    test = workload_dataset(sampled, "test", ALL)
    assert len(np.unique(test.y)) == 2  # soft labels: the true acceptance probabilities 0.35 / 0.92
    conf_only, _ = select_predictor(sampled, ("conf",), name="conf", kinds=("logistic",))
    m = predictor_metrics(pred.predict_matrix(test.x), test.y)
    m_conf = predictor_metrics(conf_only.predict_matrix(workload_dataset(sampled, "test", ("conf",)).x), test.y)
    assert m["auc"] > m_conf["auc"] + 0.05 and m["log_loss"] < m_conf["log_loss"]


def test_step_prediction_equals_the_training_features(wl, trained):
    """Deployment (one DraftStep from the replay engine) sees exactly the design row training used."""
    pred, _ = trained
    eng = TraceEngine(wl, PROFILE, 8, seed=0)
    r = int(wl.split_indices("test")[1])
    req = eng.start(r)
    seen = []

    def keep(step: DraftStep) -> bool:
        seen.append((step.position, pred.predict_step(step, float(wl.temperature[r]))))
        return True

    while not req.done:
        req.play(6, keep)
    test = workload_dataset(wl, "test", ALL)
    base = int(sum(wl.offsets[q + 1] - wl.offsets[q] for q in wl.split_indices("test")[:1]))
    rows = pred.predict_matrix(test.x)
    assert seen
    for pos, p in seen:
        assert p == pytest.approx(rows[base + pos], abs=1e-9)


def test_artifact_round_trip_and_tampering(tmp_path, trained):
    pred, _ = trained
    path = save_predictor(pred, tmp_path / "p.json")
    back = load_predictor(path)
    x = workload_dataset(v2_workload(8, seed=3), "train", ALL).x
    assert np.allclose(back.predict_matrix(x), pred.predict_matrix(x))
    data = json.loads(path.read_text())
    for field, value in (("kind", "mlp" if pred.kind == "logistic" else "logistic"), ("groups", ["conf"]),
                         ("threshold", pred.threshold + 0.1),
                         ("mean", [0.0] * len(data["mean"]))):
        bad = dict(data, **{field: value})
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(SpecgymError, match="bad.json"):
            load_predictor(tmp_path / "bad.json")
    (tmp_path / "v0.json").write_text(json.dumps(dict(data, version=0)))
    with pytest.raises(SpecgymError, match="version"):
        load_predictor(tmp_path / "v0.json")
    (tmp_path / "meta.json").write_text(json.dumps(dict(data, meta={"note": "edited"})))
    assert load_predictor(tmp_path / "meta.json").meta == {"note": "edited"}  # provenance is not the function
    with pytest.raises(SpecgymError, match="not found"):
        load_predictor(tmp_path / "missing.json")


def test_predicted_controller_beats_marginal_where_signals_speak(wl, trained, tmp_path):
    pred, _ = trained
    path = save_predictor(pred, tmp_path / "p.json")
    ctrl = make_controller(f"predicted:{path}", 8)
    assert isinstance(ctrl, PredictedMarginal) and ctrl.name == f"predicted:{path}"
    eng = TraceEngine(wl, PROFILE, 8, seed=0)
    test = wl.split_indices("test")
    t_pred = run_controller(eng, test, ctrl).time_ms.sum()
    t_marg = run_controller(eng, test, MarginalStop()).time_ms.sum()
    assert ctrl.predicted > 0 and ctrl.fallbacks == 0
    assert t_pred < t_marg


def test_without_signals_it_decides_exactly_as_marginal(trained):
    pred, _ = trained
    v1 = v2_workload(20, signals=False)
    assert v1.signal_columns() is None
    eng = TraceEngine(v1, PROFILE, 8, seed=0)
    reqs = v1.split_indices("all")
    ctrl = PredictedMarginal(pred)
    a = run_controller(eng, reqs, ctrl)
    b = run_controller(eng, reqs, MarginalStop())
    assert ctrl.predicted == 0 and ctrl.fallbacks > 0
    assert np.array_equal(a.time_ms, b.time_ms) and np.array_equal(a.drafted, b.drafted)


def test_conf_only_predictor_needs_no_signals():
    v1 = v2_workload(20, signals=False)
    train = workload_dataset(v1, "train", ("conf", "position"))
    pred = fit_predictor(train, ("conf", "position"), "logistic")
    step = DraftStep(1, 4, 10, 0.7, 1.0)
    assert 0.0 < pred.predict_step(step, 0.0) < 1.0
    with pytest.raises(SpecgymError, match="lacks the signals"):
        workload_dataset(v1, "train", ALL)


def test_bad_predictor_specs():
    with pytest.raises(SpecgymError, match="predicted"):
        make_controller("predicted", 8)
    with pytest.raises(SpecgymError, match="unknown acceptance predictor"):
        make_controller("predicted:no-such-predictor", 8)
    assert isinstance(AcceptancePredictor, type)


def test_cli_train_and_eval(tmp_path, capsys):
    """``specgym predictor train`` then ``eval`` (ablation, loop split, paired ratios) on a SYNTHETIC v2 trace."""
    from specgym.cli import main
    from specgym.envs.workloads.trace_format import save_workload

    path = tmp_path / "synthetic-v2.parquet"
    save_workload(v2_workload(), path)
    out = tmp_path / "pred.json"
    assert main(["predictor", "train", "--workload", str(path), "--out", str(out), "--kinds", "logistic"]) == 0
    assert "validation AUC" in capsys.readouterr().out
    pred = load_predictor(out)
    assert pred.meta["workload"] == "synthetic-v2" and pred.meta["test"]["synthetic-v2"]["auc"] > 0.5
    assert main(["predictor", "train", "--workload", str(path), "--out", str(out)]) == 2  # no silent overwrite
    assert "already exists" in capsys.readouterr().err
    rep = tmp_path / "rep.json"
    assert main(["predictor", "eval", "--predictor", str(out), "--workload", str(path), "--json", str(rep),
                 "--bootstrap", "200", "--controllers", "fixed:2"]) == 0
    md = capsys.readouterr().out
    assert "SYNTHETIC" in md and "## Speed: loops" in md and "## Speed: no loops" in md
    r = json.loads(rep.read_text())
    assert {"calibrated-confidence", f"predicted:{pred.name}", "predicted[conf]",
            "predicted[conf+shape+position+lookup]"} <= set(r["prediction"])
    rows = r["speed"]["all"]["controllers"]
    assert rows[f"predicted:{pred.name}"]["vs_marginal"]["ratio"] > 1.0 and "fixed:2" in rows
    lo, hi = rows[f"predicted:{pred.name}"]["vs_marginal"]["ci95"]
    assert lo <= rows[f"predicted:{pred.name}"]["vs_marginal"]["ratio"] <= hi
    assert 0 < r["loop_share"] < 1 and r["speed"]["loops"]["requests"] + r["speed"]["no_loops"]["requests"] == 15
    assert main(["predictor", "train", "--workload", str(path), "--out", str(tmp_path / "x.json"),
                 "--groups", "conf,bogus"]) == 2
    assert "--groups" in capsys.readouterr().err


def test_the_deployment_row_equals_the_training_matrix():
    """design_row (one draft step, plain Python) and design_matrix (training, numpy) are one definition."""
    from specgym.envs.core.acceptance_predictor import SIGNAL_GROUPS, design_row

    rng = np.random.default_rng(5)
    n = 200
    conf = np.concatenate([[0.0, 1.0, 1e-9], rng.random(n - 3)])
    ent = rng.random(n) * 12
    pos = rng.integers(0, 5000, n)
    topk = np.sort(rng.dirichlet(np.ones(TOPK), n), axis=1)[:, ::-1].astype(np.float32)
    ll = rng.integers(0, 5, n).astype(np.int8)
    ag = rng.random(n) < 0.5
    hid = rng.standard_normal((n, 3)).astype(np.float32)
    for groups in (("conf",), tuple(SIGNAL_GROUPS)):
        x = design_matrix(groups, conf, ent, pos, 0.8, topk, ll, ag, hid)
        rows = [design_row(groups, float(conf[i]), float(ent[i]), int(pos[i]), 0.8, topk[i].tolist(), int(ll[i]),
                           bool(ag[i]), hid[i].tolist()) for i in range(n)]
        assert np.allclose(np.array(rows), x, rtol=1e-12, atol=1e-12)
    assert design_row(("conf", "lookup"), 0.5, 1.0, 3, 0.0) is None


def test_a_step_lacking_a_signal_asks_the_fallback(wl, trained, tmp_path):
    pred, _ = trained
    v1 = v2_workload(8, signals=False)
    conf_only = fit_predictor(workload_dataset(v1, "train", ("conf", "position")), ("conf", "position"), "logistic")
    both = dataclasses.replace(pred, fallback=conf_only)
    bare = DraftStep(1, 4, 10, 0.7, 1.0)  # no signals at all
    assert pred.predict_step(bare, 0.0) is None
    assert both.predict_step(bare, 0.0) == conf_only.predict_step(bare, 0.0)
    path = save_predictor(both, tmp_path / "p.json")
    back = load_predictor(path)
    assert back.fallback is not None and back.predict_step(bare, 0.0) == both.predict_step(bare, 0.0)
    data = json.loads(path.read_text())
    data["fallback"]["threshold"] = 0.9  # the nested artifact is covered twice: by its own checksum and the outer one
    path.write_text(json.dumps(data))
    with pytest.raises(SpecgymError, match="checksum"):
        load_predictor(path)


def test_shipped_midpair_predictor_reads_the_hidden_sketch_and_falls_back_without_it():
    import specgym.catalogue as catalogue
    from specgym.envs.core.signals import DraftSignals
    from specgym.envs.workloads.trace_format import cached_workload

    pred = load_predictor(catalogue.resolve("predictor", "midpair"))
    assert "hidden" in pred.groups and pred.fallback is not None and "hidden" not in pred.fallback.groups
    midpair = cached_workload("midpair-greedy")
    cols = midpair.signal_columns()
    no_hidden = dataclasses.replace(cols, hidden_sketch=None)  # what transformers' generate() hook computes
    r = int(midpair.split_indices("test")[0])
    start = int(midpair.offsets[r])
    step = DraftStep(1, 4, 0, float(midpair.draft_conf[start]), float(midpair.draft_entropy[start]),
                     DraftSignals(cols, start, start + 1))
    step_nh = DraftStep(1, 4, 0, step.conf, step.entropy, DraftSignals(no_hidden, start, start + 1))
    assert pred.predict_step(step, 0.0) != pred.predict_step(step_nh, 0.0)
    assert pred.predict_step(step_nh, 0.0) == pred.fallback.predict_step(step_nh, 0.0)

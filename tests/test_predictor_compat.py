"""One compatibility check pairs an acceptance predictor with what feeds it (issues 30 item 4, 31): another pair's
predictor is refused in one line everywhere; a missing hidden sketch or another model's sketch makes the predictor's
fallback predict, with one note on stderr and in the report; ``tree-predicted:`` falls back as ``predicted:`` does;
training a policy on a predictor's outputs accepts no fallback."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import specgym.catalogue as catalogue
from specgym import make_controller
from specgym.cli import main
from specgym.envs.core.acceptance_predictor import SignalSource, load_predictor, same_model
from specgym.envs.core.signals import projection_to_meta, sketch_projection
from specgym.envs.workloads.trace_format import Workload, load_workload, save_workload
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate


def small_midpair(n: int = 4) -> Workload:
    """A few requests of every split of the shipped midpair-greedy trace (it carries the hidden sketch)."""
    wl = load_workload("midpair-greedy")
    idx = np.concatenate([wl.split_indices(s)[:n] for s in ("train", "val", "test")])
    return wl.subset(idx)


def without_sketch(wl: Workload) -> Workload:
    """The same trace recorded without ``--hidden-sketch`` (what the README's tour records)."""
    return dataclasses.replace(wl, hidden_sketch=None,
                               signal_meta={k: v for k, v in wl.signal_meta.items() if k != "hidden_sketch"})


def other_sketch(wl: Workload) -> Workload:
    """The same columns under another projection's metadata: a sketch the predictor was not trained on."""
    meta = projection_to_meta(sketch_projection(128, wl.hidden_sketch.shape[1], seed=7), 7)
    return dataclasses.replace(wl, signal_meta={**wl.signal_meta, "hidden_sketch": meta})


def other_pair(wl: Workload) -> Workload:
    """The same columns labelled as another pair's recording (a user's Llama pair)."""
    return dataclasses.replace(wl, source={**wl.source, "draft_model": "my/llama-draft",
                                           "target_model": "my/llama-target"})


@pytest.fixture(scope="module")
def midpair() -> Workload:
    return small_midpair()


@pytest.fixture(scope="module")
def predictor():
    return load_predictor(catalogue.resolve("predictor", "midpair"))


def test_the_shipped_predictor_fits_its_own_workloads(predictor):
    for name in ("midpair-greedy", "midpair-t08"):
        active, note = predictor.for_source(SignalSource.of_workload(load_workload(name)))
        assert active is predictor and note is None
    assert predictor.pair == ("models/midpair/draft", "models/midpair/target")


def test_missing_or_foreign_sketch_falls_back_with_a_note(midpair, predictor):
    for wl, words in ((without_sketch(midpair), "hidden_sketch"), (other_sketch(midpair), "another hidden sketch")):
        active, note = predictor.for_source(SignalSource.of_workload(wl))
        assert active is predictor.fallback and "hidden" not in active.groups
        assert words in note and "\n" not in note
        with pytest.raises(SpecgymError, match="predictor 'midpair' reads"):  # training takes no fallback
            predictor.for_source(SignalSource.of_workload(wl), strict=True)


def test_another_pair_is_refused(midpair, predictor):
    with pytest.raises(SpecgymError, match="trained on the target model models/midpair/target.*my/llama-target"):
        predictor.for_source(SignalSource.of_workload(other_pair(midpair)))
    src = SignalSource.of_engine("the live engine on tinypair", "models/tinypair/draft", "models/tinypair/target",
                                 True)
    with pytest.raises(SpecgymError, match="tinypair"):
        predictor.for_source(src)


def test_a_trace_without_signals_estimates_from_confidence(predictor):
    active, note = predictor.for_source(SignalSource.of_workload(load_workload("speclane-mix")))
    assert active is None and "calibrated confidence" in note


def test_same_model_matches_a_path_to_the_shipped_folder():
    assert same_model("/somewhere/data/models/midpair/target", "models/midpair/target")
    assert same_model(None, "x/y") and same_model("./a/b/", "a/b")
    assert not same_model("models/tinypair/target", "models/midpair/target")
    assert not same_model("target", "other/target")  # one component is not enough to call them one model


def test_live_engine_source_carries_the_sketch(midpair, predictor):
    proj = midpair.sketch_projection()
    with_sketch = SignalSource.of_engine("e", "models/midpair/draft", "models/midpair/target", True, proj, 0)
    assert predictor.for_source(with_sketch) == (predictor, None)
    wrong = SignalSource.of_engine("e", "models/midpair/draft", "models/midpair/target", True,
                                   sketch_projection(128, 16, seed=3), 3)
    active, note = predictor.for_source(wrong)
    assert active is predictor.fallback and "another hidden sketch" in note


def test_eval_notes_the_fallback_and_tree_predicted_falls_back_like_predicted(midpair):
    wl = without_sketch(midpair)
    specs = "marginal,predicted:midpair,planned:midpair,tree-predicted:midpair"
    rep = evaluate(EvalConfig(workload=wl, controllers=specs, bootstrap=0))
    assert {r["spec"] for r in rep["rows"]} == set(specs.split(","))
    (note,) = rep["notes"]  # one line naming every row it concerns
    assert note.startswith("predicted:midpair, planned:midpair, tree-predicted:midpair: predictor 'midpair'")
    assert "fallback on conf, shape, position, lookup" in note
    # with the sketch nothing is noted, and the fallback's decisions differ from the primary's
    full = evaluate(EvalConfig(workload=midpair, controllers="predicted:midpair", bootstrap=0))
    assert full["notes"] == []


def test_cli_eval_prints_the_note_and_writes_it_in_the_report(tmp_path, capsys, midpair):
    path = tmp_path / "mine.parquet"
    save_workload(without_sketch(midpair), path)
    out = tmp_path / "rep"
    assert main(["eval", "--workload", str(path), "--controllers", "predicted:midpair,fixed:2", "--bootstrap", "0",
                 "--no-plots", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "note: predicted:midpair: predictor 'midpair'" in captured.err
    assert "plots: *.png" not in captured.out  # --no-plots: no plot is promised
    md = (out / "report.md").read_text()
    assert "## Notes" in md and "fallback on conf, shape, position, lookup" in md and "Plots:" not in md
    assert json.loads((out / "report.json").read_text())["notes"]


def test_policy_reading_a_predictor_refuses_another_pair(midpair):
    ctrl = make_controller("ppo:midpair-predicted")
    with pytest.raises(SpecgymError, match="another model's"):
        ctrl.bind_signals(SignalSource.of_workload(other_pair(midpair)))
    note = ctrl.bind_signals(SignalSource.of_workload(without_sketch(midpair)))  # its predictor reads the sketch
    assert "lacks the signal(s) hidden_sketch" in note and "fallback" in note and ctrl.protocol.predictor is not None
    note = ctrl.bind_signals(SignalSource.of_workload(load_workload("speclane-mix")))  # no signals at all
    assert "calibrated confidence" in note and ctrl.protocol.predictor is None


def test_predictor_eval_notes_the_fallback(tmp_path, capsys, midpair):
    path = tmp_path / "mine.parquet"
    save_workload(without_sketch(small_midpair(8)), path)
    assert main(["predictor", "eval", "--predictor", "midpair", "--workload", str(path), "--no-ablation",
                 "--bootstrap", "0"]) == 0
    captured = capsys.readouterr()
    assert "note: predicted:midpair: predictor 'midpair'" in captured.err
    assert "## Notes" in captured.out


def test_transformers_generate_checks_the_predictor_too():
    torch = pytest.importorskip("torch")
    from specgym.agents.hf_generate import generate_with_controller
    from specgym.envs.engines.live.model_loading import load_pair
    from specgym.paths import MODELS_DIR

    for pair, expect in (("tinypair", "refused"), ("midpair", "fallback")):
        lp = load_pair(str(MODELS_DIR / pair / "draft"), str(MODELS_DIR / pair / "target"), fast_kernels=False)
        ids = torch.tensor([lp.tokenizer("def f(x):", add_special_tokens=False)["input_ids"]])
        kw = dict(max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(ids))
        if expect == "refused":
            with pytest.raises(SpecgymError, match="another model's"):
                generate_with_controller(lp.target, lp.draft, ids, make_controller("predicted:midpair"), **kw)
        else:  # no hidden sketch in transformers' loop: the fallback predicts, said once
            with pytest.warns(UserWarning, match="lacks the signal.s. hidden_sketch"):
                generate_with_controller(lp.target, lp.draft, ids, make_controller("predicted:midpair"), **kw)

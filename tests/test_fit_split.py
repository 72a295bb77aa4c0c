"""The fit split: where a recording's draft model was trained on its train prompts, learners fit on val.

On the real pair the draft model was distilled on the train prompts' answers: its acceptance there is 0.80 against
0.42 on val and test, so a rule fitted on train over-trusts the draft (drafter-marginal 1.005x the best single drafter
on test when fitted on train, 1.17x when fitted on val). ``Workload.fit_split`` is the one home of that choice.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from specgym.baselines.drafter_marginal import fit_on_fit_split
from specgym.envs.engines.live.recorder import draft_fit_split
from specgym.envs.workloads import load_workload
from specgym.errors import SpecgymError
from specgym.training.predictor import select_predictor


@pytest.fixture(scope="module")
def real():
    return load_workload("smollm2-greedy")


def test_the_real_pairs_recordings_fit_on_val_and_say_why(real):
    for name in ("smollm2-greedy", "smollm2-t07"):
        wl = real if name == "smollm2-greedy" else load_workload(name)
        assert wl.fit_split == "val" and "trained on the train split" in wl.extra["fit_split_reason"]
        fit, select = wl.learning_requests()
        val = wl.split_indices("val")
        assert not set(fit) & set(select) and sorted([*fit, *select]) == sorted(val)  # halves of val, disjoint
    mid = load_workload("midpair-greedy")
    assert mid.fit_split == "train"
    fit, select = mid.learning_requests()
    assert np.array_equal(fit, mid.split_indices("train")) and np.array_equal(select, mid.split_indices("val"))


def test_a_bad_fit_split_is_one_line(real):
    bad = dataclasses.replace(real, extra={**real.extra, "fit_split": "test"})
    with pytest.raises(SpecgymError, match="extra.fit_split must be 'train' or 'val', got 'test'"):
        _ = bad.fit_split


def test_drafter_marginal_counts_on_the_fit_split(real):
    pred = fit_on_fit_split(real, real.profile)
    assert pred.meta["split"] == "val"
    assert pred.meta["positions"] == int(real.lengths[real.split_indices("val")].sum())
    on_train = fit_on_fit_split(dataclasses.replace(real, extra={**real.extra, "fit_split": "train"}), real.profile)
    assert on_train.meta["split"] == "train"
    # the draft's runs on its own training prompts are longer than where it is used: the fit split matters
    assert on_train.expected["draft"].mean() > pred.expected["draft"].mean()


def test_the_predictor_never_chooses_on_the_rows_it_fitted(real, monkeypatch):
    seen: list[np.ndarray] = []
    import specgym.training.predictor as tp

    orig = tp.workload_dataset

    def spy(wl, split, groups, max_rows=None, seed=0, requests=None, **kw):
        seen.append(np.asarray(requests))
        return orig(wl, split, groups, max_rows, seed, requests, **kw)

    monkeypatch.setattr(tp, "workload_dataset", spy)
    select_predictor(real, ("conf", "position"), "t", kinds=("logistic",))
    fit, select = real.learning_requests()
    assert np.array_equal(seen[0], fit) and np.array_equal(seen[1], select)


def test_the_recorder_reads_the_drafts_training_split(tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    assert draft_fit_split(str(draft), "workloads/p.jsonl") == {}  # no training record: nothing said
    (draft / "training_state.json").write_text(json.dumps({"trained_on": {"prompts": "workloads/p.jsonl",
                                                                          "split": "train"}}))
    assert draft_fit_split(str(draft), "workloads/p.jsonl")["fit_split"] == "val"
    assert draft_fit_split(str(draft), "workloads/other.jsonl") == {}  # trained on other prompts: train is clean
    (draft / "training_state.json").write_text("{not json")
    with pytest.raises(SpecgymError, match="training_state.json: unreadable"):
        draft_fit_split(str(draft), "workloads/p.jsonl")


def test_an_evaluation_set_fits_on_val(real):
    """A recording of val and test prompts only (``specgym data eval-prompts``) has no train split: learners fit on
    its val split (and say why); one with train prompts keeps fitting on train."""
    from specgym.envs.engines.live.recorder import assemble_recording

    def requests(splits):
        rng = np.random.default_rng(0)
        out = []
        for i, s in enumerate(splits):
            n = 12
            out.append({"request_id": f"r{i}", "category": "qa", "temperature": 0.0, "prompt_len": 5, "split": s,
                        "p_accept": rng.random(n).astype(np.float32), "draft_conf": rng.random(n).astype(np.float32),
                        "draft_entropy": np.ones(n, np.float32), "lookup_agree": np.zeros(n, bool)})
        return out

    completions = [list(range(12)) for _ in range(4)]
    wl, _ = assemble_recording("eval-set", {"kind": "recorded"}, real.profile, requests(["val", "val", "test", "test"]),
                               completions, 0, None, None, {})
    assert wl.fit_split == "val" and "no train prompts" in wl.extra["fit_split_reason"]
    with_train, _ = assemble_recording("full", {"kind": "recorded"}, real.profile,
                                       requests(["train", "val", "test", "test"]), completions, 0, None, None, {})
    assert with_train.fit_split == "train"

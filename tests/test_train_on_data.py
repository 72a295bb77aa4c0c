"""``train-draft --data`` and ``train-head --data``: the drafters learn from a data folder's answers
(:mod:`specgym.training.models.data_answers`), its train split only, its val split's greedy answers held out, with no
answer generated again; an unfinished folder, another target's, and a work folder of other answers are refused in one
line.

The data folder is made by ``specgym data generate`` on test_magpie's tiny chat model (about a second).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_magpie import _cfg, tiny_chat  # noqa: F401  (the tiny chat target and its data configuration)

from specgym.errors import SpecgymError

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((folder / "answers").glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def _key(r: dict) -> str:
    return f"{r['id']}.{float(r['temperature']):g}.{int(r['sample'])}"


@pytest.fixture(scope="module")
def data_folder(tiny_chat, tmp_path_factory):  # noqa: F811
    """A finished data folder of the tiny chat model: 12 prompts split 1/2, 1/4, 1/4 by source, a greedy and a
    sampled answer each."""
    import torch

    from specgym.training.models.data_gen import generate

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("data") / "d"
    generate(_cfg(tiny_chat, shard_size=4), out, workers=1, quiet=True)
    splits = {r["split"] for r in _records(out)}
    assert splits == {"train", "val", "test"}  # every split present: what the tests below tell apart
    return out


def _npz_keys(folder: Path) -> set[str]:
    from specgym.training.models.distill import batch_files

    return {k[len("answer_"):] for f in batch_files(folder) for k in np.load(f).files if k.startswith("answer_")}


def test_the_pick_is_the_train_split_and_the_val_greedy_answers_and_is_stable(data_folder, tiny_chat):  # noqa: F811
    from specgym.training.models.data_answers import DataSelection, read_data_answers

    recs = _records(data_folder)
    data = read_data_answers(DataSelection(data_folder), str(tiny_chat))
    want_train = {_key(r) for r in recs if r["split"] == "train" and r["answer_ids"]}
    want_val = {_key(r) for r in recs if r["split"] == "val" and r["mode"] == "greedy" and r["answer_ids"]}
    assert {a.key for a in data.train} == want_train and len(data.train) == len(want_train)
    assert {a.key for a in data.val} == want_val
    by_key = {_key(r): r for r in recs}
    for a in data.train + data.val:
        assert a.prompt.tolist() == by_key[a.key]["prompt_ids"] and a.answer.tolist() == by_key[a.key]["answer_ids"]
    small = read_data_answers(DataSelection(data_folder, max_answers=3, max_val_answers=1), str(tiny_chat))
    again = read_data_answers(DataSelection(data_folder, max_answers=3, max_val_answers=1), str(tiny_chat))
    assert [a.key for a in small.train] == [a.key for a in again.train] and len(small.train) == 3
    assert {a.key for a in small.train} < want_train and len(small.val) == 1
    assert small.identity("train") != data.identity("train")


def test_train_draft_teacher_forces_the_train_answers_and_holds_out_val(data_folder, tiny_chat, tmp_path,  # noqa: F811
                                                                        monkeypatch):
    """The answers stage writes the target's top-k over the data's answers (no generation): train answers in
    answers/, val greedy answers in answers_val/, each position's top-k and log-normaliser those of the target's
    distribution after the answer's prefix (recomputed here one prefix at a time); a finished stage rewrites nothing."""
    import torch

    from specgym.envs.engines.live.model_loading import load_model
    from specgym.training.models import distill, draft_build
    from specgym.training.models.data_answers import DataSelection, read_data_answers
    from specgym.training.models.distill import AnswerPlan, load_answers

    def no_generation(*a, **k):
        raise AssertionError("answers were generated again")

    monkeypatch.setattr(draft_build, "sample_answers", no_generation)
    monkeypatch.setattr(distill, "sample_answers", no_generation)
    sel = DataSelection(data_folder)
    work = tmp_path / "work"
    build = draft_build.DraftBuild(str(tiny_chat), str(data_folder / "prompts.jsonl"), work, layers=[0],
                                   plan=AnswerPlan(top_k=4, batch=3), data=sel)
    draft_build.run(build, ("answers",))
    data = read_data_answers(sel, str(tiny_chat))
    assert _npz_keys(work / "answers") == {a.key for a in data.train}
    assert _npz_keys(work / "answers_val") == {a.key for a in data.val}
    val_keys = {_key(r) for r in _records(data_folder) if r["split"] != "train"}
    assert not _npz_keys(work / "answers") & val_keys  # nothing of val or test is learned from
    learned = load_answers(work / "answers")
    assert learned and all(a.topi.shape == (len(a.answer), 4) and a.lse.shape == (len(a.answer),) for a in learned)
    target = load_model(str(tiny_chat), "target")
    longest = max(learned, key=lambda a: len(a.answer))
    assert len(longest.answer) > 2
    for t in range(len(longest.answer)):  # position t's distribution is the one the prefix before answer[t] gives
        prefix = torch.from_numpy(np.concatenate([longest.prompt, longest.answer[:t]]).astype(np.int64))[None]
        with torch.inference_mode():
            logits = target(prefix).logits[0, -1].float()
        top = logits.topk(4)
        assert longest.topi[t].tolist() == top.indices.tolist()
        assert np.allclose(longest.topv[t], top.values.numpy(), atol=1e-2)
        assert np.isclose(longest.lse[t], float(torch.logsumexp(logits, -1)), atol=1e-4)
    first = {f.name: f.stat().st_mtime_ns for f in (work / "answers").iterdir()}
    draft_build.run(build, ("answers",))  # finished: nothing rewritten
    assert {f.name: f.stat().st_mtime_ns for f in (work / "answers").iterdir()} == first


def test_train_draft_on_data_end_to_end_names_the_data_in_its_card(data_folder, tiny_chat, tmp_path):  # noqa: F811
    from specgym.cli import main

    out = tmp_path / "draft"
    args = ["train-draft", "--target", str(tiny_chat), "--data", str(data_folder), "--max-answers", "4",
            "--work-dir", str(tmp_path / "w"), "--layers", "0", "--budget-min", "0.02"]
    assert main([*args, "--stages", "answers,init,train"]) == 0
    assert main([*args, "--stages", "export", "--out", str(out)]) == 0
    meta = json.loads((out / "training_state.json").read_text())
    assert meta["trained_on"]["data"] == str(data_folder) and meta["trained_on"]["answers"] == 4
    assert meta["trained_on"]["prompts"] == str(data_folder / "prompts.jsonl")  # a recording of it fits on val
    assert meta["val_positions"] == sum(len(r["answer_ids"]) for r in _records(data_folder)
                                        if r["split"] == "val" and r["mode"] == "greedy")
    assert f"--data {data_folder} --max-answers 4 --layers 0" in (out / "README.md").read_text()


def test_train_head_features_are_the_train_answers_and_val_is_held_out(data_folder, tiny_chat, tmp_path):  # noqa: F811
    from specgym.training.models.data_answers import DataSelection, read_data_answers
    from specgym.training.models.head_build import Features, HeadBuild, run

    sel = DataSelection(data_folder, max_answers=5)
    build = HeadBuild(str(tiny_chat), tmp_path / "w", mlp=16, steps=3, batch=8, data=sel)
    run(build, ("features",))
    data = read_data_answers(sel, str(tiny_chat))
    train = Features.load(tmp_path / "w" / "head" / "features_train.npz")
    val = Features.load(tmp_path / "w" / "head" / "features_val.npz")
    seqs = [np.concatenate([a.prompt, a.answer]).tolist() for a in data.train]
    assert [ids for ids, _, _ in train.sequences()] == seqs and len(seqs) == 5
    assert [ids for ids, _, _ in val.sequences()] == [np.concatenate([a.prompt, a.answer]).tolist() for a in data.val]
    assert train.prompt_len.tolist() == [len(a.prompt) for a in data.train]
    report = run(build, ("train",))
    assert report["train"]["step"] == 3 and report["train"]["recipe"]["data"] == data.identity("train")
    report = run(build, ("export",), tmp_path / "head")
    assert report["heldout"]["starts"] == sum(len(a.answer) for a in data.val)  # one start per val answer token
    meta = json.loads((tmp_path / "head" / "training_state.json").read_text())
    assert meta["trained_on"]["answers"] == 5 and meta["trained_on"]["val_answers"] == len(data.val)
    assert f"--data {data_folder} --max-answers 5 --work-dir" in (tmp_path / "head" / "README.md").read_text()
    other = HeadBuild(str(tiny_chat), tmp_path / "w", mlp=16, steps=3, batch=8, data=DataSelection(data_folder))
    with pytest.raises(SpecgymError, match="another pick of data answers"):
        run(other, ("features", "train"))
    plain = HeadBuild(str(tiny_chat), tmp_path / "w", mlp=16, steps=3, batch=8)
    with pytest.raises(SpecgymError, match=f"made from --data {data_folder}'s answers"):
        run(plain, ("features",))


# --- refusals, one line each, before a model is loaded ----------------------------------------------------------------
def _unfinished(data_folder: Path, tmp_path: Path) -> Path:
    """A copy of the data folder as a run still writing its answers leaves it: its last shard missing."""
    copy = tmp_path / "unfinished"
    shutil.copytree(data_folder, copy)
    sorted((copy / "answers").glob("*.jsonl"))[-1].unlink()
    return copy


@pytest.mark.parametrize("command", ["train-draft", "train-head"])
def test_unfinished_or_foreign_folders_are_refused_in_one_line(command, data_folder, tiny_chat, tmp_path,  # noqa: F811
                                                              capsys, one_line_error, monkeypatch):
    from specgym.cli import main
    from specgym.training.models import draft_build, head_build

    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    for module in (draft_build, head_build):
        monkeypatch.setattr(module, "load_model", refuse)
    base = [command, "--target", str(tiny_chat), "--work-dir", str(tmp_path / "w"), "--stages", "answers"
            if command == "train-draft" else "features"]
    n = len(list((data_folder / "answers").glob("*.jsonl")))
    unfinished = _unfinished(data_folder, tmp_path)
    assert main([*base, "--data", str(unfinished)]) == 2
    one_line_error(capsys, f"--data {unfinished}", "answers stage is not finished", f"{n - 1} of {n} shards")
    (unfinished / "prompts.jsonl").unlink()
    assert main([*base, "--data", str(unfinished)]) == 2
    one_line_error(capsys, f"--data {unfinished}", "prompts stage is not finished")
    assert main([*base[:1], "--target", "smollm2", *base[3:], "--data", str(data_folder)]) == 2
    one_line_error(capsys, f"--data {data_folder}", f"written by the target {str(tiny_chat)!r}", "'smollm2'")
    assert main([*base, "--data", str(tmp_path)]) == 2
    one_line_error(capsys, f"--data {tmp_path}", "not a data folder")
    assert main([*base, "--max-answers", "3"]) == 2
    one_line_error(capsys, "--max-answers", "give --data")
    clash = ["--prompts", "smollm2-prompts"] if command == "train-draft" else ["--extra-answers", str(tmp_path)]
    assert main([*base, "--data", str(data_folder), *clash]) == 2
    one_line_error(capsys, f"{clash[0]} with --data")
    assert not (tmp_path / "w").exists()


def test_a_work_folder_of_other_answers_is_refused(data_folder, tiny_chat, tmp_path, monkeypatch):  # noqa: F811
    from specgym.training.models import draft_build
    from specgym.training.models.data_answers import DataSelection
    from specgym.training.models.distill import AnswerPlan

    monkeypatch.setattr(draft_build, "load_model", lambda *a: pytest.fail("a model was loaded"))
    work = tmp_path / "w"
    (work / "answers").mkdir(parents=True)
    (work / "answers" / "plan.json").write_text(json.dumps({"temperatures": [0.0], "samples": 2}))
    build = draft_build.DraftBuild(str(tiny_chat), str(data_folder / "prompts.jsonl"), work, layers=[0],
                                   plan=AnswerPlan(top_k=4, batch=3), data=DataSelection(data_folder))
    with pytest.raises(SpecgymError, match="holds answers train-draft generated from a prompts file"):
        draft_build.run(build, ("answers",))
    (work / "answers" / "plan.json").write_text(json.dumps({"data": {"folder": "elsewhere"}}))
    with pytest.raises(SpecgymError, match="another pick of data answers"):
        draft_build.run(build, ("answers",))
    plain = draft_build.DraftBuild(str(tiny_chat), str(data_folder / "prompts.jsonl"), work, layers=[0])
    with pytest.raises(SpecgymError, match="holds answers read from --data elsewhere"):
        draft_build.run(plain, ("answers",))
    shutil.rmtree(work)
    with pytest.raises(SpecgymError, match=r"--stages train: .*answers holds no answers; run --stages answers first "
                                           r"\(same --work-dir and --data\)"):
        draft_build.run(build, ("init", "train"))

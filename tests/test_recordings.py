"""A user's own recordings (``specgym record``): two ``specgym record`` runs of one pair merge whatever their
names and summaries (recomputed), incompatible ones are refused in one line naming the field; ``--splits`` is
honoured exactly; a full disk leaves the resume file whole or absent; ``--hidden-sketch`` is bounded."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym.cli import main  # noqa: E402
from specgym.envs.core.cost import CostProfile  # noqa: E402
from specgym.envs.core.signals import projection_to_meta, sketch_projection  # noqa: E402
from specgym.envs.engines.live.model_loading import load_pair  # noqa: E402
from specgym.envs.engines.live.recorder import RecordingSpec, record_workload  # noqa: E402
from specgym.envs.workloads.dataset import merge_workloads  # noqa: E402
from specgym.envs.workloads.loops import loop_share  # noqa: E402
from specgym.envs.workloads.prompts import PromptSpec  # noqa: E402
from specgym.envs.workloads.trace_format import (  # noqa: E402
    assign_splits,
    load_workload,
    open_dataset,
    save_workload,
    split_counts,
)
from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.models.toy import save_toy_pair  # noqa: E402

PROFILE = CostProfile("flat-test", 1.0, tuple(10.0 + 0.5 * n for n in range(17)), 0.5, source="synthetic")
TEXTS = ["def f(x):\n    return x", "the cat sat on the mat.", "12 + 7 = 19", "import os\nimport sys\n",
         "class a:\n  pass\n", "for i in range(3):", "Once upon a time"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d, t = save_toy_pair(tmp_path_factory.mktemp("toy") / "pair", seed=0)
    return str(d), str(t)


@pytest.fixture(scope="module")
def pair(toy):
    return load_pair(*toy)


def _prompts(path, texts):
    """A prompts file as a user writes one: no ids (each file numbers its prompts p00000, p00001...)."""
    path.write_text("".join(json.dumps({"prompt": t, "category": ["code", "prose"][i % 2]}) + "\n"
                            for i, t in enumerate(texts)))
    return path


@pytest.fixture(scope="module")
def two_recordings(toy, tmp_path_factory):
    """Two CLI recordings of one pair over two prompts files (each measured its own profile: profiles differ)."""
    root = tmp_path_factory.mktemp("rec")
    outs = []
    for name, texts in (("batch-a", TEXTS[:3]), ("batch-b", TEXTS[3:])):
        out = root / f"{name}.parquet"
        assert main(["record", "--draft", toy[0], "--target", toy[1], "--prompts",
                     str(_prompts(root / f"{name}.jsonl", texts)), "--max-new-tokens", "70", "--quiet",
                     "--hidden-sketch", "4", "--out", str(out)]) == 0
        outs.append(out)
    return outs


def test_two_recordings_of_one_pair_merge(two_recordings, tmp_path, capsys):
    a, b = (load_workload(p) for p in two_recordings)
    # what used to refuse the merge: the names, the measured profiles, the prompts files (and the summaries)
    assert a.name != b.name and a.profile != b.profile and a.source["prompts"] != b.source["prompts"]
    capsys.readouterr()
    out = tmp_path / "all.parquet"
    assert main(["workloads", "merge", *map(str, two_recordings), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "request id 'p00000' is in both" in err and "cost profiles differ (field 'profile')" in err
    m = load_workload(out)
    assert m.name == "all" and m.n_requests == a.n_requests + b.n_requests
    assert m.request_id.tolist()[:1] == ["batch-a/p00000"] and len(set(m.request_id.tolist())) == m.n_requests
    np.testing.assert_array_equal(m.p_accept, np.concatenate([a.p_accept, b.p_accept]))
    completions = [m.token_id[m.span(r)].tolist() for r in range(m.n_requests)]
    assert m.extra["loop_share"] == pytest.approx(loop_share(completions))  # recomputed over the merge
    assert [s["workload"] for s in m.source["merged_from"]] == ["batch-a", "batch-b"]
    assert m.source["merged_from"][1]["extra"] == b.extra  # each source's own summary is kept, not lost
    assert m.source["target_model"] == a.source["target_model"] and m.profile == a.profile
    # a sharded folder of the same merge: every shard carries the merged metadata
    assert main(["workloads", "merge", *map(str, two_recordings), "--out", str(tmp_path / "ds"),
                 "--name", "mine"]) == 0
    ds = open_dataset(tmp_path / "ds")
    assert ds.name == "mine" and ds.n_requests == m.n_requests and len(list(ds.iter_shards())) == 2


@pytest.mark.parametrize("field,change", [
    ("source.target_model", lambda w: dataclasses.replace(w, source={**w.source, "target_model": "other/target"})),
    ("source.temperature", lambda w: dataclasses.replace(w, source={**w.source, "temperature": 0.8})),
    ("signals.hidden_sketch", lambda w: dataclasses.replace(w, signal_meta={**w.signal_meta, "hidden_sketch": (
        projection_to_meta(sketch_projection(w.signal_meta["hidden_sketch"]["hidden_size"], 4, seed=9), 9))})),
    ("signals", lambda w: dataclasses.replace(
        w, signal_meta={}, **{c: None for c in ("token_id", "draft_token", "target_rank", "draft_topk",
                                                "lookup_len", "lookup_token", "lookup_agree", "hidden_sketch")})),
])
def test_incompatible_recordings_are_refused_naming_the_field(two_recordings, tmp_path, capsys, field, change):
    other = tmp_path / "other.parquet"
    save_workload(change(load_workload(two_recordings[1])), other)
    out = tmp_path / "m.parquet"
    assert main(["workloads", "merge", str(two_recordings[0]), str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"metadata field {field!r}" in err and "\n" not in err and not out.exists()


def test_a_source_named_twice_is_refused(two_recordings, tmp_path):
    with pytest.raises(SpecgymError, match="named twice"):
        merge_workloads([two_recordings[0], two_recordings[0]], tmp_path / "m.parquet")


def test_splits_are_honoured_exactly():
    assert split_counts(4, (1.0, 0.0, 0.0)) == (4, 0, 0)
    assert split_counts(3, (0.0, 0.5, 0.5)) == (0, 2, 1)  # round() gave 2 + 2 of 3 requests before
    assert sum(split_counts(101, (0.7, 0.2, 0.1))) == 101
    assert (assign_splits(5, 0, (1.0, 0.0, 0.0), exact=True) == "train").all()
    default = assign_splits(5, 0)  # the default fractions keep their documented minimum
    assert (default == "val").sum() == 1 and (default == "test").sum() == 1


def test_cli_splits_all_train_is_kept_and_reported(toy, tmp_path, capsys):
    out = tmp_path / "t.parquet"
    assert main(["record", "--draft", toy[0], "--target", toy[1], "--prompts",
                 str(_prompts(tmp_path / "p.jsonl", TEXTS[:4])), "--max-new-tokens", "8", "--quiet",
                 "--profile", "cpu-tinypair", "--splits", "1,0,0", "--out", str(out)]) == 0
    assert (load_workload(out).split == "train").all()
    assert "splits: train 4, val 0, test 0 (--splits 1,0,0; val and test empty" in capsys.readouterr().out


def test_full_disk_leaves_no_partial_file_and_names_it(pair, tmp_path, monkeypatch):
    out = tmp_path / "w.parquet"
    partial = tmp_path / "w.parquet.partial.jsonl"
    real_write = os.write

    def full(fd, data):  # the disk is full from the first byte
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    specs = [PromptSpec(f"q{i}", t, "code") for i, t in enumerate(TEXTS[:3])]
    with pytest.raises(SpecgymError, match=f"{partial}: cannot write .No space left on device.; nothing was kept"):
        record_workload(pair, specs, out, RecordingSpec(8, 0.0, PROFILE, batch=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no 0-byte partial file, no output

    calls = {"n": 0}

    def fills_up(fd, data):  # room for the header and one request's line, then full mid-line
        calls["n"] += 1
        if calls["n"] >= 3:
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", fills_up)
    with pytest.raises(SpecgymError, match="its 1 finished request.s. are kept there: rerun the same command"):
        record_workload(pair, specs, out, RecordingSpec(8, 0.0, PROFILE, batch=1))
    lines = partial.read_text().split("\n")
    assert lines[-1] == "" and all(json.loads(line) for line in lines[:-1]) and len(lines) == 3  # whole lines
    monkeypatch.setattr(os, "write", real_write)
    spec = RecordingSpec(8, 0.0, PROFILE, batch=1)
    wl, stats = record_workload(pair, specs, out, spec)  # the resume after freeing space
    assert stats["resumed"] == 1 and wl.n_requests == 3 and not partial.exists()


def test_hidden_sketch_is_bounded_by_the_hidden_size(toy, tmp_path, capsys, one_line_error):
    hidden = json.loads((Path(toy[0]) / "config.json").read_text())["n_embd"]
    assert main(["record", "--draft", toy[0], "--target", toy[1], "--prompts",
                 str(_prompts(tmp_path / "p.jsonl", TEXTS[:2])), "--hidden-sketch", "100000",
                 "--out", str(tmp_path / "w.parquet")]) == 2
    one_line_error(capsys, f"--hidden-sketch 100000: must be 0..{hidden}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]

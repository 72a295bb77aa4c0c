"""``specgym data eval-prompts``: a frozen evaluation prompts file of a finished data folder's val and test prompts
(:mod:`specgym.training.models.eval_prompts`): only those splits, a seeded sample capped per split and category, a
manifest whose hashes match, one-line refusals, and a leak check against the train split that catches a planted
duplicate.

The data folder is made by ``specgym data generate`` on test_magpie's tiny chat model (a few seconds).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from test_magpie import _cfg, tiny_chat  # noqa: F401  (the tiny chat target and its data configuration)

from specgym.cli import main
from specgym.errors import SpecgymError

pytest.importorskip("torch")
pytest.importorskip("transformers")

CATS = ("chat", "coding", "rag")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _cells(records: list[dict]) -> Counter:
    return Counter((r["split"], r["category"]) for r in records)


@pytest.fixture(scope="module")
def data_folder(tiny_chat, tmp_path_factory):  # noqa: F811
    """A finished data folder: 36 prompts of chat, coding and rag (passages: two prompts each) split 1/2, 1/4, 1/4
    by source."""
    import torch

    from specgym.training.models.data_gen import generate

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("data") / "d"
    generate(_cfg(tiny_chat, prompts=36, categories=CATS, shard_size=16, stdlib_subdir="email"), out, workers=1,
             quiet=True)
    prompts = _lines(out / "prompts.jsonl")
    cells = _cells([p for p in prompts if p["split"] != "train"])
    assert {s for s, _ in cells} == {"val", "test"} and max(cells.values()) >= 3  # a cap of 2 cuts some cell
    return out


def _copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(folder, dst)
    return dst


def test_only_val_and_test_prompts_capped_per_category_seeded_and_prefix_stable(data_folder):
    from specgym.training.models.eval_prompts import build

    data = {p["id"]: p for p in _lines(data_folder / "prompts.jsonl")}
    available = _cells([p for p in data.values() if p["split"] in ("val", "test")])
    ev = build(data_folder, per_category=2, seed=0)
    assert ev.records and all(r["split"] in ("val", "test") for r in ev.records)
    for r in ev.records:  # every field as the data folder has it: split, category, source, passage, text
        assert {k: r[k] for k in ("split", "category", "source", "passage", "prompt")} == \
            {k: data[r["id"]][k] for k in ("split", "category", "source", "passage", "prompt")}
    assert _cells(ev.records) == Counter({c: min(2, n) for c, n in available.items()})
    assert ev.manifest["counts"] == {s: {c: min(2, available[(s, c)]) for c in CATS} for s in ("val", "test")}
    assert ev.manifest["prompts"] == len(ev.records) and not ev.excluded
    # rank by rank: the first len(cells) records are one of each cell
    assert len(_cells(ev.records[:len(available)])) == len(available)
    # a cell's picks come from distinct sources while it has enough of them
    for cell in available:
        sources = [r["source"] for r in ev.records if (r["split"], r["category"]) == cell]
        have = {p["source"] for p in data.values() if (p["split"], p["category"]) == cell}
        assert len(set(sources)) == min(len(sources), len(have))
    # the seed decides: the same seed gives the same file, another seed another pick of a capped cell
    assert build(data_folder, per_category=2, seed=0).text() == ev.text()
    picks = {s: {r["id"] for r in build(data_folder, per_category=2, seed=s).records} for s in range(6)}
    assert len({frozenset(v) for v in picks.values()}) > 1
    # a larger cap extends the smaller one's sample
    wider = build(data_folder, per_category=3, seed=0)
    assert {r["id"] for r in ev.records} < {r["id"] for r in wider.records}
    assert _cells(wider.records) == Counter({c: min(3, n) for c, n in available.items()})


def test_the_command_writes_the_file_and_a_manifest_whose_hashes_match(data_folder, tmp_path, capsys):
    from specgym.envs.workloads.prompts import read_prompts, splits_named
    from specgym.io import sha256_file
    from specgym.training.models.eval_prompts import check_frozen, manifest_path

    out = tmp_path / "eval-prompts.jsonl"
    assert main(["data", "eval-prompts", "--data", str(data_folder), "--out", str(out), "--per-category", "2",
                 "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed
    man = json.loads(manifest_path(out).read_text())
    assert manifest_path(out).name == "eval-prompts.manifest.json"
    assert man["sha256"] == sha256_file(out) == hashlib.sha256(out.read_bytes()).hexdigest()
    assert man["data"]["config_sha256"] == sha256_file(data_folder / "config.json")
    assert man["data"]["prompts_sha256"] == sha256_file(data_folder / "prompts.jsonl")
    assert man["sample"] == {**man["sample"], "seed": 3, "per_category": 2, "splits": ["val", "test"]}
    records = _lines(out)
    assert man["prompts"] == len(records) and {r["split"] for r in records} == {"val", "test"}
    assert {s: sum(v.values()) for s, v in man["counts"].items()} == dict(Counter(r["split"] for r in records))
    assert man["command"].startswith("specgym data eval-prompts --data ")
    prompts = read_prompts(out)  # what `specgym record --prompts` reads: every prompt names its split
    assert splits_named(prompts) and [p.split for p in prompts] == [r["split"] for r in records]
    assert [p.request_id for p in prompts] == [r["id"] for r in records]
    assert check_frozen(out)["sha256"] == man["sha256"]
    out.write_text(out.read_text() + out.read_text().splitlines()[0] + "\n")
    with pytest.raises(SpecgymError, match="differs from its manifest"):
        check_frozen(out)
    assert not list(tmp_path.glob(".specgym-tmp-*")) and not list(tmp_path.glob("*.tmp"))  # no temporaries left


def test_refusals_are_one_line_and_write_nothing(data_folder, tmp_path, capsys, one_line_error):
    out = tmp_path / "p.jsonl"
    args = ["data", "eval-prompts", "--out", str(out), "--per-category", "1"]
    out.write_text("mine\n")
    assert main([*args, "--data", str(data_folder)]) == 2
    one_line_error(capsys, str(out), "already exists", "--force")
    assert out.read_text() == "mine\n" and not (tmp_path / "p.manifest.json").exists()
    assert main([*args, "--data", str(data_folder), "--force"]) == 0  # --force replaces it
    capsys.readouterr()
    assert out.read_text() != "mine\n" and (tmp_path / "p.manifest.json").is_file()
    out.unlink()  # a manifest left alone is refused as well
    assert main([*args, "--data", str(data_folder)]) == 2
    one_line_error(capsys, "p.manifest.json", "already exists")
    assert not out.exists()
    (tmp_path / "p.manifest.json").unlink()
    assert main([*args, "--data", str(data_folder), "--out", str(tmp_path / "p.json")]) == 2
    one_line_error(capsys, "p.json", ".jsonl")

    broken = _copy(data_folder, tmp_path)
    next(iter(sorted((broken / "answers").glob("*.jsonl")))).unlink()  # the answers stage: a shard missing
    assert main([*args, "--data", str(broken)]) == 2
    one_line_error(capsys, "its answers stage is not finished")
    (broken / "prompts.jsonl").unlink()  # the prompts stage (selection) not done
    assert main([*args, "--data", str(broken)]) == 2
    one_line_error(capsys, "its prompts stage is not finished")
    (broken / "config.json").unlink()
    assert main([*args, "--data", str(broken)]) == 2
    one_line_error(capsys, "not a data folder")
    assert main([*args, "--data", str(data_folder), "--per-category", "0"]) == 2
    capsys.readouterr()
    assert not out.exists() and not (tmp_path / "p.manifest.json").exists()


def test_the_leak_check_fails_on_a_planted_duplicate(data_folder):
    from specgym.training.models.eval_prompts import build, check_no_leak, find_leaks

    prompts = _lines(data_folder / "prompts.jsonl")
    train = [p for p in prompts if p["split"] == "train"]
    ev = build(data_folder, per_category=2, seed=0)
    check_no_leak(ev.records, train, 0.5, 1)  # the real sample is clean
    donor = max(train, key=lambda p: len(p["prompt"].split()))
    assert len(donor["prompt"].split()) >= 8
    planted = [
        {"id": "x-near", "split": "val", "category": "chat", "source": "prompt:x-near", "passage": None,
         "prompt": donor["prompt"] + " thanks"},  # a near-duplicate: one word added
        {"id": "x-same", "split": "test", "category": "chat", "source": "prompt:x-same", "passage": None,
         "prompt": "  " + donor["prompt"].upper() + " "},  # the same normalised text
        {"id": "x-src", "split": "test", "category": "chat", "source": train[0]["source"], "passage": None,
         "prompt": "an unrelated request about gardening tools and tomatoes"},  # a train source
    ]
    kinds = {(lk.id, lk.kind) for lk in find_leaks([*ev.records, *planted], train, 0.5, 1)}
    assert {("x-near", "near-duplicate"), ("x-same", "duplicate"), ("x-src", "source")} <= kinds
    assert {i for i, _ in kinds} == {"x-near", "x-same", "x-src"}  # nothing of the real sample
    for p in planted:
        with pytest.raises(SpecgymError) as err:
            check_no_leak([*ev.records, p], train, 0.5, 1)
        msg = str(err.value)
        assert "\n" not in msg and p["id"] in msg and "train prompt" in msg


def test_a_leak_in_the_data_folder_is_left_out_and_named(data_folder, tmp_path):
    from specgym.training.models.eval_prompts import build

    folder = _copy(data_folder, tmp_path)
    prompts = _lines(folder / "prompts.jsonl")
    donor = max((p for p in prompts if p["split"] == "train"), key=lambda p: len(p["prompt"].split()))
    victim = next(p for p in prompts if p["split"] == "val" and p["passage"] is None)
    victim["prompt"] = donor["prompt"] + " please"  # the grouping missed it: a val prompt copying a train one
    (folder / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    ev = build(folder, per_category=10, seed=0)  # a cap above every cell: all that is held out, less the leak
    assert victim["id"] not in {r["id"] for r in ev.records}
    left = ev.manifest["leak_check"]["excluded"]
    assert [(e["id"], e["train_id"]) for e in left] == [(victim["id"], donor["id"])]
    assert len(ev.records) == sum(1 for p in prompts if p["split"] in ("val", "test")) - 1


def test_the_sample_takes_a_sources_second_prompt_only_when_the_cell_runs_out_of_sources():
    from specgym.training.models.eval_prompts import sample

    # one val cell: passages A (3 prompts), B (2) and C (1); a test cell of 1; a train prompt never taken
    rows = [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B"), ("c1", "C")]
    prompts = [{"id": i, "split": "val", "category": "rag", "source": s} for i, s in rows]
    prompts += [{"id": "t1", "split": "test", "category": "rag", "source": "D"},
                {"id": "r1", "split": "train", "category": "rag", "source": "E"}]
    for seed in range(8):
        three = sample(prompts, ["rag"], 3, seed)
        assert [p["split"] for p in three] == ["val", "test", "val", "val"]  # rank by rank over the two cells
        assert sorted(p["source"] for p in three if p["split"] == "val") == ["A", "B", "C"]
        five = sample(prompts, ["rag"], 5, seed)
        val5 = [p["source"] for p in five if p["split"] == "val"]
        assert val5[:3] == [p["source"] for p in three if p["split"] == "val"]  # the smaller cap's picks first
        assert sorted(val5[3:]) == ["A", "B"] and "r1" not in {p["id"] for p in five}
    assert len({tuple(p["id"] for p in sample(prompts, ["rag"], 3, s)) for s in range(8)}) > 1

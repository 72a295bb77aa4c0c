"""Sharded workloads (a folder of Parquet shards + one metadata record): merge/split, lazy validation, streaming
evaluation equal to the in-memory harness, one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from specgym.cli import main
from specgym.envs.workloads.dataset import chunks, merge_workloads, split_workload, write_dataset
from specgym.envs.workloads.synthetic import generate_workload
from specgym.envs.workloads.trace_format import RECORD, load_workload, open_dataset, save_workload
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.streaming import evaluate_streaming
from specgym.io import sha256_file

COLUMNS = ("request_id", "category", "temperature", "prompt_len", "split", "offsets", "p_accept", "draft_conf",
           "draft_entropy", "target_entropy")


@pytest.fixture(scope="module")
def signal_file(tmp_path_factory):
    """40 recorded requests with every v2 signal column (hidden sketch included), as one file."""
    wl = load_workload("midpair-greedy").subset(np.arange(40))
    path = tmp_path_factory.mktemp("sig") / "sig.parquet"
    save_workload(wl, path)
    return path


def _same(a, b):
    assert a.metadata() == b.metadata()
    for col in (*COLUMNS, *a.signal_names):
        x, y = getattr(a, col), getattr(b, col)
        assert (list(x) == list(y)) if x.dtype == object else np.array_equal(x, y, equal_nan=True), col
    assert a.signal_names == b.signal_names and a.prompt_text == b.prompt_text


def test_split_merge_round_trip_is_byte_identical(signal_file, tmp_path):
    ds = split_workload(signal_file, tmp_path / "ds", shard_requests=15)
    assert [s.requests for s in ds.shards] == [15, 15, 10]
    rec = json.loads((tmp_path / "ds" / RECORD).read_text())
    assert rec["requests"] == 40 and rec["metadata"] == load_workload(signal_file).metadata()
    _same(load_workload(tmp_path / "ds"), load_workload(signal_file))  # a folder loads whole
    merge_workloads([tmp_path / "ds"], tmp_path / "m.parquet")
    assert sha256_file(tmp_path / "m.parquet") == sha256_file(signal_file)


def test_cli_merge_and_split(signal_file, tmp_path, capsys):
    assert main(["workloads", "split", str(signal_file), "--out", str(tmp_path / "ds"), "--shard-requests", "25"]) == 0
    assert main(["workloads", "show", str(tmp_path / "ds")]) == 0
    assert "2 shards, 40 requests" in capsys.readouterr().out
    # merging two datasets into a folder keeps the shards; their ids must not collide
    assert main(["workloads", "merge", str(tmp_path / "ds"), "--out", str(tmp_path / "copy")]) == 0
    assert open_dataset(tmp_path / "copy").n_requests == 40
    assert main(["workloads", "merge", str(tmp_path / "copy"), "--out", str(tmp_path / "one.parquet")]) == 0
    assert sha256_file(tmp_path / "one.parquet") == sha256_file(signal_file)


def test_shards_are_validated_lazily_and_named(mix_workload, tmp_path):
    write_dataset(chunks(mix_workload, 100), tmp_path / "ds")
    (tmp_path / "ds" / "shard-00002.parquet").write_bytes(b"not parquet")
    it = open_dataset(tmp_path / "ds").iter_shards()
    assert next(it).n_requests == 100 and next(it).n_requests == 100  # shards 0 and 1 read before 2 is touched
    with pytest.raises(SpecgymError, match=r"shard-00002\.parquet: not a readable Parquet file"):
        next(it)


def test_mismatched_metadata_and_record_are_refused(mix_workload, tmp_path):
    write_dataset(chunks(mix_workload, 150), tmp_path / "ds")
    other = replace(next(chunks(mix_workload, 150)), name="other")
    save_workload(other.subset(np.arange(150, 300) - 150), tmp_path / "ds" / "shard-00001.parquet", overwrite=True)
    with pytest.raises(SpecgymError, match=r"shard-00001\.parquet: metadata field 'name' differs"):
        load_workload(tmp_path / "ds")
    with pytest.raises(SpecgymError, match="metadata field 'name' differs"):
        write_dataset([mix_workload.subset(np.arange(10)), other.subset(np.arange(10, 20))], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # nothing partial left behind
    rec = json.loads((tmp_path / "ds" / RECORD).read_text())
    rec["requests"] = 301
    (tmp_path / "ds" / RECORD).write_text(json.dumps(rec))
    with pytest.raises(SpecgymError, match=r"workload\.json: field 'requests' is 301, the shards sum to 300"):
        open_dataset(tmp_path / "ds")


def test_duplicate_ids_across_shards_are_refused(mix_workload, tmp_path):
    part = mix_workload.subset(np.arange(20))
    with pytest.raises(SpecgymError, match="already in an earlier shard"):
        write_dataset([part, part], tmp_path / "dup")


@pytest.mark.parametrize("split", ["all", "test"])
def test_streaming_eval_equals_in_memory_eval(tmp_path, split):
    wl = generate_workload("speclane-mix", 240, seed=5)
    write_dataset(chunks(wl, 70), tmp_path / "ds")
    specs = "marginal,ucb,fixed:3"  # ucb keeps state across requests: served in the same order over shards
    s = evaluate_streaming(tmp_path / "ds", specs, split=split, seed=2)
    m = evaluate(EvalConfig(workload=load_workload(tmp_path / "ds"), controllers=specs, split=split, seed=2,
                            bootstrap=0, per_request=True))
    assert s["workload"]["shards"] == 4 and s["requests"] == m["workload"]["requests"]
    for key, times in m["per_request_time_ms"].items():
        assert np.array_equal(s["per_request_time_ms"][key], times), key
    assert s["reference"] == m["reference"]
    rows = {r["spec"]: r for r in s["rows"]}
    for row in m["rows"]:
        for key in ("throughput_tok_s", "speedup_vs_best_fixed", "oracle_ratio", "mean_k", "tpot_ms_p99"):
            assert rows[row["spec"]][key] == row[key], (row["spec"], key)
    assert s["informed_oracle"]["total_time_ms"] == m["informed_oracle"]["total_time_ms"]


def test_cli_errors_are_one_line(mix_workload, tmp_path, capsys, one_line_error):
    write_dataset(chunks(mix_workload, 100), tmp_path / "ds")
    (tmp_path / "ds" / "shard-00001.parquet").write_bytes(b"junk")
    assert main(["eval", "--workload", str(tmp_path / "ds"), "--stream", "--out", str(tmp_path / "e")]) == 2
    # every shard file is checked when the folder is opened, before any shard is replayed (issue 29 item 5)
    one_line_error(capsys, "shard-00001.parquet", "truncated or damaged", "no whole Parquet footer")
    assert not (tmp_path / "e").exists()
    (tmp_path / "empty").mkdir()
    assert main(["workloads", "merge", str(tmp_path / "empty"), "--out", str(tmp_path / "m.parquet")]) == 2
    one_line_error(capsys, "workload.json", "not a sharded workload")
    assert main(["eval", "--workload", str(tmp_path / "ds"), "--stream", "--controllers", "tree-static",
                 "--out", str(tmp_path / "e")]) == 2
    one_line_error(capsys, "tree controllers (tree-static) need the whole workload")

"""The importer of SpecDecode-Bench's published traces: the convention, the drafters, the signals, the errors.

Every file here is SYNTHETIC, written by the tests in the published format (tests/specdecode_files.py); the last
tests read the shared copy of the published files and skip when it is absent."""

from __future__ import annotations

import json

import numpy as np
import pytest
from specdecode_files import request, shared_files, synthetic_file, write_file

from specgym.cli import main
from specgym.envs.core.lookup import lookup_brute
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.specdecode import SPLIT_SEED, dataset_name, import_file
from specgym.envs.workloads.trace_format import assign_splits, load_workload


def test_convention_runs_prompt_len_and_token_ids(tmp_path):
    """N = len(acc_len) - 1 positions, runs[i] = acc_len[i] - 1, prompt_len = len(prompt) + 1, token_id[i] =
    generated[i + 1], lookup on prompt + first token + completion so far."""
    rng = np.random.default_rng(3)
    reqs = [request(rng, "a", 30), request(rng, "b", 12)]
    f = write_file(tmp_path / "combined_gsm8k.jsonl", reqs)
    wl = import_file(f).workload
    assert wl.name == "specdecode-gsm8k" and wl.categories() == ["gsm8k"] and wl.is_published
    assert wl.drafter_names == ["eagle", "ngram"] and wl.trace_kind == "per-start"
    assert wl.format_version == 3 and wl.p_accept is None and wl.draft_conf is None and wl.draft_entropy is None
    for r, src in enumerate(reqs):
        sl = wl.span(r)
        n = len(src["acc_ngram"]["acc_len"]) - 1
        assert sl.stop - sl.start == n
        assert wl.prompt_len[r] == len(src["prompt_token_ids"]) + 1
        for d, key in (("eagle", "acc_eagle"), ("ngram", "acc_ngram")):
            np.testing.assert_array_equal(wl.runs[d][sl], np.asarray(src[key]["acc_len"][:n]) - 1)
        np.testing.assert_array_equal(wl.token_id[sl], src["generated_token_ids"][1:n + 1])
        seq = src["prompt_token_ids"] + src["generated_token_ids"][:1]
        for i in (0, 1, n // 2, n - 1):
            assert (int(wl.lookup_len[sl][i]), int(wl.lookup_token[sl][i])) == lookup_brute(
                seq + src["generated_token_ids"][1:i + 1])
    assert wl.lookup_agree is None and wl.draft_token is None  # no draft token in the data
    np.testing.assert_array_equal(wl.split, assign_splits(2, SPLIT_SEED, (0.7, 0.1, 0.2)))


def test_both_drafters_cut_to_the_shorter_list_and_record_the_cut(tmp_path):
    rng = np.random.default_rng(4)
    reqs = [request(rng, "long", 20, eagle_delta=5), request(rng, "short", 20, eagle_delta=-4),
            request(rng, "same", 20)]
    imp = import_file(write_file(tmp_path / "combined_cnn.jsonl", reqs))
    wl = imp.workload
    assert wl.lengths.tolist() == [19, 15, 19]
    assert wl.extra["specdecode"]["cut"] == {"long": 5, "short": 4}
    assert (imp.cut_requests, imp.cut_positions) == (2, 9)
    assert "differ in 2 requests: 9 positions cut" in imp.summary()


def test_one_drafter_keeps_its_own_length_and_no_token_ids_where_they_are_not_its_tokens(tmp_path):
    rng = np.random.default_rng(5)
    reqs = [request(rng, "long", 20, eagle_delta=5), request(rng, "same", 20)]
    f = write_file(tmp_path / "combined_sharegpt.jsonl", reqs)
    wl = import_file(f, ("eagle",)).workload
    assert wl.drafter_names == ["eagle"] and wl.lengths.tolist() == [24, 19] and list(wl.runs) == ["eagle"]
    assert wl.token_id is None and wl.lookup_len is None  # the ids are not the EAGLE run's completion
    ng = import_file(f, ("ngram",)).workload
    assert ng.lengths.tolist() == [19, 19] and ng.token_id is not None


def test_round_trip_and_replay_of_an_import(tmp_path):
    f = synthetic_file(tmp_path / "combined_instructcoder.jsonl", n=10, seed=1)
    wl = import_file(f).workload
    assert main(["workloads", "import", "specdecode-bench", str(f), "--out", str(tmp_path / "w.parquet")]) == 0
    back = load_workload(tmp_path / "w.parquet")
    assert back.metadata() == wl.metadata() and back.drafters == wl.drafters
    for d in wl.runs:
        np.testing.assert_array_equal(back.runs[d], wl.runs[d])
    assert back.p_accept is None and back.runs["eagle"].dtype == np.int16
    eng = TraceEngine(back, k_max=16)
    assert eng.drafter == "eagle" and eng.profile.name == "h100-llama31-8b"


def test_folder_import_one_workload_per_file(tmp_path, capsys):
    src = tmp_path / "data"
    for i, ds in enumerate(("gsm8k", "cnn")):
        synthetic_file(src / f"combined_{ds}.jsonl", n=6, seed=i)
    out = tmp_path / "out"
    assert main(["workloads", "import", "specdecode-bench", str(src), "--out", str(out)]) == 0
    # a new folder appears whole, with the marker of every folder specgym creates
    assert sorted(p.name for p in out.iterdir()) == [".specgym", "specdecode-cnn.parquet", "specdecode-gsm8k.parquet"]
    assert load_workload(out / "specdecode-cnn.parquet").categories() == ["cnn"]
    assert "wrote" in capsys.readouterr().out
    # again without --force: refused, nothing overwritten
    assert main(["workloads", "import", "specdecode-bench", str(src), "--out", str(out)]) != 0


@pytest.mark.parametrize("mutate, fragment", [
    (lambda r: "{not json", "line 2: not valid JSON"),
    (lambda r: json.dumps({k: v for k, v in r.items() if k != "acc_eagle"}),
     "line 2: field 'acc_eagle.acc_len' missing"),
    (lambda r: json.dumps(r | {"acc_ngram": {"acc_len": [2, 0, 1]}}), "line 2: field 'acc_ngram.acc_len'[1] = 0"),
    (lambda r: json.dumps(r | {"acc_eagle": {"acc_len": [3]}}),
     "field 'acc_eagle.acc_len' must be a list of at least 2"),
    (lambda r: json.dumps(r | {"prompt_token_ids": [1, "x"]}), "field 'prompt_token_ids'[1] = 'x'"),
    (lambda r: json.dumps(r | {"id": "q0"}), "field 'id' 'q0' repeats an earlier request"),
    (lambda r: json.dumps(r | {"id": ""}), "field 'id' must be a non-empty string"),
])
def test_every_defect_is_one_line_naming_file_line_and_field(tmp_path, capsys, one_line_error, mutate, fragment):
    rng = np.random.default_rng(0)
    good = [request(rng, f"q{i}", 10) for i in range(3)]
    lines = [json.dumps(good[0]), mutate(good[1]), json.dumps(good[2])]
    bad = tmp_path / "combined_gsm8k.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    out = tmp_path / "w.parquet"
    assert main(["workloads", "import", "specdecode-bench", str(bad), "--out", str(out)]) != 0
    one_line_error(capsys, str(bad), fragment)
    assert not out.exists()


def test_a_defect_in_one_file_of_a_folder_writes_nothing(tmp_path, capsys, one_line_error):
    src = tmp_path / "data"
    synthetic_file(src / "combined_cnn.jsonl", n=4)
    (src / "combined_gsm8k.jsonl").write_text('{"id": "x"}\n')
    out = tmp_path / "out"
    assert main(["workloads", "import", "specdecode-bench", str(src), "--out", str(out)]) != 0
    one_line_error(capsys, "combined_gsm8k.jsonl, line 1")
    assert not out.exists() or not any(out.iterdir())


def test_bad_options_are_one_line(tmp_path, capsys, one_line_error):
    f = synthetic_file(tmp_path / "combined_cnn.jsonl", n=3)
    assert main(["workloads", "import", "specdecode-bench", str(f), "--out", str(tmp_path / "w.parquet"),
                 "--drafters", "eagle,medusa"]) != 0
    one_line_error(capsys, "--drafters")
    assert main(["workloads", "import", "specdecode-bench", str(tmp_path / "nope"), "--out",
                 str(tmp_path / "w.parquet")]) != 0
    one_line_error(capsys, "no such file or folder")


def test_dataset_name_from_the_file_name(tmp_path):
    assert dataset_name(tmp_path / "combined_instructcoder.jsonl") == "instructcoder"
    assert dataset_name(tmp_path / "mine.jsonl") == "mine"


# ------------------------------------------------------------------------------ the shared copy (skips when absent)
@pytest.mark.skipif(not shared_files(), reason="the published SpecDecode-Bench files are not in the shared copy")
def test_the_published_files_import_with_the_documented_shape():
    """Counts from the shared copy's README: 300 / 500 / 310 / 300 requests; the n-gram list matches the generated
    ids; EAGLE-only imports keep the EAGLE length."""
    want = {"gsm8k": 300, "instructcoder": 500, "sharegpt": 310, "cnn": 300}
    for f in shared_files():
        imp = import_file(f)
        wl = imp.workload
        assert wl.n_requests == want[wl.categories()[0]] and wl.token_id is not None
        assert (wl.runs["eagle"] >= 0).all() and (wl.runs["ngram"] >= 0).all()
        eagle = import_file(f, ("eagle",)).workload
        assert eagle.n_positions >= wl.n_positions and eagle.n_requests == wl.n_requests


# ------------------------------------------------- nothing silent, nothing half-written (new-user run 5, F4 F5 F10)
def test_two_files_mapping_to_one_workload_write_nothing_with_or_without_force(tmp_path, capsys, one_line_error):
    src = tmp_path / "coll"
    synthetic_file(src / "combined_x.jsonl", n=5, seed=1)
    synthetic_file(src / "x.jsonl", n=3, seed=2)
    for force in ([], ["--force"]):
        out = tmp_path / "out"
        assert main(["workloads", "import", "specdecode-bench", str(src), "--out", str(out), *force]) == 2
        one_line_error(capsys, "combined_x.jsonl", "x.jsonl", "'specdecode-x'", "nothing was written")
        assert not out.exists()
    existing = tmp_path / "mine"  # an existing folder: nothing added to it either
    existing.mkdir()
    assert main(["workloads", "import", "specdecode-bench", str(src), "--out", str(existing), "--force"]) == 2
    assert list(existing.iterdir()) == []


def test_a_failed_write_in_a_folder_import_leaves_no_file(tmp_path, monkeypatch, capsys, one_line_error):
    import specgym.envs.workloads.parquet_io as pio

    src = tmp_path / "data"
    for i, ds in enumerate(("cnn", "gsm8k")):
        synthetic_file(src / f"combined_{ds}.jsonl", n=4, seed=i)
    out = tmp_path / "out"
    out.mkdir()  # an existing folder: files are added one by one, all or nothing
    real, calls = pio.atomic_paths, []

    def full_disk(paths, overwrite=False):  # the second file's write fails, as on a full disk
        ctx = real(paths, overwrite)
        tmps = ctx.__enter__()
        calls.append(tmps)
        try:
            tmps[1].write_bytes(b"")
            raise OSError(28, "No space left on device", str(tmps[1]))
        except OSError as exc:
            ctx.__exit__(type(exc), exc, None)
            raise

    monkeypatch.setattr(pio, "atomic_paths", full_disk)
    assert main(["workloads", "import", "specdecode-bench", str(src), "--out", str(out)]) == 2
    one_line_error(capsys, "No space left on device")
    assert list(out.iterdir()) == []  # neither file, no temporary


@pytest.mark.parametrize("mutate, fragment", [
    (lambda r: r | {"generated_token_ids": []}, "field 'generated_token_ids' has 0 tokens"),
    (lambda r: {k: v for k, v in r.items() if k != "generated_token_ids"}, "field 'generated_token_ids' missing"),
    (lambda r: r | {"id": "a\nb"}, "holds a control character"),
    (lambda r: r | {"acc_eagle": {"acc_len": [2] * 5 + [230] + [1] * (len(r["generated_token_ids"]) - 6)}},
     "past the request's end"),
])
def test_silent_acceptances_are_refused_naming_line_and_field(tmp_path, capsys, one_line_error, mutate, fragment):
    rng = np.random.default_rng(0)
    good = [request(rng, f"q{i}", 12) for i in range(3)]
    f = write_file(tmp_path / "combined_cnn.jsonl", [good[0], mutate(good[1]), good[2]])
    out = tmp_path / "w.parquet"
    assert main(["workloads", "import", "specdecode-bench", str(f), "--out", str(out)]) == 2
    one_line_error(capsys, "line 2", fragment)
    assert not out.exists()


def test_a_duplicate_key_is_refused(tmp_path, capsys, one_line_error):
    rng = np.random.default_rng(0)
    lines = [json.dumps(request(rng, f"q{i}", 10)) for i in range(2)]
    lines[1] = lines[1][:-1] + ', "id": "other"}'
    f = tmp_path / "combined_cnn.jsonl"
    f.write_text("\n".join(lines) + "\n")
    assert main(["workloads", "import", "specdecode-bench", str(f), "--out", str(tmp_path / "w.parquet")]) == 2
    one_line_error(capsys, "line 2", "field 'id' appears twice")


def test_acc_lists_shorter_than_the_tokens_are_noted(tmp_path):
    rng = np.random.default_rng(0)
    reqs = [request(rng, f"q{i}", 20) for i in range(3)]
    reqs[1]["acc_eagle"]["acc_len"] = reqs[1]["acc_eagle"]["acc_len"][:5]
    reqs[1]["acc_ngram"]["acc_len"] = reqs[1]["acc_ngram"]["acc_len"][:5]
    imp = import_file(write_file(tmp_path / "combined_cnn.jsonl", reqs))
    assert "acc_len lists shorter than generated_token_ids in 1 requests" in imp.summary()


@pytest.mark.parametrize("argv, fragment", [
    (["--name", "../../evil"], "--name '../../evil': a workload name"),
    (["--name", ""], "--name '': a workload name"),
    (["--out", ""], "--out: empty path"),
    (["--out", "{TMP}/plain.txt"], "--out {TMP}/plain.txt: this command writes .parquet files"),
])
def test_import_options_are_checked(tmp_path, capsys, one_line_error, argv, fragment):
    f = synthetic_file(tmp_path / "combined_cnn.jsonl", n=3)
    argv = [a.replace("{TMP}", str(tmp_path)) for a in argv]
    out = ["--out", str(tmp_path / "w.parquet")] if "--out" not in argv else []
    assert main(["workloads", "import", "specdecode-bench", str(f), *out, *argv]) == 2
    one_line_error(capsys, fragment.replace("{TMP}", str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["combined_cnn.jsonl"]


def test_odd_sources_are_named(tmp_path, capsys, one_line_error):
    out = ["--out", str(tmp_path / "w.parquet")]
    assert main(["workloads", "import", "specdecode-bench", "/dev/null", *out]) == 2
    one_line_error(capsys, "/dev/null: not a regular file or folder")
    assert main(["workloads", "import", "specdecode-bench", "", *out]) == 2
    one_line_error(capsys, "source: empty path")
    src = tmp_path / "src"
    synthetic_file(src / "combined_cnn.jsonl", n=3)
    (src / "combined_gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    assert main(["workloads", "import", "specdecode-bench", str(src), "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "combined_gone.jsonl: not a readable file (a broken link")


def test_drafters_given_as_one_string(tmp_path):
    f = synthetic_file(tmp_path / "combined_cnn.jsonl", n=3)
    assert import_file(f, drafters="eagle").workload.drafter_names == ["eagle"]

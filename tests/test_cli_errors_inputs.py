"""CLI errors of bad inputs: a missing, unreadable or non-UTF-8 file, a folder where a file is expected, a workload
that lacks what a controller or predictor needs (a train split, the hidden sketch), a controller that cannot run
where it is asked to, and the machine's own refusals (memory, the file system). Each ends in one line that names
the input and what it lacks, never a traceback, and nothing is written.

The other CLI-error tests, by concern: ``test_cli_errors_options.py`` (bad flags and values),
``test_cli_outputs.py`` (outputs), ``test_cli_fuzz.py`` (every command with a table of bad values).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from cli_workloads import no_train

import specgym
from specgym.cli import main
from specgym.envs.workloads.trace_format import load_workload, save_workload
from specgym.errors import SpecgymError


# ------------------------------------------------------------------------------ files that cannot be read
@pytest.mark.parametrize("argv,msg", [
    (["workloads", "show", "/nonexistent/w.parquet"], "w.parquet: workload file not found"),
    (["workloads", "show", "nope"], "unknown workload 'nope'"),
])
def test_a_missing_or_unknown_workload_is_one_line(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err and "Traceback" not in err


def test_console_script_runs_without_traceback(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"garbage")
    proc = subprocess.run([sys.executable, "-m", "specgym", "workloads", "show", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not a readable Parquet file" in proc.stderr and "Traceback" not in proc.stderr


def test_non_utf8_and_folder_inputs(tmp_path, capsys, one_line_error):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(SpecgymError, match="not UTF-8"):
        specgym.load_profile(bad)
    assert main(["eval", "--workload", "assc-regimes", "--profile", str(bad), "--out", str(tmp_path / "e")]) == 2
    one_line_error(capsys, "not UTF-8")
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(b'{"prompt": "\xff"}\n')
    for p, fragment in ((prompts, "not UTF-8"), (tmp_path, "is a folder")):
        assert main(["record", "--prompts", str(p), "--out", str(tmp_path / "t.parquet")]) == 2
        one_line_error(capsys, fragment)
    assert main(["tune", "vllm", "--workload", "assc-regimes", "--profile", str(bad)]) == 2
    one_line_error(capsys, "not UTF-8")


# ------------------------------------------------------------------- workloads that lack what is needed
@pytest.mark.parametrize("spec", ["tree-sequoia", "tree-predicted:midpair"])
def test_split_all_without_train_names_the_controller_that_needs_it(tmp_path, capsys, spec, one_line_error):
    assert main(["eval", "--workload", str(no_train(tmp_path)), "--split", "all", "--controllers",
                 f"fixed:2,{spec}", "--bootstrap", "0", "--no-plots", "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, f"{spec}:", "'train'", "fits itself on the train split")
    assert not (tmp_path / "r").exists()


def test_predictor_hint_names_the_missing_sketch_not_another_format(tmp_path, capsys, one_line_error):
    wl = load_workload("midpair-greedy")
    sub = wl.subset(np.arange(40))
    sub = dataclasses.replace(sub, hidden_sketch=None,
                              signal_meta={k: v for k, v in sub.signal_meta.items() if k != "hidden_sketch"})
    path = tmp_path / "nosketch.parquet"
    save_workload(sub, path)
    assert main(["predictor", "train", "--workload", str(path), "--groups", "conf,hidden",
                 "--out", str(tmp_path / "p.json")]) == 2
    err = one_line_error(capsys, "hidden (hidden_sketch)", "--hidden-sketch D")
    assert "format v2" not in err


def test_a_predictor_no_better_than_chance_is_not_written(tmp_path, capsys, one_line_error):
    from tests.synthetic_v2 import v2_workload

    wl = v2_workload(80, temperature=0.8)  # sampled: p_accept is a probability, free of the greedy identity
    val = wl.split == "val"
    req_of_pos = np.repeat(np.arange(wl.n_requests), wl.lengths)
    flip = val[req_of_pos]
    wl.p_accept[flip] = 1.0 - wl.p_accept[flip]  # validation labels the reverse of train's
    path = tmp_path / "w.parquet"
    save_workload(wl, path)
    out = tmp_path / "p.json"
    assert main(["predictor", "train", "--workload", str(path), "--kinds", "logistic", "--out", str(out)]) == 2
    one_line_error(capsys, "not written", "validation AUC", "no better than chance")
    assert not out.exists()


# ---------------------------------------------------------- controllers where they cannot run
def test_live_bench_refuses_a_replay_only_controller_before_loading_anything(monkeypatch):
    import specgym.eval.bench.live as live

    def no_load(*a, **k):
        raise AssertionError("the pair was loaded before the specs were checked")

    monkeypatch.setattr(live, "load_pair", no_load)
    with pytest.raises(SpecgymError, match="tree-predicted:midpair: grows its tree"):
        live.run_live_bench(console=None, specs=["fixed:2", "tree-predicted:midpair"])


# ---------------------------------------------------------------------- the machine's refusals
def test_memory_and_file_system_errors_never_trace_back(capsys, monkeypatch, one_line_error):
    import specgym.commands.workloads as workloads

    def boom(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(workloads, "generate_workload", boom)
    assert main(["workloads", "make", "--preset", "speclane-mix", "--out", "/nonexistent-dir/x.parquet"]) == 2
    one_line_error(capsys, "out of memory")

"""The ``specgym`` command: workloads make/show/list, bench, and one-line errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specgym.cli import main
from specgym.envs.workloads.trace_format import load_workload


def test_workloads_make_and_show(tmp_path, capsys):
    out = tmp_path / "w.parquet"
    assert main(["workloads", "make", "--preset", "assc-regimes", "--requests", "30", "--seed", "4",
                 "--out", str(out)]) == 0
    wl = load_workload(out)
    assert wl.n_requests == 30 and wl.is_synthetic and wl.source["seed"] == 4
    assert main(["workloads", "show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SYNTHETIC" in text and "splits" in text and "reasoning" in text
    n_test = int((wl.split == "test").sum())
    assert main(["workloads", "show", str(out), "--split", "test"]) == 0  # one split's requests only
    text = capsys.readouterr().out
    assert f"requests  {n_test} " in text and f"splits    train 0  val 0  test {n_test}" in text
    # same seed -> identical file content
    out2 = tmp_path / "w2.parquet"
    main(["workloads", "make", "--preset", "assc-regimes", "--requests", "30", "--seed", "4", "--out", str(out2)])
    assert (load_workload(out2).p_accept == wl.p_accept).all()


def test_make_refuses_overwrite_and_leaves_no_partial(tmp_path, capsys):
    out = tmp_path / "w.parquet"
    out.write_text("precious")
    assert main(["workloads", "make", "--preset", "speclane-mix", "--requests", "5", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert out.read_text() == "precious"
    assert main(["workloads", "make", "--preset", "speclane-mix", "--requests", "0",
                 "--out", str(tmp_path / "z.parquet")]) == 2
    assert list(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize("argv,msg", [
    (["workloads", "show", "/nonexistent/w.parquet"], "w.parquet: workload file not found"),
    (["workloads", "show", "nope"], "unknown workload 'nope'"),
])
def test_errors_are_one_line(argv, msg, capsys):
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


def test_bench_prints_figures(capsys):
    assert main(["bench", "vector", "--workload", "assc-regimes"]) == 0
    out = capsys.readouterr().out
    assert "rounds/s" in out and "assc-regimes" in out


@pytest.mark.parametrize("argv, pointer", [
    (["--sections", "load,vector"], "specgym bench load"),
    (["--vllm-concurrency", "1,4"], "specgym bench vllm --concurrency"),
    (["vllm", "--vllm-eager"], "specgym bench vllm --eager"),
    (["--live-prompts", "3"], "specgym bench live --prompts"),
    (["--scale-dir", "x"], "specgym bench scale --dir"),
    (["--eval-requests", "5"], "specgym bench eval --requests"),
])
def test_bench_old_spellings_point_to_the_sub_command(argv, pointer, capsys):
    """The one-command ``bench`` flags (``--sections``, ``--vllm-*``, ``--live-*`` ...) are refused in one line
    that names the sub-command replacing them; nothing runs."""
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert pointer in err and len(err.splitlines()) == 1 and "is gone" in err


def test_bench_sections_have_their_own_flags(capsys):
    """Each section's flags belong to its sub-command: ``bench vllm --concurrency``, not ``bench --concurrency``."""
    from specgym.cli import build_parser

    args = build_parser().parse_args(["bench", "vllm", "--concurrency", "1,2", "--eager", "--json", "v.json"])
    assert (args.section, args.vllm_concurrency, args.vllm_eager, str(args.json)) == ("vllm", "1,2", True, "v.json")
    args = build_parser().parse_args(["bench", "--workload", "assc-regimes", "live", "--prompts", "2"])
    assert (args.section, args.live_prompts, args.workload) == ("live", 2, "assc-regimes")
    assert build_parser().parse_args(["bench"]).section is None  # the default sections in turn
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "load", "--concurrency", "2"])

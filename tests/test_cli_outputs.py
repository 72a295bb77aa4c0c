"""CLI outputs: what a command writes is never lost or half-written. An existing output is refused without
``--force`` (and ``--force`` replaces only what specgym wrote), an output equal to an input is refused whatever the
flags, a kill in the middle of a write leaves only a temporary that the re-run removes, Ctrl-C is one line and leaves
nothing, and the tour's outputs are ignored by git."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_workloads import saved, small

from specgym.cli import main

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ existing outputs: refused without --force
def test_make_refuses_overwrite_and_leaves_no_partial(tmp_path, capsys):
    out = tmp_path / "w.parquet"
    out.write_text("precious")
    assert main(["workloads", "make", "--preset", "speclane-mix", "--requests", "5", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert out.read_text() == "precious"
    assert list(tmp_path.iterdir()) == [out]  # no partial output beside it


def test_bench_json_refuses_an_existing_file_without_force(tmp_path, capsys):
    """The report (F6): ``bench vector --json out/important.json`` replaced the user's file. Now it is refused like
    every other output, and ``--force`` replaces it."""
    mine = tmp_path / "important.json"
    mine.write_text('{"mine": 1}\n')
    assert main(["bench", "vector", "--workload", "assc-regimes", "--json", str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"--json {mine}: already exists (pass --force to replace it)" in err
    assert mine.read_text() == '{"mine": 1}\n'
    assert main(["bench", "vector", "--workload", "assc-regimes", "--json", str(mine), "--force"]) == 0
    assert json.loads(mine.read_text())["workload"] == "assc-regimes"
    (tmp_path / "bench-vllm").mkdir()
    (tmp_path / "bench-vllm" / "vllm.json").write_text("{}\n")  # an earlier `bench vllm` run's results
    assert main(["bench", "vllm", "--out", str(tmp_path / "bench-vllm")]) == 2  # refused before vLLM is needed
    assert "holds an earlier run's vllm.json (pass --force" in capsys.readouterr().err
    commands = (ROOT / "Makefile").read_text().replace("\\\n", " ").splitlines()  # one line per command
    benches = [c for c in commands if " bench " in c and "--json" in c]
    assert len(benches) >= 4 and all("--force" in c for c in benches)  # make's re-runs replace their figures


def test_make_demo_can_run_twice():
    """``make demo`` passes --force: a demo folder specgym wrote (finished or interrupted) is replaced."""
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:")[1].split("\n\n")[0]
    assert "specgym demo --force" in recipe


def test_an_interrupted_demo_can_be_run_again_with_force(tmp_path, monkeypatch):
    """Ctrl-C in the middle of a demo leaves a folder specgym owns: the next ``make demo`` (--force) replaces it."""
    pytest.importorskip("stable_baselines3")
    from specgym.training.rewards import TokenValueReward

    calls = {"n": 0}
    original = TokenValueReward.step

    def interrupting(self, action):
        calls["n"] += 1
        if calls["n"] == 300:
            raise KeyboardInterrupt
        return original(self, action)

    root = tmp_path / "demo"
    args = ["demo", "--workload", "assc-regimes", "--out", str(root), "--k-steps", "512", "--no-token", "--force"]
    monkeypatch.setattr(TokenValueReward, "step", interrupting)
    assert main(args) == 130
    monkeypatch.undo()
    assert main(args) == 0
    assert (root / "report" / "report.md").is_file()


def test_gitignore_covers_the_tour_outputs():
    ignored = (ROOT / ".gitignore").read_text().split()
    for path in ("/runs/", "/out/", "/policies/", "/my.parquet", "/my-profile.json"):
        assert path in ignored or path.strip("/") + "/" in ignored or path.lstrip("/") in ignored, path


# ------------------------------- --out equal to an input: refused whatever the flags (new-user run 5, F3)
def _import_src(tmp: Path) -> Path:
    from specdecode_files import synthetic_file

    return synthetic_file(tmp / "in" / "same.jsonl", n=4)


def _workload(tmp: Path) -> Path:
    return saved(small(2), tmp / "w", "both.parquet")


#: (how to make the input, argv with {IN} for it; --out names the input too).
SAME_AS_INPUT: list[tuple[str, list[str]]] = [
    ("jsonl", ["workloads", "import", "specdecode-bench", "{IN}", "--out", "{IN}"]),
    ("parquet", ["workloads", "merge", "{IN}", "--out", "{IN}"]),
    ("parquet", ["tune", "vllm", "--workload", "{IN}", "--profile", "batch-a100-7b-roofline", "--max-batch", "8",
                 "--out", "{IN}"]),
    ("parquet", ["tune", "compare", "--workload", "{IN}", "--profile", "batch-a100-7b-roofline", "--replications",
                 "1", "--requests", "4", "--out", "{IN}"]),
    ("parquet", ["predictor", "train-runs", "--workload", "{IN}", "--out", "{IN}"]),
    ("parquet", ["eval", "--workload", "{IN}", "--no-plots", "--out", "{DIR}"]),  # the folder holding the input
    ("parquet", ["train", "--workload", "{IN}", "--timesteps", "64", "--out", "{DIR}"]),
]


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["plain", "force"])
@pytest.mark.parametrize("make,argv", SAME_AS_INPUT, ids=[" ".join(a[:2]) for _, a in SAME_AS_INPUT])
def test_output_equal_to_an_input_is_refused_whatever_the_flags(tmp_path, capsys, make, argv, force):
    src = _import_src(tmp_path) if make == "jsonl" else _workload(tmp_path)
    if "{DIR}" in argv:  # a folder --force could replace: specgym's own (a marker listing the input)
        (src.parent / ".specgym").write_text('{"files": ["both.parquet"]}')
    before = src.read_bytes()
    rc = main([a.replace("{IN}", str(src)).replace("{DIR}", str(src.parent)) for a in argv] + force)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "Traceback" not in err, err
    assert "input" in err and "--force" not in err.split("error:", 1)[1], err  # never "pass --force"
    assert src.read_bytes() == before
    assert not [p.name for p in src.parent.iterdir() if p.name.startswith(".specgym-tmp-")]


# --------------------------- kills: SIGINT / SIGKILL in the middle of a write, then a re-run (F8, F11)
KILLER = r"""
import os, signal, sys
import specgym.io as io
where, sig = sys.argv[1], getattr(signal, sys.argv[2])
real = getattr(io, where)
def killed(*args, **kwargs):
    os.kill(os.getpid(), sig)  # mid-write: the temporary is complete, not yet renamed into place
    return real(*args, **kwargs)
setattr(io, where, killed)
from specgym.cli import main
sys.exit(main(sys.argv[3:]))
"""

#: (the io function the kill lands in, the command, the output it writes).
KILLS: list[tuple[str, list[str], str]] = [
    ("_link_exclusive", ["workloads", "make", "--preset", "speclane-mix", "--requests", "5", "--out", "{OUT}"],
     "w.parquet"),
    ("_rename_exclusive", ["eval", "--workload", "assc-regimes", "--max-requests", "4", "--bootstrap", "0",
                           "--no-plots", "--controllers", "fixed:2", "--out", "{OUT}"], "ev"),
    ("_rename_exclusive", ["workloads", "import", "specdecode-bench", "{SRC}", "--out", "{OUT}"], "traces"),
]


def _fill(argv: list[str], out: Path, tmp_path: Path) -> list[str]:
    """``{OUT}``, and ``{SRC}``: a folder of two SYNTHETIC SpecDecode-Bench files beside ``tmp_path`` (not in it)."""
    from specdecode_files import synthetic_file

    src = tmp_path.parent / f"{tmp_path.name}-src"
    if any("{SRC}" in a for a in argv) and not src.exists():
        for i, ds in enumerate(("cnn", "gsm8k")):
            synthetic_file(src / f"combined_{ds}.jsonl", n=4, seed=i)
    return [a.replace("{OUT}", str(out)).replace("{SRC}", str(src)) for a in argv]


def _run_killed(tmp_path: Path, where: str, sig: str, argv: list[str]):
    import signal
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", KILLER, where, sig, *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize("where,argv,name", KILLS, ids=[" ".join(a[:2]) for _, a, _ in KILLS])
def test_sigkill_mid_write_then_a_rerun_leaves_no_temporaries(tmp_path, capsys, where, argv, name):
    out = tmp_path / name
    argv = _fill(argv, out, tmp_path)
    proc = _run_killed(tmp_path, where, "SIGKILL", argv)
    assert proc.returncode == -9, proc.stderr
    assert not out.exists()  # no half-written output: only the hidden temporary
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".specgym-tmp-")]
    assert left and all(p.startswith(f".specgym-tmp-{name}.") for p in left), left  # named after the output
    assert main(argv) == 0, capsys.readouterr().err  # the re-run of the same output
    assert out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "temporaries left after a re-run"


@pytest.mark.parametrize("where,argv,name", KILLS, ids=[" ".join(a[:2]) for _, a, _ in KILLS])
def test_sigint_mid_write_is_one_line_and_leaves_nothing(tmp_path, where, argv, name):
    out = tmp_path / name
    proc = _run_killed(tmp_path, where, "SIGINT", _fill(argv, out, tmp_path))
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(": interrupted"), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no temporary


STARTUP = r"""
import os, signal, sys
target = sys.argv[1]
sys.argv = [os.path.join(os.path.dirname(sys.executable), "specgym"), *sys.argv[2:]]  # as the console command
class InterruptOnImport:
    def find_spec(self, name, path=None, target_=None):
        if name == target:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while this module loads
        return None
sys.meta_path.insert(0, InterruptOnImport())
from specgym.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("module", ["specgym.envs.core", "gymnasium", "specgym.commands.eval"])
def test_ctrl_c_during_start_up_is_one_line(tmp_path, module):
    import signal
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", STARTUP, module, "eval", "--out", str(tmp_path / "ev")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "specgym eval: interrupted", proc.stderr
    assert list(tmp_path.iterdir()) == []

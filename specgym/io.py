"""Safe file output: every output path is checked in one place, written atomically and claimed exclusively.

* :func:`check_output` is the one overwrite / ``--force`` check of every command: an output must be a regular file
  or a plain folder (never a device node, a link, ``.`` or ``..``), of the kind the command writes; an existing one
  is refused unless ``--force``, and ``--force`` replaces a folder only when specgym wrote everything in it.
* Every folder specgym creates carries a marker file, :data:`MARKER`, listing what specgym wrote there (names or
  glob patterns, relative to the folder). A folder without it, or holding anything the marker does not list (a
  user's notes, a stray data file), is not specgym's to delete: ``--force`` refuses it in one line.
* :func:`atomic_path` / :func:`atomic_dir` write to a temporary file or folder next to the target and rename it into
  place only when complete, so a crash or a bad input never leaves a partial output. Creating a new output is
  exclusive: when two runs race for the same new path, the second one refuses instead of replacing the first's.
* Temporaries are named ``.specgym-tmp-<output name>.<pid>.<random>.tmp`` (``.old`` for a replaced folder on its way
  out): a run killed outright (SIGKILL, power loss) leaves one behind, and the next write of the same output removes
  every such temporary whose process is gone (:func:`remove_stale_temporaries`).
* :func:`check_not_input` refuses an output that is one of the command's inputs, or a folder ``--force`` would
  replace that holds one, whatever the flags: specgym never writes over what it reads.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from specgym.errors import SpecgymError

#: The marker file of every output folder specgym creates (JSON: who wrote the folder, the files it owns).
MARKER = ".specgym"
#: The name prefix of every temporary file or folder specgym writes next to an output.
TMP_PREFIX = ".specgym-tmp-"


def _fs_error(path: Path, exc: OSError) -> SpecgymError:
    """A one-line error for a file-system failure (read-only folder, full disk...)."""
    return SpecgymError(f"{exc.filename or path}: cannot write ({exc.strerror or exc})")


def _kind_of(path: Path) -> str | None:
    """``"file"``, ``"dir"``, ``"link"``, ``"special"`` (device, pipe, socket), or None when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise SpecgymError(f"{path}: a parent of this path is a file, not a folder") from None
    except OSError as exc:
        raise SpecgymError(f"{path}: cannot inspect ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "special"


def check_output(path: str | Path, force: bool, kind: str = "dir", option: str = "--out",
                 hint: str | None = None, suffixes: tuple[str, ...] = ()) -> Path:
    """The one output check of every command; returns ``path`` as a :class:`Path`.

    Args:
        path: Where the command will write.
        force: The command's ``--force`` (replace what specgym wrote there before).
        kind: ``"dir"`` (an output folder) or ``"file"``.
        option: The option that named the path, for the message.
        hint: What the "already exists" message (without ``force``) tells the user to do (default: pass --force
            to replace it, for ``--out``; for another option, that ``--force`` covers ``--out`` only).
        suffixes: The file name endings the command's format has (``(".json",)``): a file named otherwise (Parquet
            into ``plain.txt``, JSON over a ``.jsonl``) is refused, never written silently.

    Raises:
        SpecgymError: ``.``/``..``; anything but a regular file or plain folder (device node, pipe, link); a
            file where a folder is expected or the reverse; an existing output without ``force``; with ``force``,
            a folder specgym did not write or one holding files specgym did not write.
    """
    path = Path(path)
    if path.name in ("", ".", "..") or str(path) in ("", "/"):
        raise SpecgymError(f"{option} {str(path)!r}: name a new {'folder' if kind == 'dir' else 'file'}, not "
                           f"'.', '..' or the root")
    if kind == "file" and suffixes and path.suffix.lower() not in suffixes:
        raise SpecgymError(f"{option} {path}: this command writes {' or '.join(suffixes)} files: name one ending "
                           f"{' or '.join(suffixes)}")
    found = _kind_of(path)
    what = "folder" if kind == "dir" else "file"
    for parent in path.parents:
        if _kind_of(parent) in ("file", "special"):
            raise SpecgymError(f"{option} {path}: {parent} is not a folder")
    if found is None:
        return path
    if found in ("link", "special"):
        kind_name = "a symbolic link" if found == "link" else "not a regular file or folder (a device, pipe or socket)"
        raise SpecgymError(f"{option} {path}: {kind_name}; refusing to write there")
    if found != kind:
        raise SpecgymError(f"{option} {path}: is a {'folder' if found == 'dir' else 'file'}, expected a {what}")
    if not force:
        if option != "--out":
            hint = hint or "--force covers --out only: remove it or name another file"
            raise SpecgymError(f"{option} {path}: already exists ({hint})")
        raise SpecgymError(f"{path}: already exists ({hint or 'pass --force to replace it'})")
    if kind == "dir":
        foreign = foreign_entry(path)
        if foreign is not None:
            raise SpecgymError(f"{option} {path}: --force replaces only what specgym wrote, and {foreign} is not "
                               f"(move it away or pick another {option})")
    return path


def foreign_entry(folder: Path) -> str | None:
    """The first path in ``folder`` that specgym did not write (None when specgym owns all of it).

    A folder without :data:`MARKER` is foreign as a whole; a subfolder with its own marker is judged by its own.
    """
    marker = folder / MARKER
    try:
        patterns = list(json.loads(marker.read_text()).get("files", []))
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return f"{folder} (no {MARKER} marker: not a folder specgym created)"
    patterns += [MARKER, f"{TMP_PREFIX}*", ".*.tmp", ".*.tmp/*"]  # the marker, temporaries of an interrupted write
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        for d in list(dirnames):
            sub = base / d
            rel = sub.relative_to(folder).as_posix()
            if os.path.islink(sub):
                return str(sub)
            if (sub / MARKER).exists():
                dirnames.remove(d)
                inner = foreign_entry(sub)
                if inner is not None:
                    return inner
            elif not any(fnmatch.fnmatch(rel + "/", p) or fnmatch.fnmatch(rel, p) or p.startswith(rel + "/")
                         for p in patterns):
                return str(sub)
        for f in filenames:
            rel = (base / f).relative_to(folder).as_posix()
            if _kind_of(base / f) != "file" or not any(fnmatch.fnmatch(rel, p) for p in patterns):
                return str(base / f)
    return None


def write_marker(folder: Path, owner: str, files: Iterable[str] | None = None) -> None:
    """Write :data:`MARKER` into ``folder``: ``owner`` wrote it and owns ``files`` (default: all it holds now)."""
    if files is None:
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                       if p.is_file() and p.name != MARKER)
    doc = {"written_by": owner, "files": list(files),
           "note": "specgym --force replaces this folder only if it holds nothing but these files"}
    (folder / MARKER).write_text(json.dumps(doc, indent=1) + "\n")


def remove_owned(folder: Path, option: str = "--out") -> None:
    """Delete a folder specgym owns entirely (checked again here); anything foreign is refused, nothing deleted."""
    foreign = foreign_entry(folder)
    if foreign is not None:
        raise SpecgymError(f"{option} {folder}: --force replaces only what specgym wrote, and {foreign} is not")
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        raise _fs_error(folder, exc) from None


def make_owned_dir(path: Path, owner: str, files: Iterable[str]) -> None:
    """Create a new output folder exclusively (a racing run refuses) and mark it as specgym's."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except FileExistsError:
        raise SpecgymError(f"{path}: created by another process meanwhile; not touched") from None
    except OSError as exc:
        raise _fs_error(path, exc) from None
    try:
        write_marker(path, owner, files)
    except OSError as exc:
        raise _fs_error(path, exc) from None


def check_not_input(out: str | Path, inputs: Iterable[str | Path], option: str = "--out",
                    replaces_folder: bool = False) -> None:
    """Refuse an output that is one of the command's inputs, whatever the flags (``--force`` included).

    Args:
        out: Where the command will write.
        inputs: The files and folders the command reads (paths that do not exist are skipped).
        option: The option that named ``out``, for the message.
        replaces_folder: ``out`` is a folder the command would replace as a whole (``--force``): an input inside it
            would be deleted with it, so that is refused too.

    Raises:
        SpecgymError: One line naming the output and the input; it never suggests ``--force``.
    """
    out = Path(out)
    if _kind_of(out) is None:
        return
    for inp in inputs:
        inp = Path(inp)
        if _kind_of(inp) is None:
            continue
        if _same(out, inp):
            raise SpecgymError(f"{option} {out}: is an input of this command ({inp}); specgym never writes over its "
                               f"input, whatever the flags: name another output")
        if replaces_folder and _kind_of(out) == "dir" and _inside(inp, out):
            raise SpecgymError(f"{option} {out}: holds an input of this command ({inp}), which replacing the folder "
                               f"would delete: name another output")


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _inside(inner: Path, folder: Path) -> bool:
    try:
        return inner.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def _tmp_prefix(path: Path) -> str:
    """``.specgym-tmp-<name>.<pid>.``: the name a re-run recognises (and the pid it checks is gone)."""
    return f"{TMP_PREFIX}{path.name}.{os.getpid()}."


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporaries a killed run left next to ``path`` (its own name, a process that is gone).

    A temporary of a run still writing (its pid alive) is left alone. Returns what was removed.
    """
    path = Path(path)
    removed: list[Path] = []
    try:
        candidates = list(path.parent.glob(f"{TMP_PREFIX}*"))
    except OSError:
        return removed
    for tmp in candidates:
        rest = tmp.name[len(TMP_PREFIX):]
        for suffix in (".tmp", ".old"):
            rest = rest.removesuffix(suffix)
        parts = rest.rsplit(".", 2)  # name, pid, random
        if len(parts) != 3 or parts[0] != path.name or not parts[1].isdigit() or _alive(int(parts[1])):
            continue
        try:
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp)
            else:
                tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass  # not ours to fight over: the write itself reports a real problem
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or no way to tell): leave its files alone
    return True


@contextmanager
def atomic_path(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it onto ``path`` only if the block succeeds.

    A new ``path`` is created exclusively: if another process created it meanwhile, this one refuses. Temporaries a
    killed earlier write of ``path`` left are removed first.
    """
    path = Path(path)
    check_output(path, overwrite, "file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _fs_error(path, exc) from None
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp creates 0600; give the final file normal permissions
    try:
        yield tmp_path
        if overwrite and _kind_of(path) == "file":
            os.replace(tmp_path, path)
        else:
            _link_exclusive(tmp_path, path)  # fails if anything appeared at path meanwhile
    except OSError as exc:
        raise _fs_error(path, exc) from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextmanager
def atomic_paths(paths: Sequence[Path], overwrite: bool = False) -> Iterator[list[Path]]:
    """:func:`atomic_path` for several outputs of one command: a temporary for each, and every one moves into place
    only if the block succeeds (a failure or an interrupt leaves none of them)."""
    with ExitStack() as stack:
        yield [stack.enter_context(atomic_path(p, overwrite=overwrite)) for p in paths]


def _link_exclusive(tmp_path: Path, path: Path) -> None:
    """Put ``tmp_path`` at ``path`` only if nothing is there (a hard link; a claimed empty file where links fail)."""
    try:
        os.link(tmp_path, path)
        return
    except FileExistsError:
        raise SpecgymError(f"{path}: created by another process meanwhile; not replaced") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except FileExistsError:
        raise SpecgymError(f"{path}: created by another process meanwhile; not replaced") from None
    os.replace(tmp_path, path)


def atomic_write_text(path: Path, text: str, overwrite: bool = False) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_text(text)
    return path


def atomic_write_bytes(path: Path, data: bytes, overwrite: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_bytes(data)
    return path


@contextmanager
def atomic_dir(path: str | Path, overwrite: bool = False, owner: str = "specgym",
               also_owns: Iterable[str] = ()) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; it replaces ``path`` only if the block succeeds.

    The folder gets :data:`MARKER` listing every file the block wrote (plus ``also_owns``, files written into it
    later). An existing ``path`` is refused unless ``overwrite``, and even then only if specgym owns all of it
    (:func:`check_output`); it is swapped out only after the new contents are complete, so a failure leaves the old
    folder untouched. A new ``path`` is created exclusively: a run that loses a race for it refuses.
    """
    path = Path(path)
    check_output(path, overwrite, "dir")
    existing = os.lstat(path) if _kind_of(path) is not None else None  # the folder --force may replace
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent))
    except OSError as exc:
        raise _fs_error(path, exc) from None
    try:
        yield tmp
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file() and p.name != MARKER)
        write_marker(tmp, owner, [*files, *also_owns])
        os.chmod(tmp, 0o777 & ~_umask())
        if existing is None:
            _rename_exclusive(tmp, path)
        else:
            check_output(path, overwrite, "dir")  # still specgym's, still nothing foreign in it
            old = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path), suffix=".old", dir=path.parent))
            os.replace(path, old)  # onto the fresh empty folder: never anyone else's
            moved = os.lstat(old)
            if (moved.st_ino, moved.st_dev) != (existing.st_ino, existing.st_dev):  # another run replaced it
                os.replace(old, path)
                raise SpecgymError(f"{path}: replaced by another process meanwhile; not touched")
            _rename_exclusive(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise _fs_error(path, exc) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _rename_exclusive(tmp: Path, path: Path) -> None:
    """Rename the folder ``tmp`` to ``path`` unless something appeared there (another run's non-empty output)."""
    if _kind_of(path) is not None:
        raise SpecgymError(f"{path}: created by another process meanwhile; not replaced")
    try:
        os.rename(tmp, path)  # onto an existing folder only if it is empty; another run's output never is
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise SpecgymError(f"{path}: created by another process meanwhile; not replaced") from None
        raise


def read_text(path: str | Path, what: str = "file") -> str:
    """A UTF-8 text file's contents; a folder, non-UTF-8 bytes or an unreadable file is a one-line error."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecgymError(f"{path}: not UTF-8 text (byte {exc.start}); a {what} must be UTF-8") from None
    except IsADirectoryError:
        raise SpecgymError(f"{path}: is a folder, expected a {what}") from None
    except OSError as exc:
        raise SpecgymError(f"{path}: cannot read ({exc.strerror or exc})") from None


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask

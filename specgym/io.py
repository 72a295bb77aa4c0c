"""Atomic file output: write to a temporary file in the same folder, then rename.

A crash or a bad input never leaves a partial file behind, and nothing the user made is overwritten silently.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Iterator

from specgym.errors import SpecgymError


def refuse_overwrite(path: Path, overwrite: bool) -> None:
    """Raise if ``path`` exists and ``overwrite`` is False."""
    if path.exists() and not overwrite:
        raise SpecgymError(f"{path}: already exists (pass --force to overwrite)")


@contextmanager
def atomic_path(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    refuse_overwrite(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp creates 0600; give the final file normal permissions
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


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
def atomic_dir(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; it replaces ``path`` only if the block succeeds.

    An existing ``path`` is refused unless ``overwrite``; with ``overwrite`` it is swapped out only after the new
    contents are complete, so a failure leaves the old folder untouched.
    """
    import shutil

    path = Path(path)
    refuse_overwrite(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask

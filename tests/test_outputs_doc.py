"""docs/guides/outputs-and-errors.md ("What specgym refuses and why") stays true: every test it names exists, and the
names and limits it states are the code's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from specgym.envs.workloads.specdecode import MAX_OVERRUN
from specgym.io import TMP_PREFIX

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guides" / "outputs-and-errors.md"


def _test_names(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_every_test_the_page_names_exists():
    refs = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", PAGE.read_text())
    assert len(refs) >= 8, refs
    for file, name in refs:
        assert (ROOT / file).is_file(), file
        if name:
            assert name in _test_names(ROOT / file), f"{file}::{name}"


def test_the_page_states_the_codes_names_and_limits():
    text = " ".join(PAGE.read_text().split())
    assert f"`{TMP_PREFIX}<output name>.<pid>.<random>.tmp`" in text
    assert f"more than {MAX_OVERRUN} tokens past the request's end" in text
    assert "exits with status 130" in text and "exits with status 2" in text

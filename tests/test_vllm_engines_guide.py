"""``docs/guides/engines.md``: the table of what each engine shows a policy names every controller input and cites a
source file in every cell; every cited file is listed under Sources with its version (an installed one exists, a
repository one has a commit); the controller table names only real specs and every spec family specgym has; the guide
is in the site's navigation and linked from the deploying guide."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "engines.md"
INPUTS = {"draft confidence", "entropy", "hidden sketch", "lookup length", "position", "accepted counts",
          "batch size"}
ENGINES = ("vLLM", "SGLang", "TensorRT-LLM", "transformers")
CITE = re.compile(r"\[`([\w./-]+\.py)`\]")


def _tables(text: str) -> list[list[list[str]]]:
    """Every markdown table: rows of cells (the separator row dropped)."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|[-:| ]+\|", line.strip()):  # not the separator row
                rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _sources(text: str) -> str:
    return text.split("## Sources", 1)[1]


def test_the_engine_table_names_every_input_and_cites_a_file_per_cell():
    text = GUIDE.read_text()
    header, *rows = _tables(text)[0]
    assert header[0] == "input" and [any(h.startswith(e) for h in header[1:]) for e in ENGINES] == [True] * 4
    assert {r[0] for r in rows} == INPUTS and len(rows) == len(INPUTS)
    for r in rows:
        assert len(r) == 5, r
        for engine, cell in zip(ENGINES, r[1:]):
            cited = CITE.findall(cell)
            assert len(cited) == 1, f"{r[0]} / {engine}: expected one [`file.py`] citation in {cell!r}"
            assert cell.split(":")[0].split(" ")[0] in ("given", "not", "derivable"), (r[0], engine, cell)


def test_every_cited_file_is_listed_with_its_version_and_exists_where_installed():
    text = GUIDE.read_text()
    sources = _sources(text)
    cited = {f for row in _tables(text)[0][1:] for cell in row[1:] for f in CITE.findall(cell)}
    assert len(cited) >= 8
    for f in cited:
        assert f"`{f}`" in sources, f"{f} is cited but not listed under Sources"
        bullet = next(b for b in sources.split("\n- ") if f"`{f}`" in b)
        installed = "installed" in bullet
        commit = re.search(r"`[0-9a-f]{40}`", bullet)
        assert installed or commit, f"{f}: its Sources entry names neither an installed version nor a commit"
    import transformers

    tf = Path(transformers.__file__).parent
    for f in (f for f in cited if f.startswith("transformers/")):
        assert (tf.parent / f).is_file(), f"{f} is not in the installed transformers {transformers.__version__}"
    assert transformers.__version__ in _tables(text)[0][0][4]  # the column names the installed version
    vllm = ROOT / ".venv-vllm" / "lib" / "python3.11" / "site-packages"
    if not (vllm / "vllm").is_dir():
        pytest.skip("no vLLM environment here to check the vLLM files against")
    for f in (f for f in cited if f.startswith("vllm/")):
        assert (vllm / f).is_file(), f"{f} is not in the installed vLLM"
    version = (vllm / "vllm" / "_version.py").read_text()
    assert re.search(r"__version__ = version = '([\d.]+)'", version).group(1) in _tables(text)[0][0][1]


def test_the_controller_table_names_real_specs_and_every_family():
    from specgym.agents.specs import TABLE

    text = GUIDE.read_text()
    header, *rows = _tables(text)[1]
    assert header[1:] == list(ENGINES)
    named = set()
    for r in rows:
        for token in re.findall(r"`([^`]+)`", r[0]):
            base = re.split(r"[:@…]", token)[0]
            if base.endswith("*"):
                assert any(name.startswith(base[:-1]) for _, name in TABLE), token
                named |= {name for _, name in TABLE if name.startswith(base[:-1])}
            else:
                assert any(name == base for _, name in TABLE), f"{token}: no such spec"
                named.add(base)
        assert all(c.split(":")[0].split(" ")[0] in ("yes", "no", "possible", "tables") for c in r[1:]), r
    missing = {name for _, name in TABLE if name != "@"} - named
    assert not missing, f"specs the guide does not place in any engine: {sorted(missing)}"


def test_the_guide_is_in_the_navigation_and_linked_from_deploying():
    assert "guides/engines.md" in (ROOT / "mkdocs.yml").read_text()
    assert "(engines.md)" in (ROOT / "docs" / "guides" / "deploying.md").read_text()

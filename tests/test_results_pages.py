"""The results pages publish what their committed JSON holds: every table of docs/results/*.md is written from a file
in docs/results/data/ (docs/results/scripts/render.py), every file names its command, machine, date and provenance,
and a replay table's rows are exactly what the command output stored beside them gives
(docs/results/scripts/replays.py). Nothing here runs a benchmark."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
SCRIPTS = RESULTS / "scripts"
PAGES = sorted(p for p in RESULTS.glob("*.md") if p.name != "index.md")
DATA = sorted((RESULTS / "data").glob("*.json"))


def load(name: str) -> ModuleType:
    """A docs script as a module (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"results_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render = load("render")


def test_every_marked_table_equals_its_json():
    blocks = render.blocks()
    assert len(blocks) >= 30, f"only {len(blocks)} marked tables on the results pages"
    drifted = [f"{b.page.name}: {b.path}" for b in blocks if b.drifted]
    assert not drifted, f"tables that differ from their JSON (python docs/results/scripts/render.py): {drifted}"


def test_every_table_on_a_page_is_written_from_a_json():
    """No table outside the markers: a figure in a table is always a figure of a committed file."""
    for page in PAGES:
        text = render.BLOCK.sub("", page.read_text())
        loose = [line for line in text.splitlines() if line.startswith("|")]
        assert not loose, f"{page.name}: a table outside <!-- table: --> markers: {loose[0][:80]}"


def test_every_json_is_published_once_and_carries_its_source():
    used = [(b.page.resolve().parent / b.path).resolve() for b in render.blocks()]
    assert DATA, "no table JSON in docs/results/data"
    for path in DATA:
        table = render.load_table(path)  # raises on a missing source field, date or provenance
        for field in ("command", "machine", "date", "provenance"):
            assert table["source"][field].strip(), f"{path.name}: empty source.{field}"
        assert used.count(path.resolve()) == 1, f"{path.name} is published {used.count(path.resolve())} times"


def test_every_page_names_machine_command_date_and_where_earlier_tables_are():
    for page in PAGES:
        head = page.read_text().split("![", 1)[0]
        assert re.search(r"^\*\*Command\*\*: ", head, re.M), f"{page.name}: no **Command** line in its header"
        assert re.search(r"^\*\*Machine\*\*: ", head, re.M), f"{page.name}: no **Machine** line in its header"
        assert re.search(r"^\*\*Date\*\*: \d{4}-\d\d-\d\d", head, re.M), f"{page.name}: no **Date** YYYY-MM-DD"
        assert f"earlier tables: `git log -p docs/results/{page.name}`" in head, f"{page.name}: no pointer to git"
        if any(render.load_table(RESULTS / b.path)["source"].get("test_split") for b in render.blocks([page])):
            assert re.search(r"^\*\*Test split\*\*: ", head, re.M), f"{page.name}: no **Test split** line"


def test_machine_output_rows_are_what_the_stored_output_gives():
    replays = load("replays")
    recipes = {r.name: r for r in replays.RECIPES}
    machine = [p for p in DATA if render.load_table(p)["source"]["provenance"] == render.MACHINE]
    assert len(machine) >= 8
    for path in machine:
        table = render.load_table(path)
        assert path.stem in recipes, f"{path.name}: machine output with no recipe in replays.py"
        built = recipes[path.stem].table(table["output"])
        for key in ("columns", "rows", "plot"):
            assert built.get(key) == table.get(key), f"{path.name}: stored {key} differ from the stored output's"
        assert table["source"]["command"] == " && ".join(recipes[path.stem].commands)


def test_the_check_fails_when_a_figure_on_a_page_is_edited(tmp_path):
    shutil.copytree(RESULTS, tmp_path / "results", ignore=shutil.ignore_patterns("scripts", "__pycache__"))
    page = tmp_path / "results" / "live-smollm2.md"
    check = [sys.executable, str(SCRIPTS / "render.py"), "--check", str(page)]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0

    text = page.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| **drafter-marginal**"))
    edited = row.replace("2.180x", "2.190x")
    assert edited != row
    page.write_text(text.replace(row, edited))
    r = subprocess.run(check, capture_output=True, text=True)
    assert r.returncode == 1
    assert "live-smollm2.md" in r.stderr and "data/live-smollm2-greedy.json" in r.stderr

    assert subprocess.run([sys.executable, str(SCRIPTS / "render.py"), str(page)]).returncode == 0
    assert page.read_text() == text  # rewriting from the JSON restores the published figure


def test_the_check_fails_when_a_figure_in_a_json_is_edited(tmp_path):
    shutil.copytree(RESULTS, tmp_path / "results", ignore=shutil.ignore_patterns("scripts", "__pycache__"))
    path = tmp_path / "results" / "data" / "trees.json"
    table = json.loads(path.read_text())
    table["rows"][1]["tok_s"] += 1.0
    path.write_text(json.dumps(table))
    blocks = render.blocks([tmp_path / "results" / "trees.md"])
    assert [b.drifted for b in blocks if b.path.endswith("/trees.json")] == [True]
    assert not any(b.drifted for b in blocks if not b.path.endswith("/trees.json"))  # the page's other tables


@pytest.mark.parametrize("field", ["command", "machine", "date", "provenance"])
def test_a_json_without_a_source_field_is_refused(tmp_path, field):
    table = json.loads((RESULTS / "data" / "guard.json").read_text())
    del table["source"][field]
    path = tmp_path / "guard.json"
    path.write_text(json.dumps(table))
    with pytest.raises(render.TableError, match=rf"source\.{field}"):
        render.load_table(path)


def test_cells_render_through_their_formats():
    table = {"columns": [{"key": "c", "header": "controller"},
                         {"key": "r", "header": "vs best", "align": "right", "format": "{:.3f}x [{:.3f}, {:.3f}]"},
                         {"key": "n", "header": "n", "align": "center", "format": "{:,}"}],
             "rows": [{"c": "a", "r": [1.2964, 1.174, 1.4381], "n": 2938, "_bold": ["c"]},
                      {"c": "b", "r": {"format": "{:.3f}x", "values": [1.0]}, "n": None}]}
    assert render.render_table(table, "t") == ("| controller | vs best | n |\n|---|---:|:---:|\n"
                                                "| **a** | 1.296x [1.174, 1.438] | 2,938 |\n| b | 1.000x |  |")
    with pytest.raises(render.TableError, match="rows\\[0\\] has keys no column names"):
        render.render_table({"columns": table["columns"], "rows": [{"c": "a", "x": 1}]}, "t")

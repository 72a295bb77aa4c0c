"""Write the results pages' tables from the JSON committed beside them (``docs/results/data/*.json``).

    python docs/results/scripts/render.py           # rewrite every marked table from its JSON
    python docs/results/scripts/render.py --check   # exit 1, naming each table whose page differs from its JSON

A page marks each table it publishes::

    <!-- table: data/NAME.json -->
    ...
    <!-- /table -->

Everything between the markers is written from ``data/NAME.json``: the ``<!-- plot: COLUMN -->`` line that
``docs/gen_figures.py`` draws the page's plot from (when the JSON names a ``plot`` column), the markdown table, and one
line naming the table's command, machine, date and provenance. So a figure on a page is the figure in its JSON, and
``tests/test_results_pages.py`` checks that it stays so.

A table's JSON::

    {"source": {"command": "...", "machine": "...", "date": "YYYY-MM-DD",
                "provenance": "machine output" | "transcribed from the published table (machine output not kept)",
                "test_split": "(optional) which test split, and how many times it was measured",
                "note": "(optional) one line on what else the figures rest on"},
     "plot": "(optional) the header of the column the page's plot draws",
     "columns": [{"key": "tok_s", "header": "live tok/s", "align": "right", "format": "{:.1f}"}, ...],
     "rows": [{"controller": "drafter-marginal", "tok_s": 37.5, "_bold": ["controller", "tok_s"]}, ...],
     "output": "(optional, machine output only) the command's own output, trimmed to what the table shows"}

A cell is written from its value: a string as it is (markdown allowed), ``null`` as an empty cell, a number or a list
of numbers through its column's ``format`` (``str.format``: ``"{:.3f}x"``; ``"{:.3f}x [{:.3f}, {:.3f}]"`` for a
ratio and its 95% interval, the list's items named by the column's ``fields``), and ``{"format": ..., "values":
[...]}`` through its own format. A row's ``_bold`` lists the cells written in bold. ``align`` is ``left`` (the
default), ``right`` or ``center``.

Part of the docs, not of the installed package.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent
DATA = RESULTS / "data"
MACHINE = "machine output"
TRANSCRIBED = "transcribed from the published table (machine output not kept)"
PROVENANCES = (MACHINE, TRANSCRIBED)
SOURCE_FIELDS = ("command", "machine", "date", "provenance")
BLOCK = re.compile(r"<!-- table: (?P<path>\S+) -->(?P<body>.*?)<!-- /table -->", re.S)
RULE = {"left": "---", "right": "---:", "center": ":---:"}


class TableError(ValueError):
    """A table JSON or a page's table block that cannot be rendered; the message names the file and the field."""


@dataclass
class Block:
    """One marked table of a page: the JSON it names, what the page holds now, and what the JSON renders to."""

    page: Path
    path: str
    current: str
    rendered: str

    @property
    def drifted(self) -> bool:
        """Whether the page's block differs from its JSON's rendering."""
        return self.current != self.rendered


def shown(path: Path) -> str:
    """A path as messages name it: relative to docs/ where it lies there."""
    path = path.resolve()
    return str(path.relative_to(RESULTS.parent)) if path.is_relative_to(RESULTS.parent) else str(path)


def load_table(path: Path) -> dict[str, Any]:
    """A table JSON, checked for the fields every published table carries."""
    name = shown(path)
    try:
        table = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TableError(f"{name}: cannot read the table JSON ({e})") from e
    source = table.get("source")
    if not isinstance(source, dict):
        raise TableError(f"{name}: no 'source' object")
    for field in SOURCE_FIELDS:
        if not isinstance(source.get(field), str) or not source[field].strip():
            raise TableError(f"{name}: source.{field} is missing or empty")
    if not re.fullmatch(r"\d{4}-\d\d-\d\d", source["date"]):
        raise TableError(f"{name}: source.date = {source['date']!r} is not YYYY-MM-DD")
    if source["provenance"] not in PROVENANCES:
        raise TableError(f"{name}: source.provenance = {source['provenance']!r} is not one of {PROVENANCES}")
    if source["provenance"] == MACHINE and "output" not in table:
        raise TableError(f"{name}: provenance is machine output but the file holds no 'output'")
    columns = table.get("columns")
    if not isinstance(columns, list) or not columns or not all("key" in c and "header" in c for c in columns):
        raise TableError(f"{name}: 'columns' must be a non-empty list of objects with 'key' and 'header'")
    if not isinstance(table.get("rows"), list) or not table["rows"]:
        raise TableError(f"{name}: 'rows' must be a non-empty list")
    return table


def dump_table(table: dict[str, Any]) -> str:
    """A table JSON as committed: one column and one row per line, so a changed figure is a one-line diff."""
    def one(v: Any) -> str:
        """One value on one line."""
        return json.dumps(v, ensure_ascii=False)

    parts = []
    for key, value in table.items():
        if key in ("columns", "rows"):
            items = ",\n".join(f"  {one(v)}" for v in value)
            parts.append(f" {one(key)}: [\n{items}\n ]")
        else:
            body = json.dumps(value, ensure_ascii=False, indent=1).replace("\n", "\n ")
            parts.append(f" {one(key)}: {body}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def cell_text(value: Any, column: dict[str, Any], where: str) -> str:
    """One cell as markdown (see the module docstring for the value kinds)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        fmt, values = value.get("format"), value.get("values")
        if not isinstance(fmt, str) or not isinstance(values, list):
            raise TableError(f"{where}: a cell object needs 'format' (a string) and 'values' (a list)")
        return fmt.format(*values)
    fmt = column.get("format", "{}")
    try:
        return fmt.format(*value) if isinstance(value, list) else fmt.format(value)
    except (IndexError, ValueError, TypeError) as e:
        raise TableError(f"{where}: {value!r} does not fit the column format {fmt!r} ({e})") from e


def render_table(table: dict[str, Any], name: str) -> str:
    """The markdown table of a table JSON (header, rule, one line per row)."""
    columns = table["columns"]
    lines = ["| " + " | ".join(c["header"] for c in columns) + " |",
             "|" + "|".join(RULE[c.get("align", "left")] for c in columns) + "|"]
    for i, row in enumerate(table["rows"]):
        unknown = set(row) - {c["key"] for c in columns} - {"_bold"}
        if unknown:
            raise TableError(f"{name}: rows[{i}] has keys no column names: {sorted(unknown)}")
        bold = set(row.get("_bold", []))
        cells = []
        for c in columns:
            text = cell_text(row.get(c["key"]), c, f"{name}: rows[{i}].{c['key']}")
            cells.append(f"**{text}**" if c["key"] in bold and text else text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def source_line(table: dict[str, Any], rel: str) -> str:
    """The line under a table naming how it was made (it starts with **Command**, as a page's header does)."""
    s = table["source"]
    parts = [f"machine: {s['machine']}", f"date: {s['date']}", f"provenance: {s['provenance']}"]
    parts += [f"test split: {s['test_split']}"] if s.get("test_split") else []
    parts += [s["note"]] if s.get("note") else []
    return f"**Command** (this table): `{s['command']}`; " + "; ".join(parts) + f" ([data]({rel}))"


def render_block(rel: str, page: Path) -> str:
    """The text between a page's ``<!-- table: REL -->`` and ``<!-- /table -->`` markers."""
    path = (page.parent / rel).resolve()
    name = f"{shown(page)} -> {rel}"
    if not path.is_file():
        raise TableError(f"{name}: no such table JSON")
    table = load_table(path)
    plot = table.get("plot")
    if plot is not None and plot not in [c["header"] for c in table["columns"]]:
        raise TableError(f"{rel}: plot = {plot!r} is not a column header")
    head = f"\n\n<!-- plot: {plot} -->\n" if plot else "\n\n"
    return head + render_table(table, rel) + "\n\n" + source_line(table, rel) + "\n\n"


def blocks(pages: list[Path] | None = None) -> list[Block]:
    """Every marked table of the results pages (or of ``pages``), with its current and rendered text."""
    found = []
    for page in pages if pages is not None else sorted(RESULTS.glob("*.md")):
        for m in BLOCK.finditer(page.read_text()):
            found.append(Block(page, m.group("path"), m.group("body"), render_block(m.group("path"), page)))
    return found


def rewrite(page: Path) -> bool:
    """Rewrite a page's marked tables from their JSON; whether the page changed."""
    text = page.read_text()
    new = BLOCK.sub(lambda m: f"<!-- table: {m.group('path')} -->{render_block(m.group('path'), page)}"
                              "<!-- /table -->", text)
    if new != text:
        page.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    """Rewrites (or, with --check, checks) the marked tables of the named pages, or of every results page."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 listing every drifted table")
    parser.add_argument("pages", nargs="*", type=Path, help="pages to render (default: every results page)")
    args = parser.parse_args(argv)
    pages = [p.resolve() for p in args.pages] or sorted(RESULTS.glob("*.md"))
    try:
        if args.check:
            drift = [b for b in blocks(pages) if b.drifted]
            for b in drift:
                print(f"{shown(b.page)}: the table of {b.path} differs from its JSON "
                      f"(python docs/results/scripts/render.py rewrites it)", file=sys.stderr)
            return 1 if drift else 0
        for page in pages:
            if rewrite(page):
                print(f"rewrote {shown(page)}")
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

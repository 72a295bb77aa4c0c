"""The documentation cannot drift: generated pages equal what the code gives, the site builds strictly (a broken
link or anchor is a warning, and a warning fails), the README stays short, and every results page says how its
figures were made."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent


def test_generated_pages_are_current():
    r = subprocess.run([sys.executable, str(DOCS / "gen_ref.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr  # names the stale pages and the command that regenerates them


def test_cli_reference_has_a_page_per_subcommand():
    from specgym.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in sub.choices:
        assert (DOCS / "reference" / "cli" / f"{name}.md").is_file(), f"no CLI page for {name}: run docs/gen_ref.py"
        assert f"reference/cli/{name}.md" in nav, f"mkdocs.yml's nav lacks reference/cli/{name}.md"


def test_site_builds_strictly_without_warnings(tmp_path):
    assert (BIN / "mkdocs").is_file(), "the docs extra is not installed: make install (pip install -e '.[docs]')"
    r = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert not re.search(r"^(WARNING|ERROR)", log, re.M), log[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()


def test_readme_is_short_and_links_into_the_site():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 12 * 1024
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 15
    for link in links:
        assert (ROOT / link).is_file(), f"README links to a missing {link}"
    table = [line for line in text.splitlines() if line.startswith("| ") and "](docs/" in line]
    assert 1 < len(table) <= 16, "one results table of at most ~15 headline rows"


def test_every_results_page_names_command_machine_date_and_plot():
    for page in sorted((DOCS / "results").glob("*.md")):
        if page.name == "index.md":
            continue
        head = page.read_text()
        assert re.search(r"\*\*Command", head), f"{page.name}: no **Command**"
        assert re.search(r"\*\*Machine", head), f"{page.name}: no **Machine**"
        assert re.search(r"\*\*Date\*\*:? *\d{4}-\d\d-\d\d", head), f"{page.name}: no **Date** YYYY-MM-DD"
        plot = f"../assets/results/{page.stem}.png"
        assert plot in head and (DOCS / "assets" / "results" / f"{page.stem}.png").is_file(), \
            f"{page.name}: no plot {plot} (draw with .venv/bin/python docs/gen_figures.py)"


def test_no_reference_to_the_removed_semantics_page():
    assert not (DOCS / "semantics.md").exists()
    hits = []
    for folder in ("specgym", "envs", "agents", "baselines", "training", "eval", "tests", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".yaml") and path.name != "test_docs.py":
                if "semantics.md" in path.read_text(errors="replace"):
                    hits.append(str(path.relative_to(ROOT)))
    assert not hits, hits


def test_no_passage_is_written_on_two_pages():
    """One home per topic: no run of 20 words of prose (tables, code blocks and each results page's command /
    machine / date header aside) appears on two pages of the site."""
    homes: dict[str, str] = {}
    clashes = set()
    for page in sorted(DOCS.rglob("*.md")):
        rel = str(page.relative_to(DOCS))
        if rel.startswith(("_generated", "reference/cli")):
            continue
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        text = "\n".join(line for line in text.splitlines()
                         if not line.startswith(("|", "**Command**", "**Machine**", "**Date**", "![")))
        words = re.findall(r"\w+", text.lower())
        for i in range(len(words) - 20):
            shingle = " ".join(words[i:i + 20])
            if homes.setdefault(shingle, rel) != rel:
                clashes.add((homes[shingle], rel, shingle))
    assert not clashes, sorted(clashes)[:5]


def test_every_decision_kind_page_opens_with_its_environment_card():
    """Gymnasium's card sections, from each environment's docstring (docs/gen_ref.py), at the top of its page."""
    sections = ("Action Space", "Observation Space", "Rewards", "Starting State", "Episode End", "Arguments",
                "Version History")
    cards = sorted((DOCS / "_generated" / "cards").glob("*.md"))
    assert len(cards) == 7
    for card in cards:
        text = card.read_text()
        missing = [s for s in sections if f"### {s}" not in text]
        assert not missing, f"{card.name} lacks {missing}: add them to the environment's docstring"
    pages = "".join(p.read_text() for p in (DOCS / "kinds").glob("*.md"))
    for card in cards:
        assert f'--8<-- "_generated/cards/{card.name}"' in pages, f"no kind page includes {card.name}"

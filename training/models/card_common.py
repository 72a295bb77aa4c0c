"""What the model cards (``README.md``) of specgym's model builders share: the pair's
(:mod:`~specgym.training.models.pair_card`), the distilled draft's (:mod:`~specgym.training.models.draft_card`) and the
draft head's (:mod:`~specgym.training.models.head_card`).

A card is a list of markdown lines joined by newlines; the helpers here return such lists (a section ends with an
empty line), so a card reads as the sequence of its sections.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The real pair's target, which its drafters derive from (their license follows it).
SMOLLM2 = "SmolLM2-135M-Instruct by HuggingFaceTB (Apache-2.0)"


def fenced(language: str, lines: list[str]) -> list[str]:
    """A fenced code block of ``lines`` in ``language`` (``bash``, ``python``)."""
    return [f"```{language}", *lines, "```"]


def section(title: str, *lines: str) -> list[str]:
    """A ``##`` section: the heading, an empty line, ``lines`` and an empty line."""
    return [f"## {title}", "", *lines, ""]


def rebuild_section(commands: list[str]) -> list[str]:
    """The ``Rebuild`` section: the commands that rebuild the folder, in a bash block."""
    return section("Rebuild", *fenced("bash", commands))


def license_section(target: str, what: str, derived: str, otherwise: str) -> list[str]:
    """The ``License`` section of a drafter trained for ``target``.

    Args:
        target: The target's reference; the shipped ``smollm2`` pair's drafters are derivatives of :data:`SMOLLM2`.
        what: The drafter (``draft``, ``head``).
        derived: What of the target the drafter derives from (ends the sentence after "whose").
        otherwise: For another target, what the drafter takes from it (ends the sentence after ``what``).
    """
    if target == "smollm2":
        return section("License", f"Apache-2.0. The {what} is a derivative of {SMOLLM2}, whose {derived}.")
    return section("License", f"The target's license applies: the {what} {otherwise}.")


def write_card_files(folder: Path, meta: dict[str, Any], card: str) -> None:
    """Write an exported drafter's ``training_state.json`` (``meta``) and its ``README.md`` card into ``folder``."""
    (folder / "training_state.json").write_text(json.dumps(meta, indent=2) + "\n")
    (folder / "README.md").write_text(card, encoding="utf-8")

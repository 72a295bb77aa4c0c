"""Which draft/target pair to load: the one resolver of ``specgym generate``, ``record``, ``profile``, ``bench live``
and :func:`specgym.load_pair`.

A pair is named one of three ways, never two at once: a shipped pair by name (``--pair midpair``), the user's two
models (``--draft`` and ``--target``: folders, ``.gguf`` files or hub names), or neither, where a caller that has a
recording (``bench live``) decodes with the pair the recording names and every other caller with the shipped default
pair (:func:`specgym.paths.default_pair_name`). Everything here is checked before a model loads, and every refusal is
one line naming the option; the models themselves load in
:func:`~specgym.envs.engines.live.model_loading.load_pair`.

A shipped pair whose target a package installs (``smollm2``'s GGUF) keeps the pair's name as its target: that is what
a recording stores, and it resolves to the converted model where it is loaded
(:func:`~specgym.envs.engines.live.model_loading.resolve_model_path`), so the same pair has the same name whichever
command loaded it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import specgym.catalogue as catalogue
from specgym.envs.workloads.workload import Workload
from specgym.errors import SpecgymError
from specgym.paths import DATA_DIR, default_pair_name


@dataclass(frozen=True)
class PairFlags:
    """How a caller spells the three choices in its one-line errors (the CLI's flags by default).

    Attributes:
        pair: The shipped pair's option (``--pair``).
        draft: The user's draft (``--draft``).
        target: The user's target (``--target``).
        caller: Prefix of every message (``specgym.load_pair: ``).
        conflict: The refusal of a pair name given with ``draft``/``target``; formatted with ``caller``, ``pair``,
            ``draft``, ``target``, ``name`` (the pair given) and ``given`` (the models' options given with it).
    """

    pair: str = "--pair"
    draft: str = "--draft"
    target: str = "--target"
    caller: str = ""
    conflict: str = ("{caller}{pair} {name} names both models: give {pair} or {draft}/{target}, not both (got {given} "
                     "too)")


#: The CLI's spelling (``generate``, ``record``, ``profile``, ``bench live``).
CLI_FLAGS = PairFlags()


@dataclass(frozen=True)
class PairPaths:
    """A resolved pair, not loaded yet.

    Attributes:
        draft: The draft: a folder, a ``.gguf`` file or a hub name.
        target: The target: the same, or a shipped pair's name where a package installs its target (``smollm2``).
        name: The pair's name: the shipped pair's, else the target folder's parent (``models/mine/target`` ->
            ``mine``), else the target as given (a hub name).
        shipped: Named by its shipped name or by default, not by the user's two models (a shipped pair has a
            shipped profile and recordings; a user's pair never borrows them, whatever its folder is called).
    """

    draft: str
    target: str
    name: str
    shipped: bool


def check_pair_choice(name: str | None, draft: str | None, target: str | None,
                      flags: PairFlags = CLI_FLAGS) -> None:
    """Refuse, before anything loads, a pair named two ways at once, one model of two, or an unknown shipped name
    (one line listing the shipped pairs)."""
    if name is not None:
        given = [opt for opt, value in ((flags.draft, draft), (flags.target, target)) if value is not None]
        if given:
            raise SpecgymError(flags.conflict.format(caller=flags.caller, pair=flags.pair, draft=flags.draft,
                                                     target=flags.target, name=name, given=" and ".join(given)))
        catalogue.resolve("pair", name)
    if (draft is None) != (target is None):
        raise SpecgymError(f"{flags.caller}give both {flags.draft} and {flags.target}, or neither (a shipped pair by "
                           f"name)")


def resolve_pair(name: str | None = None, draft: str | None = None, target: str | None = None, *,
                 recorded: Workload | None = None, flags: PairFlags = CLI_FLAGS) -> PairPaths:
    """The pair to load (checked as :func:`check_pair_choice` does).

    Args:
        name: A shipped pair's name.
        draft: The user's draft (with ``target``).
        target: The user's target (with ``draft``).
        recorded: The recording the caller decodes: with neither a name nor two models, the pair it was recorded
            from (:func:`recorded_pair`; a recording that names none: the default pair).
        flags: How the caller's messages spell the options.
    """
    check_pair_choice(name, draft, target, flags)
    if draft is not None and target is not None:
        return PairPaths(str(draft), str(target), _name_of(str(target)), shipped=False)
    if name is None and recorded is not None:
        found = recorded_pair(recorded, flags)
        if found is not None:
            return PairPaths(found[0], found[1], _name_of(found[1]), shipped=False)
    name = name or default_pair_name()
    draft_dir, target_path = catalogue.pair_models(name)
    return PairPaths(str(draft_dir), name if catalogue.external_target(name) else str(target_path), name,
                     shipped=True)


def recorded_pair(wl: Workload, flags: PairFlags = CLI_FLAGS) -> tuple[str, str] | None:
    """The draft and target a recorded workload names (shipped models resolved in this install), or ``None`` when it
    names none; named models that are not here raise one line saying how to pass them."""
    src = getattr(wl, "source", None) or {}
    draft, target = src.get("draft_model"), src.get("target_model")
    if not draft or not target:
        return None
    found = []
    for model in (draft, target):
        shipped = DATA_DIR / model
        if (shipped / "config.json").exists():
            found.append(str(shipped))
        elif (Path(model) / "config.json").exists() or catalogue.external_target(model) is not None:
            found.append(str(model))  # a folder, or a shipped pair's package-provided target (smollm2)
        else:
            raise SpecgymError(f"{flags.caller}workload {wl.name} was recorded from draft {draft} and "
                               f"target {target}; {model} is not here: pass the pair with {flags.draft} and "
                               f"{flags.target}")
    return found[0], found[1]


def _name_of(target: str) -> str:
    """A user's pair's name: its target folder's parent, else the target as given."""
    return Path(target).parent.name or target

"""The action menu of a tree policy: what each action index plays, in replay and live.

An entry is a **static shape** (per-depth widths, ``[2, 1, 1]``; ``[]`` plain decoding: exact in replay) or an
**EAGLE-2 round** (``"eagle:D:B:M"``: depth, beam and verified nodes of
:class:`~specgym.baselines.tree_eagle.EagleTree`, chosen from the drafter's confidences, approximate in replay as the
rule is; on a head policy only, which observes no spine features, as an EAGLE-2 round reports none). LTD (arXiv
2603.01639) learns per round the depth and verify budget of EAGLE's expansion; a menu that holds both kinds lets a
policy choose per round between a fixed shape and a confidence-chosen tree, and includes the fitted EAGLE-2 rule's
own round (so the policy can always do what the rule does). ``policy.json``'s ``action_mapping.values`` stores the
entries as written here (a list of widths, or the string); :func:`menu_entry` is the one parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specgym.baselines.tree_eagle import EagleTree
from specgym.envs.core.tree import TreeRoundOutcome, TreeShape
from specgym.errors import SpecgymError

#: The prefix of an EAGLE-2 entry.
EAGLE_ENTRY = "eagle"


@dataclass(frozen=True)
class MenuEntry:
    """One action of a tree policy's menu.

    Attributes:
        shape: The static tree (``None`` for an EAGLE-2 round).
        eagle: ``(depth, beam, budget)`` of an EAGLE-2 round (``None`` for a static tree).
    """

    shape: TreeShape | None = None
    eagle: tuple[int, int, int] | None = None

    @property
    def depth(self) -> int:
        """The deepest tree it can play."""
        return self.shape.depth if self.shape is not None else self.eagle[0]  # type: ignore[index]

    @property
    def approximate(self) -> bool:
        """True where its replayed outcome is modelled (an EAGLE-2 round)."""
        return self.eagle is not None

    @property
    def label(self) -> str:
        """How ``policy.json`` and a card write it: the widths joined by ``-`` (``plain``), or ``eagle:D:B:M``."""
        if self.eagle is not None:
            return f"{EAGLE_ENTRY}:{':'.join(map(str, self.eagle))}"
        assert self.shape is not None
        return self.shape.name if self.shape.nodes else "plain"

    def as_json(self) -> list[int] | str:
        """The entry as ``action_mapping.values`` stores it."""
        if self.eagle is not None:
            return self.label
        assert self.shape is not None
        return [int(w) for w in _widths(self.shape)]

    def play(self, req: Any) -> TreeRoundOutcome:
        """One replayed round (a :class:`~specgym.envs.engines.replay.tree_engine.TreeReplayRequest`)."""
        if self.eagle is not None:
            return EagleTree(*self.eagle).play(req)
        return req.play(self.shape)

    def play_live(self, req: Any, stats: bool = False) -> TreeRoundOutcome:
        """One live round (a :class:`~specgym.envs.engines.live.tree.LiveTreeRequest`); ``stats``: the spine's
        confidence and entropy of a static tree (an EAGLE-2 round reports none)."""
        if self.eagle is not None:
            return req.play_eagle(*self.eagle)
        return req.play_tree(self.shape, stats=stats)


def menu_entry(entry: Any, k_max: int, where: str = "tree menu") -> MenuEntry:
    """Parse one menu entry (a list of widths or ``"eagle:D:B:M"``); one line naming ``where`` and the entry if bad."""
    if isinstance(entry, str):
        head, _, rest = entry.partition(":")
        parts = rest.split(":")
        if head != EAGLE_ENTRY or len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise SpecgymError(f"{where}: entry {entry!r} is neither a list of widths nor 'eagle:DEPTH:BEAM:M'")
        depth, beam, budget = (int(p) for p in parts)
        if not (1 <= depth <= k_max and 1 <= beam <= 8 and budget >= 1):
            raise SpecgymError(f"{where}: entry {entry!r} needs 1 <= DEPTH <= k_max {k_max}, 1 <= BEAM <= 8, M >= 1")
        return MenuEntry(eagle=(depth, beam, budget))
    if not isinstance(entry, (list, tuple)) or not all(isinstance(w, int) and not isinstance(w, bool) for w in entry):
        raise SpecgymError(f"{where}: entry {entry!r} is neither a list of widths nor 'eagle:DEPTH:BEAM:M'")
    if len(entry) > k_max or any(w < 1 for w in entry):
        raise SpecgymError(f"{where}: entry {list(entry)} needs depth <= k_max {k_max} and widths >= 1")
    return MenuEntry(shape=TreeShape.from_widths(tuple(entry)))


def menu(entries: Any, k_max: int, where: str = "tree menu") -> list[MenuEntry]:
    """Parse a whole menu (at least one entry)."""
    if not isinstance(entries, (list, tuple)) or not entries:
        raise SpecgymError(f"{where}: a non-empty list of entries (widths or 'eagle:DEPTH:BEAM:M') expected")
    return [menu_entry(e, k_max, where) for e in entries]


def _widths(shape: TreeShape) -> list[int]:
    """The per-depth widths of a shape built by :meth:`TreeShape.from_widths` (its name)."""
    return [] if not shape.nodes else [int(w) for w in shape.name.split("-")]

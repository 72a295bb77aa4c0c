"""A tree controller that plays some rounds through an inner tree controller (the hybrids).

:class:`~specgym.baselines.tree_hybrid.TreeHybrid` and :class:`~specgym.baselines.tree_online.TreeDrafterChoice`
decide per round whether to play a prompt-lookup chain or their inner controller's tree. What follows from wrapping
is the same for both and lives here: the trees are drafted by whoever drafts the inner controller's
(``TREE_SPEC@head`` sets it on the inner one), the live check and the approximate label are the inner one's, and the
inner one prepares itself where it fits, but only on the columns of the drafter that drafts its trees.
"""

from __future__ import annotations

from typing import Any

from specgym.envs.core.controller import fits_itself
from specgym.envs.core.tree import TreeController
from specgym.errors import SpecgymError


class TreeWrapper(TreeController):
    """Forwards the drafter, the live check and the approximate label to ``inner``.

    Args:
        inner: The tree controller of the wrapped rounds.
    """

    #: Fits on the columns of the drafter its inner trees are drafted by (the inner controller's permitting).
    fits_on_drafter = True

    def __init__(self, inner: TreeController) -> None:
        self.inner = inner
        self.approximate = inner.approximate

    @property  # type: ignore[override]
    def drafter(self) -> str | None:
        """Who drafts the inner trees (``TREE_SPEC@head`` sets it on the inner controller)."""
        return self.inner.drafter

    @drafter.setter
    def drafter(self, value: str | None) -> None:
        self.inner.drafter = value

    def check_live(self) -> None:
        """The inner controller's check."""
        self.inner.check_live()

    def prepare_inner(self, workload: Any, profile: Any) -> list[str]:
        """The inner controller's fit notes (nothing where it fits nothing); one line where it fits on the draft
        model's columns while another drafter drafts its trees."""
        if not fits_itself(self.inner):
            return []
        if self.drafter is not None and not getattr(self.inner, "fits_on_drafter", False):
            raise SpecgymError(f"{self.name}: {self.inner.name} fits on the draft model's columns, not the "
                               f"{self.drafter}'s")
        return list(self.inner.prepare(workload, profile))

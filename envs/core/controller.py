"""The one interface every speculation-length controller implements.

A controller sees a request's context, proposes a draft cap K before each round, may stop drafting early after any
draft token (token-level controllers), and observes the verified outcome. It knows nothing of Gymnasium or of the
engine behind it: the same object drives the replay engine, the live engine and transformers' ``generate``
(:func:`specgym.envs.core.request.drive` is the loop they all share).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome


class Prepared:
    """What every controller interface (chain, tree, batch, drafter) shares before serving: ``prepare``.

    A controller that fits itself on a workload (a tree's shape, a run predictor, a guarded policy's teacher)
    overrides :meth:`prepare`; every other one inherits this no-op, so a runner prepares every controller the same
    way and asks :func:`fits_itself` when it must find a workload to prepare on.
    """

    def prepare(self, workload: Any, profile: Any) -> list[str]:
        """Fit on ``workload`` (its fit split) under ``profile`` before serving; returns notes to show the user.
        The default fits nothing."""
        return []


def fits_itself(ctrl: object) -> bool:
    """True when ``ctrl`` overrides :meth:`Prepared.prepare`: it needs a workload (a recording of the pair it
    serves) and a cost profile before it can serve."""
    prepare = getattr(type(ctrl), "prepare", None)
    return prepare is not None and prepare is not Prepared.prepare


class Controller(Prepared, ABC):
    """Chooses the speculation length of each round.

    Lifecycle per request: ``reset(ctx)``, then repeatedly ``propose()`` -> (``keep_drafting(step)`` after draft
    tokens j = 1..K-1) -> ``observe(outcome)``.

    Attributes:
        name: Display name used in reports.
        token_level: True when ``keep_drafting`` may return False (the controller stops inside a round).
        needs: The per-position trace columns (``draft_conf``, ``draft_entropy``...) the controller reads; on an
            engine that lacks one (``RequestContext.lacks``) it refuses to start in one line
            (:class:`~specgym.envs.core.request.Episode`). Empty: it runs on every trace.
    """

    name: str = "controller"
    token_level: bool = False
    needs: frozenset[str] = frozenset()
    ctx: RequestContext

    def reset(self, ctx: RequestContext) -> None:
        """Start a new request. Per-request state is cleared here; state meant to span requests is kept."""
        self.ctx = ctx

    @abstractmethod
    def propose(self) -> int:
        """Return the draft cap K (0..ctx.k_max) for the next round."""

    def keep_drafting(self, step: DraftStep) -> bool:
        """Return False to stop drafting after ``step`` and verify now. Default: always continue."""
        return True

    @abstractmethod
    def observe(self, outcome: RoundOutcome) -> None:
        """Update state from a verified round."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

"""The one interface every speculation-length controller implements.

A controller sees a request's context, proposes a draft cap K before each round, may stop drafting early after any
draft token (token-level controllers), and observes the verified outcome. It knows nothing of Gymnasium or of the
engine behind it: the same object drives the replay engine, the live engine and transformers' ``generate``
(:func:`specgym.envs.core.request.drive` is the loop they all share).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome


class Controller(ABC):
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

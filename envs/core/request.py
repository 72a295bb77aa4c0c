"""One request being decoded round by round, and the one loop that lets a controller drive it.

Both engines hand out requests of the same shape (:class:`Request`): the replay engine's
:class:`~specgym.envs.engines.replay.trace_engine.ReplayRequest` and the live engine's
:class:`~specgym.envs.engines.live.engine.LiveRequest`. :func:`drive` is the whole speculative-decoding control loop;
the evaluation harness, the live engine, behaviour cloning and the transformers integration all run it, so a
controller behaves identically wherever it is deployed.
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from specgym.envs.core.controller import Controller
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome, RoundStart
from specgym.errors import SpecgymError

KeepDrafting = Callable[[DraftStep], bool]


class Request(ABC):
    """A request in progress: call :meth:`play` with a draft cap until :attr:`done`.

    Attributes:
        context: What a controller may know about the request (:class:`RequestContext`).
        position: Next completion position ``i``.
        length: Completion length ``N``.
        k_max: The engine's largest draft cap.
        done: True once the completion is finished.
    """

    __slots__ = ()
    context: RequestContext
    position: int
    length: int
    k_max: int
    done: bool

    def clip(self, k: int) -> int:
        """The draft cap the engine will use for a requested ``k``: ``min(k, k_max, N - i - 1)``."""
        if k < 0:
            raise SpecgymError(f"draft length K must be >= 0, got {k}")
        return min(int(k), self.k_max, self.length - self.position - 1)

    def round_start(self) -> RoundStart:
        """What a drafter-choice controller knows before the next round (no token ids here: lookup -1)."""
        return RoundStart(self.position, self.context.prompt_len + self.position, -1)

    @abstractmethod
    def play(self, k: int, keep_drafting: KeepDrafting | None = None) -> RoundOutcome:
        """Play one round with draft cap ``k``; ``keep_drafting`` may stop after draft token ``j < cap``."""


@dataclass(slots=True)
class Totals:
    """What one request cost under one controller.

    Attributes:
        tokens: Tokens produced (the completion length, or fewer when a live request stopped at EOS).
        time_ms: Total round time.
        rounds: Rounds played.
        drafted: Draft tokens proposed.
        accepted: Draft tokens accepted.
    """

    tokens: int = 0
    time_ms: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0


class Episode:
    """One request under one controller, step by step: the body of :func:`drive`.

    For decoding loops that someone else owns (transformers' ``generate`` calls back into a candidate generator),
    :class:`Episode` gives the same contract :func:`drive` runs: ``reset`` on creation, :meth:`propose` (a checked
    K), :attr:`keep_drafting` (``None`` unless the controller is token-level), :meth:`observe` (the controller
    learns the verified round and the totals grow).

    Args:
        controller: Any :class:`Controller`.
        context: The request's :class:`RequestContext`.
    """

    __slots__ = ("controller", "keep_drafting", "totals", "_propose", "_observe")

    def __init__(self, controller: Controller, context: RequestContext):
        check_needs(controller, context)
        controller.reset(context)
        self.controller = controller
        self.keep_drafting: KeepDrafting | None = controller.keep_drafting if controller.token_level else None
        self.totals = Totals()
        self._propose, self._observe = controller.propose, controller.observe

    def propose(self) -> int:
        """The controller's draft cap for the next round (the engine clips it)."""
        k = self._propose()
        if type(k) is not int:
            k = _whole_k(k, self.controller.name)
        if k < 0:
            raise SpecgymError(f"controller {self.controller.name} proposed K={k}; K must be >= 0")
        return k

    def observe(self, o: RoundOutcome) -> None:
        """Show the controller the verified round and add it to the totals."""
        self._observe(o)
        tot = self.totals
        tot.tokens += o.produced
        tot.time_ms += o.time_ms
        tot.rounds += 1
        tot.drafted += o.drafted
        tot.accepted += o.accepted


def check_needs(controller: Controller, context: RequestContext) -> None:
    """Refuse, in one line, a controller that reads a trace column the engine lacks (``Controller.needs``)."""
    missing = controller.needs & context.lacks
    if missing:
        cols = ", ".join(repr(c) for c in sorted(missing))
        raise SpecgymError(f"controller {controller.name} needs the per-position column(s) {cols}, which workload "
                           f"{context.workload or '?'} does not carry (a per-start trace: runs only); leave it out "
                           f"of --controllers")


def _whole_k(k: object, name: str) -> int:
    """A proposed K that is not a plain int: a numpy integer is fine; None, NaN or 2.5 is a one-line error."""
    if isinstance(k, numbers.Integral) and not isinstance(k, bool):
        return int(k)
    raise SpecgymError(f"controller {name} proposed K={k!r}; K must be a whole number >= 0")


def drive(controller: Controller, request: Request,
          on_round: Callable[[RoundOutcome], None] | None = None) -> Totals:
    """Decode ``request`` to the end with ``controller`` choosing every round.

    ``reset(ctx)``, then until the request is done: ``propose()`` -> play the round (a token-level controller's
    ``keep_drafting`` is asked after each draft token) -> ``observe(outcome)``.

    Args:
        controller: Any :class:`Controller`.
        request: A fresh request from an engine (replay or live).
        on_round: Called with every verified :class:`RoundOutcome` after the controller observed it.

    Returns:
        The request's :class:`Totals`.
    """
    ep = Episode(controller, request.context)
    propose, keep, observe, play = ep.propose, ep.keep_drafting, ep.observe, request.play
    while not request.done:
        o = play(propose(), keep)
        observe(o)
        if on_round is not None:
            on_round(o)
    return ep.totals

"""The admission limit of a closed-loop run: how many sequences may be in flight, and how that changes over the run.

One schedule, two ways to change the limit, shared by specgym's batch replay and the hook inside vLLM so that a
prediction and the engine it predicts admit alike:

* ``by="time"``: ``segments = ((duration_ms, concurrency), ...)``, cycled from the run's start: load that changes
  with the clock. A policy that is faster in a low-concurrency stretch serves more tokens in it and leaves fewer for
  the stretches after; the run's time is mostly the high-concurrency stretches';
* ``by="requests"``: ``segments = ((requests, concurrency), ...)``, phases of a job in submission order: request
  ``j`` is admitted only while fewer than its phase's concurrency are in flight; the last phase's limit holds for
  any requests beyond. Every phase serves a fixed share of the work, so its speed counts in proportion to its time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specgym.errors import SpecgymError

BY = ("time", "requests")


@dataclass(frozen=True)
class AdmissionSchedule:
    """Concurrency over a run (module docstring). A single concurrency is ``constant(c)``."""

    segments: tuple[tuple[float, int], ...]
    by: str = "time"

    def __post_init__(self) -> None:
        if self.by not in BY:
            raise SpecgymError(f"admission schedule: by must be one of {BY}, got {self.by!r}")
        if not self.segments or any(c < 1 for _, c in self.segments) or any(n <= 0 for n, _ in self.segments):
            raise SpecgymError(f"admission schedule: segments need lengths > 0 and concurrencies >= 1, got "
                               f"{[list(s) for s in self.segments]}")

    @classmethod
    def constant(cls, concurrency: int) -> AdmissionSchedule:
        """One concurrency for the whole run."""
        return cls(((float("inf"), int(concurrency)),))

    @classmethod
    def of(cls, spec: Any) -> AdmissionSchedule:
        """From an int (one concurrency), ``[(duration_ms, c), ...]`` (by time), the JSON form of :meth:`to_spec`,
        or a schedule."""
        if isinstance(spec, AdmissionSchedule):
            return spec
        if hasattr(spec, "__index__"):  # an int, numpy's too
            return cls.constant(int(spec))
        if isinstance(spec, dict):
            return cls(tuple((float(n), int(c)) for n, c in spec.get("segments", ())), str(spec.get("by", "time")))
        return cls(tuple((float(n), int(c)) for n, c in spec))

    def to_spec(self) -> dict[str, Any]:
        """JSON-ready (what the benchmark passes to the engine-core process)."""
        return {"by": self.by, "segments": [[n, c] for n, c in self.segments]}

    @property
    def max_concurrency(self) -> int:
        """The largest limit the schedule sets."""
        return max(c for _, c in self.segments)

    @property
    def changes(self) -> bool:
        """True when the limit changes during a run."""
        return len(self.segments) > 1

    def limit_at(self, elapsed_ms: float) -> int:
        """The limit ``elapsed_ms`` into the run (``by="time"``)."""
        if len(self.segments) == 1:
            return self.segments[0][1]
        t = elapsed_ms % sum(d for d, _ in self.segments)
        for d, c in self.segments:
            if t < d:
                return c
            t -= d
        return self.segments[-1][1]

    def phase_limit(self, request: int) -> int:
        """The concurrency request number ``request`` (0-based, submission order) is admitted under
        (``by="requests"``)."""
        end = 0.0
        for n, c in self.segments:
            end += n
            if request < end:
                return c
        return self.segments[-1][1]

    def admissible(self, elapsed_ms: float, admitted: int, running: int, waiting: int) -> int:
        """How many of the ``waiting`` requests one step may admit, ``admitted`` so far and ``running`` in flight."""
        if self.by == "time":
            return max(min(self.limit_at(elapsed_ms) - running, waiting), 0)
        n = 0
        while n < waiting and running + n < self.phase_limit(admitted + n):
            n += 1
        return n


def phases(requests: Sequence[int], concurrency: Sequence[int]) -> AdmissionSchedule:
    """A job in phases: ``requests[i]`` requests at ``concurrency[i]``, one after another."""
    return AdmissionSchedule(tuple((float(n), int(c)) for n, c in zip(requests, concurrency, strict=True)),
                             by="requests")

"""Records that flow from an engine to a controller: one round of speculative decoding.

Data flows one way: workload/engine -> :class:`RoundOutcome` -> controller -> K. Both the trace-replay engine
and the live engine emit these records; controllers, the feature code and the evaluation harness consume them.
Nothing here knows about Gymnasium or about any particular controller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_EMPTY = np.zeros(0, dtype=np.float32)


@dataclass(slots=True)
class RequestContext:
    """What a controller may know about a request before decoding starts.

    The completion length is deliberately absent: a real serving loop does not know it in advance.

    Attributes:
        request_id: Identifier of the request in its workload (or a free-form id in live use).
        category: Workload category label ("code", "chat", ...); informational, real controllers rarely know it.
        temperature: Sampling temperature (0.0 = greedy).
        prompt_len: Prompt length in tokens.
        k_max: Largest draft length the engine accepts.
        draft_ms: Cost of one draft forward (one new token), milliseconds.
        verify_ms: ``verify_ms[n]`` = one target forward over ``n`` new tokens, for n = 0..k_max+1
            (index 0 unused and set to 0).
        round_overhead_ms: Fixed per-round overhead of a speculative round (K >= 1).
    """

    request_id: str
    category: str
    temperature: float
    prompt_len: int
    k_max: int
    draft_ms: float
    verify_ms: tuple[float, ...]
    round_overhead_ms: float = 0.0

    @property
    def t_ar_ms(self) -> float:
        """Time of one plain autoregressive target step (``verify_ms[1]``)."""
        return self.verify_ms[1]


@dataclass(slots=True)
class DraftStep:
    """One draft token, seen by a token-level controller before it decides to continue.

    Attributes:
        index: 1-based index ``j`` of this token inside the round.
        cap: The round's draft cap ``K`` (after clipping); drafting stops at ``j == cap`` regardless.
        position: Completion position of this token (``i + j - 1``).
        conf: Draft probability of the proposed token.
        entropy: Entropy (nats) of the draft distribution at this token.
    """

    index: int
    cap: int
    position: int
    conf: float
    entropy: float


@dataclass(slots=True)
class RoundOutcome:
    """Result of one verified round (REFERENCES section 1).

    Attributes:
        position: Completion position ``i`` at the start of the round.
        planned_k: Draft cap after clipping to ``N - i - 1`` (or the live engine's budget).
        drafted: Tokens actually proposed (``<= planned_k``; smaller if a token-level stop fired).
        accepted: Length of the accepted prefix (``0..drafted``).
        produced: Tokens the round adds (``accepted + 1``).
        time_ms: Cost of the round (cost model in replay, measured wall clock or cost model in live use).
        draft_conf: Draft confidence of each drafted token, shape ``(drafted,)``.
        draft_entropy: Draft entropy (nats) of each drafted token, shape ``(drafted,)``.
        done: True when the request's completion is finished after this round.
    """

    position: int
    planned_k: int
    drafted: int
    accepted: int
    produced: int
    time_ms: float
    draft_conf: np.ndarray = field(default_factory=lambda: _EMPTY)
    draft_entropy: np.ndarray = field(default_factory=lambda: _EMPTY)
    done: bool = False

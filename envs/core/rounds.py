"""Records that flow from an engine to a controller: one round of speculative decoding.

Data flows one way: workload/engine -> :class:`RoundOutcome` -> controller -> K. Both the trace-replay engine and
the live engine emit these records; controllers, the feature code and the evaluation harness consume them. Nothing
here knows about Gymnasium or about any particular controller.

A **round** at completion position ``i`` (``N`` = completion length): the controller gives a draft cap ``K``, the
engine clips it to ``min(K, k_max, N - i - 1)`` (drafting past the end is useless), the draft proposes tokens one
at a time (a token-level controller may stop after any of them), the target verifies ``[last token, d_1..d_n]`` in
one forward pass, the leading run of accepted draft tokens is kept and the target adds one token of its own, so the
round produces ``accepted + 1`` tokens. ``K = 0`` is a plain autoregressive target step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.signals import DraftSignals
from specgym.errors import SpecgymError

#: Draft cap every command, environment and controller uses unless told otherwise.
DEFAULT_K_MAX = 8
#: Largest draft cap an engine accepts.
K_MAX_LIMIT = 16

_EMPTY = np.zeros(0, dtype=np.float32)


def check_k_max(k_max: object) -> int:
    """Validate a draft cap limit (an integer in ``1..K_MAX_LIMIT``) and return it as ``int``."""
    if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or not 1 <= int(k_max) <= K_MAX_LIMIT:
        raise SpecgymError(f"k_max must be an integer in [1, {K_MAX_LIMIT}], got {k_max!r}")
    return int(k_max)


#: The per-token draft features a round reports of its drafted tokens (:class:`RoundOutcome`, :class:`DraftStep`):
#: what a drafter or a recording that does not carry them lists in ``RequestContext.lacks``.
TOKEN_FEATURES = frozenset({"draft_conf", "draft_entropy"})


@dataclass(slots=True)
class RequestContext:
    """What a controller may know about a request before decoding starts.

    The completion length is deliberately absent: a real serving loop does not know it in advance.

    Attributes:
        request_id: Identifier of the request in its workload (or a free-form id in live use).
        category: Workload category label ("code", "chat", ...); informational, real controllers rarely know it.
        temperature: Sampling temperature (0.0 = greedy).
        prompt_len: Prompt length in tokens.
        k_max: Largest draft cap the engine accepts.
        profile: What rounds cost on the hardware serving the request (cost-aware controllers read it).
        lacks: The per-position trace columns the engine has no values of (a per-start trace: ``draft_conf``,
            ``draft_entropy``...): its ``DraftStep`` / ``RoundOutcome`` draft features are NaN, and a controller
            whose ``needs`` meet it refuses. Empty for live engines and complete traces.
        workload: The workload's name (replay), for messages.
        drafter_conf: The drafters other than the default whose rounds carry their own per-token draft confidence
            (``DraftStep.conf``, ``RoundOutcome.draft_conf``; never an entropy): the draft head on a greedy request of
            a live engine with one, or of a recording with ``topk_head``. Another drafter's rounds carry NaN.
    """

    request_id: str
    category: str
    temperature: float
    prompt_len: int
    k_max: int
    profile: CostProfile
    lacks: frozenset[str] = frozenset()
    workload: str = ""
    drafter_conf: frozenset[str] = frozenset()


@dataclass(slots=True)
class DraftStep:
    """One draft token, seen by a token-level controller before it decides to continue.

    Attributes:
        index: 1-based index ``j`` of this token inside the round.
        cap: The round's draft cap ``K`` (after clipping); drafting stops at ``j == cap`` regardless.
        position: Completion position of this token (``i + j - 1``).
        conf: Draft probability of the proposed token (NaN when the engine has none: ``RequestContext.lacks``).
        entropy: Entropy (nats) of the draft distribution at this token (NaN when the engine has none).
        signals: Pre-verification signals of the round's draft tokens ``1..j`` (this token last:
            ``signals.topk[-1]``), or ``None`` when the engine has none (a trace without signal columns).
        drafter_topk: Another drafter's ``TOPK = 8`` largest probabilities at this token, descending (``conf`` is the
            first): the draft head's on a request that carries its confidence (``RequestContext.drafter_conf``), from
            ``topk_head`` in replay and from the head's softmax live; what a head acceptance predictor reads. ``None``
            for the default drafter (its top-k is in ``signals``) and for a drafter without them.
    """

    index: int
    cap: int
    position: int
    conf: float
    entropy: float
    signals: DraftSignals | None = None
    drafter_topk: Sequence[float] | None = None


@dataclass(slots=True)
class RoundOutcome:
    """Result of one verified round.

    Attributes:
        position: Completion position ``i`` at the start of the round.
        planned_k: Draft cap after clipping to ``N - i - 1`` (and ``k_max``).
        drafted: Tokens actually proposed (``<= planned_k``; smaller if a token-level stop fired).
        accepted: Length of the accepted prefix (``0..drafted``).
        produced: Tokens the round adds (``accepted + 1``).
        time_ms: Cost of the round (cost model in replay, measured or cost model in live use).
        draft_conf: Draft confidence of each drafted token, shape ``(drafted,)``.
        draft_entropy: Draft entropy (nats) of each drafted token, shape ``(drafted,)``.
        done: True when the request's completion is finished after this round.
        signals: Pre-verification signals of each drafted token (``drafted`` rows,
            :mod:`specgym.envs.core.signals`), or ``None`` when the engine has none.
        drafter: The drafter that proposed the round's tokens (``None``: the engine's default drafter).
        counterfactual: What a drafter that did not propose would have had accepted from the round's start, where the
            verified tokens tell it for free: ``((drafter, run), ...)``, ``run`` censored at ``produced`` (a run of
            ``produced`` means at least that many). Engines report prompt lookup's, whose proposal is a function of
            the token ids, on greedy requests (at T > 0 acceptance is a draw the round did not make); where it had
            nothing to propose it is absent. Empty otherwise.
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
    signals: DraftSignals | None = None
    drafter: str | None = None
    counterfactual: tuple[tuple[str, int], ...] = ()

    @property
    def forced(self) -> bool:
        """True for a round the engine had to play as ``K = 0`` (the last token of a request: no room to draft).

        A ``K = 0`` round that finishes the request started at position ``N - 1``, where every cap clips to 0.
        """
        return self.planned_k == 0 and self.done


@dataclass(frozen=True, slots=True)
class RoundStart:
    """What a drafter-choice controller knows before a round.

    Attributes:
        position: Completion position ``i`` of the round.
        kv: Tokens in the KV cache (``prompt_len + i``).
        lookup_len: The context lookup at ``i`` (:mod:`specgym.envs.core.lookup`): the longest ``n <= 4`` whose
            suffix occurred earlier in prompt + completion so far (0: none); -1 when the engine has no token ids.
    """

    position: int
    kv: int
    lookup_len: int

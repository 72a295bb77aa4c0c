"""Trace-replay engine: plays speculative-decoding rounds over a recorded or synthetic workload.

Semantics (the round of :mod:`specgym.envs.core.rounds`, the trace columns of
:mod:`specgym.envs.workloads.trace_format`, the cost model of :mod:`specgym.envs.core.cost`): at position ``i``
with draft cap ``K`` (clipped to ``N - i - 1``), drafted token ``j`` proposes position ``i + j - 1`` and is accepted
iff ``u[i+j-1] < p_accept[i+j-1]``, where ``u`` is a per-request array of uniforms drawn once from the engine seed
and the request id (common random numbers: every controller evaluated under one seed sees the same draws).
``accepted`` is the leading accepted count, the round produces ``accepted + 1`` tokens and costs
``round_time(drafted)``.

Because acceptance only depends on the leading run, the engine precomputes ``run[i]`` = number of consecutive
accepted positions from ``i`` (within the request); a round is then O(1): ``accepted = min(run[i], drafted)``.
That is what makes both the scalar form (:class:`ReplayRequest`) and the vectorised form (:class:`VectorReplay`)
fast, and what lets the oracle plan over the same outcomes.

For greedy traces the replay is exact (the draft proposes the target's tokens up to the first rejection). Draft
features of tokens after the first rejection come from the correct-prefix trace: an approximation, since the real
draft would be conditioned on its own wrong token; controllers only learn of the rejection at verification.

Signals: a trace with v2 signal columns (:mod:`specgym.envs.workloads.trace_format`) gives controllers the same
:class:`~specgym.envs.core.signals.DraftSignals` record the live engine computes online (``DraftStep.signals``: the
round's draft tokens so far; ``RoundOutcome.signals``: every drafted token), a view of the trace rows of the round's
positions; a trace without them gives ``None``. Rows after the first rejection are correct-prefix values, as above.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.replay import request_uniforms, run_lengths
from specgym.envs.core.request import KeepDrafting, Request
from specgym.envs.core.rounds import DEFAULT_K_MAX, DraftStep, RequestContext, RoundOutcome, check_k_max
from specgym.envs.core.signals import DraftSignals
from specgym.envs.workloads.trace_format import Workload
from specgym.errors import SpecgymError


class TraceEngine:
    """Replays rounds over one workload under one cost profile and one seed.

    Args:
        workload: The trace to replay.
        profile: Cost profile; defaults to the workload's own.
        k_max: Largest draft cap (1..16); the profile must price ``k_max + 1`` verify tokens.
        seed: Seed of the common random numbers.
    """

    def __init__(self, workload: Workload, profile: CostProfile | None = None, k_max: int = DEFAULT_K_MAX,
                 seed: int = 0):
        self.workload = workload
        self.profile = profile or workload.profile
        self.k_max = check_k_max(k_max)
        self.profile.check_k_max(self.k_max)
        self.seed = int(seed)
        self.round_times = self.profile.round_times(self.k_max)
        self.t_ar = float(self.round_times[0])
        self._runs: dict[int, np.ndarray] = {}
        self._all_runs: np.ndarray | None = None
        self.signals = workload.signal_columns()

    # ------------------------------------------------------------------------------------------ outcomes
    def request_runs(self, r: int) -> np.ndarray:
        """Run lengths of request ``r`` under this engine's seed (cached)."""
        if self._all_runs is not None:
            return self._all_runs[self.workload.span(r)]
        runs = self._runs.get(r)
        if runs is None:
            sl = self.workload.span(r)
            p = self.workload.p_accept[sl]
            u = request_uniforms(self.seed, self.workload.request_id[r], len(p))
            runs = run_lengths(u < p, np.array([0, len(p)]))
            if len(self._runs) > 4096:
                self._runs.clear()
            self._runs[r] = runs
        return runs

    def all_runs(self) -> np.ndarray:
        """Flat run lengths of every request (computed once; used by the vectorised replay and the oracle)."""
        if self._all_runs is None:
            wl = self.workload
            u = np.empty(wl.n_positions, dtype=np.float64)
            for r in range(wl.n_requests):
                sl = wl.span(r)
                u[sl] = request_uniforms(self.seed, wl.request_id[r], sl.stop - sl.start)
            self._all_runs = run_lengths(u < wl.p_accept, wl.offsets)
        return self._all_runs

    def context(self, r: int) -> RequestContext:
        """What a controller may know about request ``r`` (no completion length, no outcomes)."""
        wl = self.workload
        return RequestContext(
            request_id=str(wl.request_id[r]),
            category=str(wl.category[r]),
            temperature=float(wl.temperature[r]),
            prompt_len=int(wl.prompt_len[r]),
            k_max=self.k_max,
            profile=self.profile,
        )

    def start(self, r: int, seed: int | None = None) -> ReplayRequest:
        """Begin replaying request ``r`` from position 0.

        Args:
            r: Request index in the workload.
            seed: Draw this request's outcomes from another seed (e.g. fresh draws per training episode);
                default: the engine's seed (common random numbers).
        """
        if not 0 <= r < self.workload.n_requests:
            raise SpecgymError(f"request index {r} out of range [0, {self.workload.n_requests})")
        if seed is None or seed == self.seed:
            runs = self.request_runs(r)
        else:
            p = self.workload.p_accept[self.workload.span(r)]
            u = request_uniforms(seed, self.workload.request_id[r], len(p))
            runs = run_lengths(u < p, np.array([0, len(p)]))
        return ReplayRequest(self, r, runs)


class ReplayRequest(Request):
    """Scalar replay of one request: call :meth:`play` until :attr:`done` (or hand it to ``drive``).

    Attributes:
        context: The request's :class:`RequestContext`.
        position: Next completion position ``i``.
        length: Completion length ``N``.
        done: True once ``position == N``.
    """

    __slots__ = ("engine", "r", "context", "position", "length", "k_max", "done", "_runs", "_conf", "_ent",
                 "_times", "_sig", "_base")

    def __init__(self, engine: TraceEngine, r: int, runs: np.ndarray):
        wl = engine.workload
        sl = wl.span(r)
        self.engine = engine
        self.r = r
        self.context = engine.context(r)
        self.position = 0
        self.length = sl.stop - sl.start
        self.k_max = engine.k_max
        self.done = False
        self._runs = runs.tolist()
        self._conf = wl.draft_conf[sl]
        self._ent = wl.draft_entropy[sl]
        self._times = engine.round_times.tolist()
        self._sig = engine.signals
        self._base = sl.start

    def signals(self, position: int, n: int) -> DraftSignals | None:
        """The signals of ``n`` draft tokens proposed from ``position`` (``None`` when the trace has none)."""
        sig = self._sig
        if sig is None:
            return None
        start = self._base + position
        return DraftSignals(sig, start, start + n)

    def play(self, k: int, keep_drafting: KeepDrafting | None = None) -> RoundOutcome:
        """Play one round with draft cap ``k``; ``keep_drafting`` (token-level) may stop after token j < K."""
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        cap = self.clip(int(k))
        drafted = cap
        if keep_drafting is not None and cap > 1:
            step = self.draft_step
            for j in range(1, cap):
                if not keep_drafting(step(j, cap)):
                    drafted = j
                    break
        return self.verify(cap, drafted)

    def draft_step(self, j: int, cap: int) -> DraftStep:
        """The ``j``-th draft token of a round from the current position with cap ``cap``, as a token-level decider
        sees it before deciding to continue (features and signals of the round's tokens ``1..j``)."""
        i = self.position
        p = i + j - 1
        return DraftStep(j, cap, p, float(self._conf[p]), float(self._ent[p]), self.signals(i, j))

    def draft_features(self, position: int) -> tuple[float, float]:
        """(draft_conf, draft_entropy) of the token the draft proposes for ``position``."""
        return float(self._conf[position]), float(self._ent[position])

    def verify(self, cap: int, drafted: int) -> RoundOutcome:
        """Verify ``drafted`` tokens (``<= cap``) proposed from the current position; advances the request."""
        i = self.position
        run = self._runs[i]
        accepted = run if run < drafted else drafted
        produced = accepted + 1
        self.position = i + produced
        self.done = self.position >= self.length
        return RoundOutcome(
            i, cap, drafted, accepted, produced, self._times[drafted],
            self._conf[i : i + drafted], self._ent[i : i + drafted], self.done,
            None if self._sig is None else DraftSignals(self._sig, self._base + i, self._base + i + drafted),
        )


class VectorReplay:
    """Vectorised replay: advances many requests at once, one round each per :meth:`step`.

    Args:
        engine: The engine whose workload, profile and seed to use.
        requests: Request indices to replay (default: all).
    """

    def __init__(self, engine: TraceEngine, requests: Sequence[int] | np.ndarray | None = None):
        wl = engine.workload
        self.engine = engine
        self.requests = np.arange(wl.n_requests) if requests is None else np.asarray(requests, dtype=np.int64)
        self.start = wl.offsets[self.requests].astype(np.int64)
        self.end = wl.offsets[self.requests + 1].astype(np.int64)
        self.runs = engine.all_runs()
        self.pos = self.start.copy()
        self.time_ms = np.zeros(len(self.requests))
        self.rounds = np.zeros(len(self.requests), dtype=np.int64)
        self.drafted_total = np.zeros(len(self.requests), dtype=np.int64)
        self.accepted_total = np.zeros(len(self.requests), dtype=np.int64)

    @property
    def active(self) -> np.ndarray:
        """Bool mask of requests not yet finished."""
        return self.pos < self.end

    def step(self, k: np.ndarray | int, drafted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Play one round for every active request.

        Args:
            k: Draft caps, scalar or one per request (entries of finished requests are ignored).
            drafted: Optional tokens actually drafted (token-level stops), ``<= k``.

        Returns:
            ``(cap, drafted, accepted)`` arrays over all requests (zeros for finished ones).
        """
        act = self.pos < self.end
        remaining = self.end - self.pos - 1
        cap = np.minimum(np.minimum(k, self.engine.k_max), remaining)
        cap = np.where(act, np.maximum(cap, 0), 0)
        d = cap if drafted is None else np.minimum(np.where(act, drafted, 0), cap)
        run = self.runs[np.minimum(self.pos, len(self.runs) - 1)]
        acc = np.minimum(run, d)
        self.pos += np.where(act, acc + 1, 0)
        self.time_ms += np.where(act, self.engine.round_times[d], 0.0)
        self.rounds += act
        self.drafted_total += d
        self.accepted_total += acc
        return cap, d, acc

    def run_fixed(self, k: int) -> None:
        """Replay every request to the end with a fixed draft cap."""
        while self.active.any():
            self.step(k)

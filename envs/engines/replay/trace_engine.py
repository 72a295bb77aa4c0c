"""Trace-replay engine: plays speculative-decoding rounds over a recorded or synthetic workload.

Semantics (the round of :mod:`specgym.envs.core.rounds`, the trace columns of
:mod:`specgym.envs.workloads.trace_format`, the cost model of :mod:`specgym.envs.core.cost`): at position ``i``
with draft cap ``K`` (clipped to ``N - i - 1``), drafted token ``j`` proposes position ``i + j - 1`` and is accepted
iff ``u[i+j-1] < p_accept[i+j-1]``, where ``u`` is a per-request array of uniforms drawn once from the engine seed
and the request id (common random numbers: every controller evaluated under one seed sees the same draws).
``accepted`` is the leading accepted count, the round produces ``accepted + 1`` tokens and costs
``round_time(drafted)``.

Because acceptance only depends on the leading run, the engine reads **runs** (:mod:`specgym.envs.core.replay`):
``run[i]`` = the draft tokens a round starting at ``i`` accepts with a long enough draft; a round is then O(1):
``accepted = min(run[i], drafted)``. A per-position trace's runs are those of its accept draws (precomputed per
seed); a per-start trace (format v3) stores them per drafter, seed-independent. :meth:`TraceEngine.runs` is the
one accessor (the scalar form :class:`ReplayRequest`, the vectorised form :class:`VectorReplay`, the oracles and
the references read it), and the drafter is a parameter of the round machinery (``drafter=`` on the engine, on
:meth:`ReplayRequest.play` / :meth:`ReplayRequest.verify` and on :class:`VectorReplay`; ``None`` = the engine's).

A lookup drafter (prompt lookup) proposes nothing where the context has no earlier match: there the round is a plain
step, priced as one (:meth:`TraceEngine.proposal_caps`, from the recorded context lookup ``lookup_len``, whose
n-gram range is the proposer's; a proposal cut short because the match's continuation ends early is not modelled,
0.3% of the starts of ``smollm2-greedy``'s test split). The live engine does the same.

Costs: a round is priced by the profile's :class:`~specgym.envs.core.cost.RoundTable` of the round's drafter at
the request's KV cache, ``prompt_len + i`` tokens at position ``i`` (``base[d] + per_kv[d] * kv``); a profile
without a context term takes the classic path (``round_times[d]``), bit-identical to before.

A trace without draft features (a per-start trace lacks ``draft_conf`` / ``draft_entropy``) gives NaN in
``DraftStep.conf`` / ``entropy`` and ``RoundOutcome.draft_conf`` / ``draft_entropy``; the request context names what
the trace lacks (``RequestContext.lacks``) and a controller that needs it refuses in one line
(:class:`~specgym.envs.core.request.Episode`).

For greedy traces the replay is exact (the draft proposes the target's tokens up to the first rejection). Draft
features of tokens after the first rejection come from the correct-prefix trace: an approximation, since the real
draft would be conditioned on its own wrong token; controllers only learn of the rejection at verification.

Another drafter's rounds (``drafter=``) carry no draft entropy and none of the default drafter's signals, and NaN
confidence but where the trace holds the drafter's own (:meth:`TraceEngine.drafter_confidence`: the draft head's, from
``topk_head``, on greedy requests, named in ``RequestContext.drafter_conf``); a token-level decider is asked after each
of its tokens as for the default drafter (where a lookup drafter has nothing to propose, never).

Signals: a trace with v2 signal columns (:mod:`specgym.envs.workloads.trace_format`) gives controllers the same
:class:`~specgym.envs.core.signals.DraftSignals` record the live engine computes online (``DraftStep.signals``: the
round's draft tokens so far; ``RoundOutcome.signals``: every drafted token), a view of the trace rows of the round's
positions; a trace without them gives ``None``. Rows after the first rejection are correct-prefix values, as above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specgym.envs.core.cost import CostProfile, RoundTable
from specgym.envs.core.kinds import HEAD_DRAFTER
from specgym.envs.core.replay import per_position_runs
from specgym.envs.core.request import KeepDrafting, Request
from specgym.envs.core.rounds import DEFAULT_K_MAX, DraftStep, RequestContext, RoundOutcome, RoundStart, check_k_max
from specgym.envs.core.signals import TOPK, DraftSignals
from specgym.envs.workloads.trace_format import Workload
from specgym.envs.workloads.workload import HEAD_TOPK_SCALE
from specgym.errors import SpecgymError

#: Another drafter of a request (:meth:`ReplayRequest._drafter`): runs, round costs (base, per KV token or None),
#: proposal caps or None, per-start confidences ``(n, J)`` or None.
OtherDrafter = tuple[list[int], list[float], list[float] | None, list[int] | None, list[list[float]] | None]
#: Makes the ``DraftStep`` of token ``j`` of a round with cap ``cap``.
KeepStep = Callable[[int, int], DraftStep]


def head_topk(rows: np.ndarray) -> np.ndarray:
    """The draft head's top-8 probabilities, float32 ``(..., J, 8)``, from ``topk_head`` rows (uint16 ``(..., 8 J)``,
    scaled by ``HEAD_TOPK_SCALE``): the one conversion replay (:meth:`TraceEngine.drafter_confidence`,
    :meth:`TraceEngine.drafter_topk`) and the head acceptance predictor's training read."""
    rows = np.asarray(rows)
    return (rows.astype(np.float32) / np.float32(HEAD_TOPK_SCALE)).reshape(*rows.shape[:-1], -1, TOPK)


class TraceEngine:
    """Replays rounds over one workload under one cost profile and one seed.

    Args:
        workload: The trace to replay.
        profile: Cost profile; defaults to the workload's own.
        k_max: Largest draft cap (1..16); the profile must price ``k_max + 1`` verify tokens.
        seed: Seed of the common random numbers (per-position traces; per-start runs do not depend on it).
        drafter: The drafter whose runs rounds replay (``None``: the workload's default drafter).
    """

    def __init__(self, workload: Workload, profile: CostProfile | None = None, k_max: int = DEFAULT_K_MAX,
                 seed: int = 0, drafter: str | None = None):
        self.workload = workload
        self.profile = profile or workload.profile
        self.k_max = check_k_max(k_max)
        self.profile.check_k_max(self.k_max)
        self.seed = int(seed)
        self.drafter = str(workload.drafter_info(drafter)["name"])
        self._tables: dict[str, RoundTable] = {}
        self.table = self.table_for(self.drafter)
        self.round_times = self.table.base
        self.t_ar = float(self.round_times[0])
        self.has_context = self.table.has_context
        self._runs: dict[int, np.ndarray] = {}
        self._flat_runs: dict[str, np.ndarray] = {}
        self._caps: dict[str, np.ndarray | None] = {}
        self._confs: dict[str, np.ndarray | None] = {}
        self.signals = workload.signal_columns()
        self.lacks = workload.lacks
        self._lookups = tuple(d for d in workload.drafter_names
                              if d in workload.runs and workload.drafter_info(d)["kind"] == "lookup")

    # ------------------------------------------------------------------------------------------ outcomes
    def table_for(self, drafter: str | None = None) -> RoundTable:
        """The round costs of ``drafter`` (``None``: the engine's) under the engine's profile (cached)."""
        name = self.drafter if drafter is None else drafter
        table = self._tables.get(name)
        if table is None:
            kind = self.workload.drafter_info(name)["kind"]
            prof = self.profile.with_drafter(name, kind)  # prompt lookup on a model-drafter profile: no draft cost
            table = self._tables[name] = prof.round_table(self.k_max, prof.pricing_drafter(name, kind))
        return table

    def _per_start(self, drafter: str) -> bool:
        return self.workload.drafter_info(drafter)["runs"] == "per-start"

    def runs(self, drafter: str | None = None) -> np.ndarray:
        """Flat runs of every request for ``drafter`` (``None``: the engine's), int64, computed once: the stored
        per-start runs, or a per-position trace's runs under this engine's seed."""
        name = self.drafter if drafter is None else drafter
        flat = self._flat_runs.get(name)
        if flat is None:
            wl = self.workload
            if self._per_start(name):
                flat = wl.runs[name].astype(np.int64)
            else:
                flat = per_position_runs(wl.require("p_accept", "per-position replay"), wl.offsets, wl.request_id,
                                         self.seed)
            self._flat_runs[name] = flat
        return flat

    def lookup_drafters(self) -> tuple[str, ...]:
        """The workload's lookup drafters with per-start runs (what a round's counterfactual reports)."""
        return self._lookups

    def proposal_caps(self, drafter: str | None = None) -> np.ndarray | None:
        """Flat most tokens ``drafter`` can propose from each position: 0 for a lookup drafter where the recorded
        context lookup found no match, else no limit (``k_max``); ``None`` where nothing limits it (a model drafter,
        or a trace without ``lookup_len``)."""
        name = self.drafter if drafter is None else drafter
        if name not in self._caps:
            found = self.workload.lookup_len
            caps = None
            if found is not None and self.workload.drafter_info(name)["kind"] == "lookup":
                caps = np.where(found > 0, self.k_max, 0).astype(np.int64)
            self._caps[name] = caps
        return self._caps[name]

    def drafter_confidence(self, drafter: str) -> np.ndarray | None:
        """Flat per-start confidences ``(positions, J)`` float32 of another drafter's greedy draft tokens: for the draft
        head, ``topk_head[g, j, 0]``, its softmax maximum ``j + 1`` steps from start ``g`` along the completion (its
        greedy token's probability: exact up to the first rejection, the correct-prefix approximation past it);
        ``None`` for a drafter without them (prompt lookup, a trace without ``topk_head``, the engine's own drafter)."""
        if drafter not in self._confs:
            top = self.workload.topk_head
            conf = None
            if drafter == HEAD_DRAFTER and drafter != self.drafter and top is not None:
                conf = head_topk(top)[:, :, 0]
            self._confs[drafter] = conf
        return self._confs[drafter]

    def drafter_topk(self, drafter: str, g: int) -> list[list[float]] | None:
        """Another drafter's top-8 probabilities ``(J, 8)`` at its greedy draft tokens from the flat start ``g``
        (:func:`head_topk` of ``topk_head[g]``: row ``j - 1`` for token ``j``, its first value the confidence
        :meth:`drafter_confidence` gives), or ``None`` where it has no confidences."""
        top = self.workload.topk_head
        if top is None or self.drafter_confidence(drafter) is None:
            return None
        return head_topk(top[g]).tolist()

    def all_runs(self) -> np.ndarray:
        """Flat runs of every request for the engine's drafter (:meth:`runs`)."""
        return self.runs()

    def request_runs(self, r: int, drafter: str | None = None, seed: int | None = None) -> np.ndarray:
        """Runs of request ``r`` (cached for the engine's drafter and seed; ``seed`` draws a per-position trace's
        outcomes from another seed)."""
        name = self.drafter if drafter is None else drafter
        if self._per_start(name):
            return self.runs(name)[self.workload.span(r)]
        if seed is not None and seed != self.seed:
            return self._draw(r, seed)
        flat = self._flat_runs.get(name)
        if flat is not None:
            return flat[self.workload.span(r)]
        runs = self._runs.get(r)
        if runs is None:
            runs = self._draw(r, self.seed)
            if len(self._runs) > 4096:
                self._runs.clear()
            self._runs[r] = runs
        return runs

    def _draw(self, r: int, seed: int) -> np.ndarray:
        sl = self.workload.span(r)
        p = self.workload.require("p_accept", "per-position replay")[sl]
        return per_position_runs(p, np.array([0, len(p)]), [self.workload.request_id[r]], seed)

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
            lacks=self.lacks,
            workload=wl.name,
            drafter_conf=frozenset(d for d in wl.drafter_names if self.drafter_confidence(d) is not None)
            if wl.temperature[r] == 0 else frozenset(),
        )

    def start(self, r: int, seed: int | None = None) -> ReplayRequest:
        """Begin replaying request ``r`` from position 0.

        Args:
            r: Request index in the workload.
            seed: Draw this request's outcomes from another seed (e.g. fresh draws per training episode; a
                per-start trace has no draws); default: the engine's seed (common random numbers).
        """
        if not 0 <= r < self.workload.n_requests:
            raise SpecgymError(f"request index {r} out of range [0, {self.workload.n_requests})")
        return ReplayRequest(self, r, self.request_runs(r, seed=seed))


class ReplayRequest(Request):
    """Scalar replay of one request: call :meth:`play` until :attr:`done` (or hand it to ``drive``).

    Attributes:
        context: The request's :class:`RequestContext`.
        position: Next completion position ``i``.
        length: Completion length ``N``.
        done: True once ``position == N``.
    """

    __slots__ = ("engine", "r", "context", "position", "length", "k_max", "done", "_runs", "_conf", "_ent",
                 "_times", "_per_kv", "_kv0", "_sig", "_base", "_other", "_lookup", "_caps", "_seen")

    def __init__(self, engine: TraceEngine, r: int, runs: np.ndarray):
        wl = engine.workload
        sl = wl.span(r)
        self.engine = engine
        self.r = r
        self.context = engine.context(r)
        self.position = 0
        self.length = n = sl.stop - sl.start
        self.k_max = engine.k_max
        self.done = False
        self._runs = runs.tolist()
        self._conf = wl.draft_conf[sl] if wl.draft_conf is not None else np.full(n, np.nan, np.float32)
        self._ent = wl.draft_entropy[sl] if wl.draft_entropy is not None else np.full(n, np.nan, np.float32)
        self._times = engine.round_times.tolist()
        self._per_kv = engine.table.per_kv.tolist() if engine.has_context else None
        self._kv0 = int(wl.prompt_len[r])
        self._sig = engine.signals
        self._base = sl.start
        self._other: dict[str, OtherDrafter] = {}
        self._lookup = wl.lookup_len[sl].tolist() if wl.lookup_len is not None else None
        caps = engine.proposal_caps()
        self._caps = None if caps is None else caps[sl].tolist()
        self._seen = engine.lookup_drafters() if self.context.temperature == 0 else ()

    def round_start(self) -> RoundStart:
        """What a drafter-choice controller knows before the next round: the position, the KV cache and the
        trace's context lookup there (-1 when the trace has no token ids)."""
        i = self.position
        return RoundStart(i, self._kv0 + i, -1 if self._lookup is None or i >= self.length else int(self._lookup[i]))

    def signals(self, position: int, n: int) -> DraftSignals | None:
        """The signals of ``n`` draft tokens proposed from ``position`` (``None`` when the trace has none)."""
        sig = self._sig
        if sig is None:
            return None
        start = self._base + position
        return DraftSignals(sig, start, start + n)

    def play(self, k: int, keep_drafting: KeepDrafting | None = None, drafter: str | None = None) -> RoundOutcome:
        """Play one round with draft cap ``k``; ``keep_drafting`` (token-level) may stop after token j < K;
        ``drafter`` replays another of the trace's drafters (``None``: the engine's)."""
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        cap = self.clip(int(k))
        drafted = cap
        if keep_drafting is not None and cap > 1:
            step: KeepStep
            if drafter is None or drafter == self.engine.drafter:
                step, room = self.draft_step, cap
            else:  # another drafter's tokens (none where a lookup drafter has nothing to propose)
                caps = self._drafter(drafter)[3]
                step, room = self._other_step(drafter), cap if caps is None else min(cap, caps[self.position])
            for j in range(1, room):
                if not keep_drafting(step(j, cap)):
                    drafted = j
                    break
        return self.verify(cap, drafted, drafter)

    def draft_step(self, j: int, cap: int) -> DraftStep:
        """The ``j``-th draft token of a round from the current position with cap ``cap``, as a token-level decider
        sees it before deciding to continue (features and signals of the round's tokens ``1..j``)."""
        i = self.position
        p = i + j - 1
        return DraftStep(j, cap, p, float(self._conf[p]), float(self._ent[p]), self.signals(i, j))

    def _other_step(self, drafter: str) -> KeepStep:
        """The ``DraftStep`` maker of another drafter's round from the current position: its own confidence and top-8
        where the trace holds them (:meth:`TraceEngine.drafter_confidence`, :meth:`TraceEngine.drafter_topk`), else
        NaN and ``None``; never an entropy or signals."""
        i = self.position
        row = self._drafter(drafter)[4]
        conf = row[i] if row is not None else []
        top = self.engine.drafter_topk(drafter, self._base + i) if row is not None else None
        nan = float("nan")
        return lambda j, cap: DraftStep(j, cap, i + j - 1, conf[j - 1] if j <= len(conf) else nan, nan, None,
                                        top[j - 1] if top is not None and j <= len(top) else None)

    def draft_features(self, position: int) -> tuple[float, float]:
        """(draft_conf, draft_entropy) of the token the draft proposes for ``position`` (NaN where absent)."""
        return float(self._conf[position]), float(self._ent[position])

    def _drafter(self, drafter: str) -> OtherDrafter:
        """Runs, costs, proposal caps and per-start confidences (on a request whose context names them) of another
        drafter of this request (cached)."""
        got = self._other.get(drafter)
        if got is None:
            eng = self.engine
            table = eng.table_for(drafter)
            caps = eng.proposal_caps(drafter)
            sl = eng.workload.span(self.r)
            conf = eng.drafter_confidence(drafter) if drafter in self.context.drafter_conf else None
            got = self._other[drafter] = (eng.request_runs(self.r, drafter).tolist(), table.base.tolist(),
                                          table.per_kv.tolist() if table.has_context else None,
                                          None if caps is None else caps[sl].tolist(),
                                          None if conf is None else conf[sl].tolist())
        return got

    def verify(self, cap: int, drafted: int, drafter: str | None = None) -> RoundOutcome:
        """Verify ``drafted`` tokens (``<= cap``) proposed from the current position; advances the request."""
        i = self.position
        own = drafter is None or drafter == self.engine.drafter
        if drafter is None or own:
            drafter = self.engine.drafter
            runs, times, per_kv, caps = self._runs, self._times, self._per_kv, self._caps
        else:
            runs, times, per_kv, caps, conf_rows = self._drafter(drafter)
        if caps is not None and caps[i] < drafted:  # prompt lookup found nothing to propose: a plain step
            drafted = caps[i]
            drafter = drafter if drafted else None
        run = runs[i]
        accepted = run if run < drafted else drafted
        produced = accepted + 1
        self.position = i + produced
        self.done = self.position >= self.length
        time_ms = times[drafted] if per_kv is None else times[drafted] + per_kv[drafted] * (self._kv0 + i)
        seen = self._counterfactual(i, produced, drafter) if self._seen else ()
        if not own:  # another drafter's round: its own confidences where the trace holds them, nothing else
            nan = np.full(drafted, np.nan, dtype=np.float32)
            conf = nan.copy()
            if conf_rows is not None:
                got = conf_rows[i][:drafted]
                conf[: len(got)] = got
            return RoundOutcome(i, cap, drafted, accepted, produced, time_ms, conf, nan, self.done, None, drafter,
                                seen)
        return RoundOutcome(
            i, cap, drafted, accepted, produced, time_ms,
            self._conf[i : i + drafted], self._ent[i : i + drafted], self.done,
            None if self._sig is None else DraftSignals(self._sig, self._base + i, self._base + i + drafted),
            drafter, seen,
        )

    def _counterfactual(self, i: int, produced: int, played: str | None) -> tuple[tuple[str, int], ...]:
        """Each lookup drafter's recorded run at ``i`` that did not play, censored at ``produced`` (none where it
        had nothing to propose): :attr:`RoundOutcome.counterfactual`."""
        out = []
        for name in self._seen:
            if name != played:
                runs, _, _, caps, _ = self._drafter(name)
                if caps is None or caps[i] > 0:
                    out.append((name, min(runs[i], produced)))
        return tuple(out)


class VectorReplay:
    """Vectorised replay: advances many requests at once, one round each per :meth:`step`.

    Args:
        engine: The engine whose workload, profile and seed to use.
        requests: Request indices to replay (default: all).
        drafter: The drafter whose runs and costs to replay (``None``: the engine's).
    """

    def __init__(self, engine: TraceEngine, requests: Sequence[int] | np.ndarray | None = None,
                 drafter: str | None = None):
        wl = engine.workload
        self.engine = engine
        self.requests = np.arange(wl.n_requests) if requests is None else np.asarray(requests, dtype=np.int64)
        self.start = wl.offsets[self.requests].astype(np.int64)
        self.end = wl.offsets[self.requests + 1].astype(np.int64)
        self.runs = engine.runs(drafter)
        self.caps = engine.proposal_caps(drafter)
        self.table = engine.table_for(drafter)
        self.round_times = self.table.base
        # the KV cache at a round: prompt_len + (pos - start), pos a flat position
        self.kv0 = (wl.prompt_len[self.requests].astype(np.int64) - self.start) if self.table.has_context else None
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
        at = np.minimum(self.pos, len(self.runs) - 1)
        if self.caps is not None:  # prompt lookup found nothing to propose: a plain step
            d = np.minimum(d, self.caps[at])
        run = self.runs[at]
        acc = np.minimum(run, d)
        times = self.round_times[d] if self.kv0 is None else self.round_times[d] + self.table.per_kv[d] * (
            self.kv0 + self.pos)
        self.pos += np.where(act, acc + 1, 0)
        self.time_ms += np.where(act, times, 0.0)
        self.rounds += act
        self.drafted_total += d
        self.accepted_total += acc
        return cap, d, acc

    def run_fixed(self, k: int) -> None:
        """Replay every request to the end with a fixed draft cap."""
        while self.active.any():
            self.step(k)

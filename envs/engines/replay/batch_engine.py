"""Batched trace replay: many requests in flight, one step at a time, as a serving engine runs them.

Each step every active sequence drafts up to its K (one K for the batch, as vLLM's speculative config does, one per
sequence, or a ragged :class:`~specgym.envs.core.batch.BatchDecision`: per sequence the tokens drafted and the prefix
of them verified, as vLLM's adaptive verification splits a verification budget) and the target verifies all of them
in one forward; acceptance comes from the same traces and the same
common random numbers as the single-request engine (``accepted = min(run[pos], cap)``), and the step is priced by a
:class:`~specgym.envs.core.batch_cost.BatchCostProfile` at the step's batch size:

    step time = sum_j draft_ms(b_j) + verify_ms(b, n_eff) + overhead_ms(b)      (b_j: sequences still drafting at j;
                                                                                 n_eff: mean tokens verified per seq)

and ``verify_ms(b, 1)`` for a step without drafts (plus the profile's per-step overhead, 0 on grids). A batched view
of a published linear profile (``BatchCostProfile.linear``, e.g. ``h100-llama31-8b``) prices every step exactly with
its model instead: ``forward(whole-batch KV, sum(cap + 1))`` + the drafter's phase for the longest draft (an
autoregressive drafter runs one step per draft token of the longest draft; a lookup drafter's phase is flat: a share
of the forward) + overheads
(:meth:`~specgym.envs.core.batch_cost.BatchCostProfile.step_ms`), the KV cache of a sequence being ``prompt_len +
position``, the batched tokens optionally padded to CUDA-graph capture sizes (``capture_sizes``). Switch costs
(:mod:`specgym.envs.core.switching`: a cost per K-tier switch, a cooldown, captured tiers with a slowdown outside
them) are charged by the engine, so every controller pays them. Runs are the engine's one notion
(:mod:`specgym.envs.core.replay`): a per-position trace's draws under the seed, or a per-start trace's stored runs of
``drafter``. Admission:

* **closed loop**: a finished request is replaced at once, keeping ``concurrency`` sequences in flight (a schedule of
  ``(duration_ms, concurrency)`` segments, cycled, makes it change over time);
* **open loop**: requests arrive as a Poisson process at ``arrival_rate`` per second and wait in a queue until a slot
  of the ``max_batch`` frees up.

Per request the engine keeps its admission and finish times, so TPOT (time per output token while in flight),
aggregate tokens/s and goodput (tokens/s of requests meeting a TPOT target) follow. With concurrency 1 a closed loop
equals the single-request engine exactly (``tests/test_batch.py``). Every per-step operation is a numpy operation over
the active sequences; the set of slots in flight and the batch's KV total are kept incrementally (recomputed only
when a request enters or leaves).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from specgym.envs.core.admission import AdmissionSchedule
from specgym.envs.core.batch import BatchController, BatchDecision, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.cost import ForwardCost
from specgym.envs.core.replay import per_position_runs
from specgym.envs.core.rounds import DEFAULT_K_MAX, check_k_max
from specgym.envs.core.switching import SwitchCosts
from specgym.envs.workloads.trace_format import Workload
from specgym.errors import SpecgymError

CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def mixed_schedule(rng: np.random.Generator, profile: BatchCostProfile, max_batch: int, segments: int = 6,
                   min_steps: float = 40.0, max_steps: float = 400.0) -> list[tuple[float, int]]:
    """A concurrency that changes over time: ``segments`` stretches of a random power-of-two concurrency up to
    ``max_batch``, each lasting a random 40-400 plain decoding steps of one sequence."""
    sizes = [c for c in CONCURRENCIES if c <= max_batch] or [1]
    t1 = profile.verify(1, 1)
    return [(float(rng.uniform(min_steps, max_steps)) * t1, int(rng.choice(sizes))) for _ in range(segments)]


_NONE = np.zeros(0, dtype=np.int64)
_NONE.flags.writeable = False


def with_capture_sizes(profile: BatchCostProfile, sizes: Sequence[int]) -> BatchCostProfile:
    """``profile`` with its batched tokens padded to the CUDA-graph capture ``sizes`` (a linear profile only)."""
    lin = profile.linear
    if lin is None or lin.forward is None:
        raise SpecgymError(f"batch profile {profile.name!r} is a grid: capture sizes pad a linear profile's batched "
                           f"tokens")
    sizes = tuple(int(x) for x in sizes)
    fwd = ForwardCost.from_dict({**lin.forward.to_dict(), "capture_sizes": list(sizes)}, where="capture_sizes")
    return BatchCostProfile.from_linear(replace(lin, forward=fwd), profile.batch_sizes)


class BatchReplay:
    """Replays a workload through a batch of in-flight sequences.

    Args:
        workload: The trace.
        profile: Batched cost profile.
        concurrency: Closed loop: sequences kept in flight (an int, ``[(duration_ms, concurrency), ...]`` cycled,
            or an :class:`~specgym.envs.core.admission.AdmissionSchedule`).
        arrival_rate: Open loop instead: Poisson arrivals per second (``concurrency`` is then the batch limit).
        requests: Workload request indices to serve, in order (default: all).
        k_max: Largest draft cap.
        seed: Seed of the common random numbers (and of the arrival times).
        drafter: The drafter whose runs (and, with a linear profile, costs) to replay (``None``: the default).
        switch_costs: What changing the step's K tier costs (:mod:`specgym.envs.core.switching`; ``None``: free).
        capture_sizes: CUDA-graph capture sizes the batched tokens are padded to (a linear profile only; ``None``:
            the profile's own).
        draft_signal: A per-position signal over the workload's flat positions (e.g. an acceptance predictor's
            probabilities), reported to controllers as :attr:`BatchState.draft_view`.
    """

    def __init__(self, workload: Workload, profile: BatchCostProfile,
                 concurrency: int | Sequence[tuple[float, int]] | AdmissionSchedule = 1,
                 arrival_rate: float | None = None, requests: Sequence[int] | np.ndarray | None = None,
                 k_max: int = DEFAULT_K_MAX, seed: int = 0, drafter: str | None = None,
                 switch_costs: SwitchCosts | None = None, capture_sizes: Sequence[int] | None = None,
                 draft_signal: np.ndarray | None = None):
        self.workload = workload
        if capture_sizes is not None:
            profile = with_capture_sizes(profile, capture_sizes)
        self.profile = profile
        self.k_max = check_k_max(k_max)
        profile.check_k_max(self.k_max)
        self.requests = np.arange(workload.n_requests) if requests is None else np.asarray(requests, np.int64)
        if len(self.requests) == 0:
            raise SpecgymError("batch replay: no requests to serve")
        # run lengths of the served requests only, laid out contiguously (the same draws as the replay engine's)
        lengths = workload.lengths[self.requests].astype(np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        spans = [workload.span(int(r)) for r in self.requests]
        info = workload.drafter_info(drafter)
        self.drafter = str(info["name"])
        self._priced_as = profile.linear.pricing_drafter(self.drafter, info["kind"]) if profile.linear else None
        if info["runs"] == "per-start":
            self.runs = np.concatenate([workload.runs[self.drafter][sl] for sl in spans]).astype(np.int64)
        else:
            p_all = workload.require("p_accept", "batch replay")
            self.runs = per_position_runs(np.concatenate([p_all[sl] for sl in spans]), offsets,
                                          workload.request_id[self.requests], seed)
        self.draft_signal: np.ndarray | None = None
        if draft_signal is not None:
            sig = np.asarray(draft_signal, dtype=np.float64)
            if sig.shape != (int(workload.offsets[-1]),):
                raise SpecgymError(f"batch replay: draft_signal needs one value per position of the workload "
                                   f"({int(workload.offsets[-1])}), got shape {sig.shape}")
            self.draft_signal = np.concatenate([sig[sl] for sl in spans])
        self._ahead = np.arange(self.k_max)[None, :]
        self.kv0 = workload.prompt_len[self.requests].astype(np.int64) - offsets[:-1]  # KV = kv0 + flat position
        try:
            self.schedule = AdmissionSchedule.of(concurrency)
        except SpecgymError as exc:
            raise SpecgymError(f"batch replay: {exc}") from None
        self.max_batch = self.schedule.max_concurrency
        self.arrival_rate = arrival_rate
        n = len(self.requests)
        if arrival_rate is not None:
            if arrival_rate <= 0:
                raise SpecgymError(f"arrival_rate must be > 0, got {arrival_rate}")
            gaps = np.random.default_rng([seed, 99]).exponential(1000.0 / arrival_rate, n)
            self.arrival_ms = np.cumsum(gaps) - gaps[0]
        else:
            self.arrival_ms = np.zeros(n)
        self.start, self.end = offsets[:-1], offsets[1:]
        # per slot state
        m = self.max_batch
        self.slot_req = np.full(m, -1, dtype=np.int64)  # index into self.requests, -1 = free
        self.pos = np.zeros(m, dtype=np.int64)
        self.slot_end = np.zeros(m, dtype=np.int64)
        # per request results
        self.admit_ms = np.full(n, np.nan)
        self.finish_ms = np.full(n, np.nan)
        self.next_req = 0
        self.now_ms = 0.0
        self.steps = 0
        self.seq_steps = 0
        self.tokens = 0
        self._new: list[int] = []
        self._n = n
        self._act = np.zeros(0, dtype=np.int64)
        self._dirty = True
        self._kv0_sum = 0  # sum over the slots in flight of kv0 (their KV = kv0 + flat position)
        self._pos_sum = 0  # ... and of their flat positions
        self._linear = profile.linear is not None
        if profile.linear is not None:
            self._price = profile.linear.batch_step_pricer(self._priced_as)
        self.switch = None if switch_costs is None or switch_costs.free else switch_costs
        self._tier, self._since_switch = -1, 1 << 30  # no switch yet: no cooldown
        self._admit()

    def __getstate__(self) -> dict:
        """Picklable (a training snapshot stores its envs): the linear profile's step pricer, a closure, is rebuilt
        on load."""
        state = self.__dict__.copy()
        state.pop("_price", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.profile.linear is not None:
            self._price = self.profile.linear.batch_step_pricer(self._priced_as)

    # ------------------------------------------------------------------------------------------ admission
    def concurrency(self) -> int:
        """The closed loop's target concurrency now (the batch limit in open loop): the next request's limit when
        the schedule goes by requests."""
        if self.schedule.by == "requests":
            return self.schedule.phase_limit(self.next_req)
        return self.schedule.limit_at(self.now_ms)

    def _admit(self) -> None:
        active = int((self.slot_req >= 0).sum())
        free = np.flatnonzero(self.slot_req < 0)
        n = len(self.requests)
        for slot in free:
            if active >= self.concurrency() or self.next_req >= n or self.arrival_ms[self.next_req] > self.now_ms:
                break
            r = self.next_req
            self.slot_req[slot] = r
            self.pos[slot] = self.start[r]
            self.slot_end[slot] = self.end[r]
            self.admit_ms[r] = max(self.now_ms, self.arrival_ms[r])
            self.next_req += 1
            self._new.append(int(slot))
            self._kv0_sum += int(self.kv0[r])
            self._pos_sum += int(self.start[r])
            self._dirty = True
            active += 1

    def _refresh(self) -> None:
        self._act = np.flatnonzero(self.slot_req >= 0)
        self._dirty = False

    def _pending(self) -> bool:
        """True when a request waits that a step could admit (a free slot under the limit, an arrival due)."""
        if self.next_req >= self._n or self.schedule.changes:
            return self.next_req < self._n
        return self.arrival_rate is not None and self.arrival_ms[self.next_req] <= self.now_ms

    @property
    def done(self) -> bool:
        """True once every request finished."""
        if self._dirty:
            self._refresh()
        return self.next_req >= self._n and len(self._act) == 0

    @property
    def active_slots(self) -> np.ndarray:
        """Slots with a sequence in flight."""
        if self._dirty:
            self._refresh()
        return self._act

    @property
    def queue(self) -> int:
        """Requests arrived and waiting for a slot."""
        if self.arrival_rate is None:
            return self._n - self.next_req
        arrived = int(np.searchsorted(self.arrival_ms, self.now_ms, side="right"))
        return max(arrived - self.next_req, 0)

    # ------------------------------------------------------------------------------------------ one step
    def state(self) -> BatchState:
        """What a controller knows before the next step (the slots of newly admitted requests are reported once)."""
        if self._dirty:
            self._refresh()
        if len(self._act) == 0 and self.next_req < self._n:  # open loop, idle until the next arrival
            self.now_ms = max(self.now_ms, float(self.arrival_ms[self.next_req]))
            self._admit()
            self._refresh()
        act = self._act
        if self._new:
            new, self._new = np.asarray(self._new, dtype=np.int64), []
        else:
            new = _NONE
        view = None
        if self.draft_signal is not None:  # the next k_max positions of each sequence (0 past its end)
            idx = self.pos[act][:, None] + self._ahead
            view = np.where(idx < self.slot_end[act][:, None], self.draft_signal[np.minimum(idx, len(
                self.draft_signal) - 1)], 0.0)
        return BatchState(len(act), self.queue, self.concurrency(), act, new, self._kv0_sum + self._pos_sum, view)

    def step(self, k: int | np.ndarray | BatchDecision) -> BatchStep:
        """Play one step: ``k`` is the batch's K, one K per slot of :attr:`active_slots` (in that order), or a
        :class:`~specgym.envs.core.batch.BatchDecision` (per slot, the tokens drafted and the prefix verified)."""
        if self._dirty:
            self._refresh()
        act = self._act
        b = len(act)
        if b == 0:
            self.state()
            act = self._act
            b = len(act)
        queue = self._n - self.next_req if self.arrival_rate is None else self.queue
        pos, end = self.pos[act], self.slot_end[act]
        left = end - pos
        left -= 1
        if isinstance(k, BatchDecision):
            verify, draft = k.verify, k.draft
        else:
            verify, draft = k, None
        if isinstance(verify, (int, np.integer)):
            tier = min(max(int(verify), 0), self.k_max)
            cap = np.minimum(left, tier)
        else:
            cap = np.clip(np.asarray(verify, dtype=np.int64), 0, self.k_max)
            if cap.shape != (b,):
                raise SpecgymError(f"batch replay: expected one K per sequence in flight ({b}), got shape "
                                   f"{cap.shape}")
            tier = int(cap.max())
            np.minimum(cap, left, out=cap)
        if draft is None:
            drafted = cap
        else:
            drafted = np.clip(np.asarray(draft, dtype=np.int64), 0, self.k_max)
            tier = max(tier, int(drafted.max()))
            drafted = np.maximum(np.broadcast_to(np.minimum(drafted, left), (b,)), cap)
        kdraft = int(drafted.max())
        switched = False
        sw = self.switch
        if sw is not None:  # the tier is the K asked for (a request's end does not change the graph)
            if self._tier >= 0 and tier != self._tier and self._since_switch < sw.cooldown_steps:
                tier = self._tier  # held: the step runs at the tier (every sequence drafts it), verifies <= it
                drafted = np.minimum(left, tier)
                cap = np.minimum(cap, drafted)
                kdraft = int(drafted.max())
            switched = self._tier >= 0 and tier != self._tier
            self._since_switch = 0 if switched else self._since_switch + 1
            self._tier = tier
        else:
            tier = kdraft
        accepted = np.minimum(self.runs[pos], cap)
        ncap = int(cap.sum())
        if self._linear:
            kv = self._kv0_sum + self._pos_sum
            t = self._price(kv, ncap + b, kdraft)
        else:
            t = self._grid_ms(b, ncap, drafted, kdraft)
        if sw is not None:
            t = t * sw.slowdown(tier) + (sw.per_switch_ms if switched else 0.0)
        total = ncap + b if ncap == 0 else int(accepted.sum()) + b
        newpos = pos + accepted
        newpos += 1
        self.pos[act] = newpos
        self._pos_sum += total
        self.now_ms += t
        done = newpos >= end
        nfin = int(np.count_nonzero(done))
        if nfin:
            fin = act[done]
            reqs = self.slot_req[fin]
            self.finish_ms[reqs] = self.now_ms
            self._kv0_sum -= int(self.kv0[reqs].sum())
            self._pos_sum -= int(self.pos[fin].sum())
            self.slot_req[fin] = -1
            self._dirty = True
        self.steps += 1
        self.seq_steps += b
        self.tokens += total
        if nfin or self._pending():
            self._admit()
        return BatchStep(b, queue, act, cap, accepted, total, t, nfin, drafted, tier, switched)

    def _grid_ms(self, b: int, ncap: int, drafted: np.ndarray, kdraft: int) -> float:
        """A step priced on a grid profile: one draft forward per draft position over the sequences still drafting,
        the verify at the mean tokens per sequence, the overheads."""
        row = self.profile.row
        _, verify, overhead = row(b)
        if kdraft == 0:
            return float(verify[0]) + self.profile.step_overhead_ms
        if int(drafted.min()) == kdraft:  # every sequence drafts the same: b at each position
            t = sum([row(b)[0]] * kdraft)
        else:
            drafting = np.bincount(drafted, minlength=kdraft + 1)[::-1].cumsum()[::-1]  # sequences with draft >= j
            t = sum(row(int(n))[0] for n in drafting[1:].tolist())
        n_eff = ncap / b + 1.0  # mean tokens verified per sequence
        lo = int(n_eff)
        w = n_eff - lo
        t += (verify[lo - 1] if w == 0.0 else (1 - w) * verify[lo - 1] + w * verify[lo]) + overhead
        return float(t + self.profile.step_overhead_ms)

    def run_fixed(self, k: int) -> None:
        """Serve every request with a fixed K."""
        while not self.done:
            self.step(k)

    def run(self, controller: BatchController) -> None:
        """Serve every request with ``controller`` choosing each step's K (the batched ``drive`` loop)."""
        controller.reset(self.profile, self.k_max)
        while not self.done:
            controller.observe(self.step(controller.propose(self.state())))

    # ------------------------------------------------------------------------------------------ results
    def tpot_ms(self) -> np.ndarray:
        """Time per output token of every request while in flight (NaN until it finished)."""
        lengths = (self.end - self.start).astype(np.float64)
        return (self.finish_ms - self.admit_ms) / lengths

    def throughput(self) -> float:
        """Tokens per second over the whole run."""
        return self.tokens / self.now_ms * 1000.0 if self.now_ms > 0 else float("nan")

    def goodput(self, tpot_slo_ms: float | None = None) -> float:
        """Tokens per second of requests whose TPOT met ``tpot_slo_ms`` (all of them when None)."""
        if tpot_slo_ms is None:
            return self.throughput()
        ok = self.tpot_ms() <= tpot_slo_ms
        return float((self.end - self.start)[ok].sum()) / self.now_ms * 1000.0

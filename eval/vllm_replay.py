"""specgym's prediction of a vLLM run: the recorded workload replayed by the batch engine under a vLLM-measured
profile, served as vLLM serves it.

:class:`~specgym.envs.engines.replay.batch_engine.BatchReplay` plays the same requests (same lengths, same acceptance:
the recording is exact for greedy decoding, and vLLM's greedy output equals the recorded completions token for
token, which the benchmark checks) under the same admission (a closed loop at a concurrency, or the same schedule of
concurrencies), with the same per-step K policy, priced by the profile vLLM's own steps gave
(:mod:`specgym.envs.engines.serving.vllm_profile`). Two things vLLM does that the replay does not model by itself are
added
here, each from the measured profile:

* a new request's first step is its **prefill**: it yields the request's first token and verifies no draft
  (:class:`PrefillFirst` gives that sequence K = 0 in its first replayed step), and the step costs the prefill's
  extra time, ``prefill_ms_per_request + prefill_ms_per_token * prompt tokens`` (:class:`PrefillCost`), added to
  the run's time (and spread over the requests' in-flight times in proportion);
* plain decoding (``fixed:0``) runs in an engine without speculation: it is priced by
  :func:`~specgym.envs.engines.serving.vllm_profile.plain_profile`.

Everything else (batch size by step, requests finishing and refilling the batch, K clipped to each request's end)
is the batch engine's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specgym.envs.core.admission import AdmissionSchedule
from specgym.envs.core.batch import BatchController, BatchState, BatchStep
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.engines.serving.vllm_profile import PrefillCost
from specgym.envs.workloads.trace_format import Workload


class PrefillFirst(BatchController):
    """``inner``'s K for every sequence, except 0 for a sequence in its first step (vLLM's prefill step).

    Args:
        inner: The batch controller of the run.
    """

    def __init__(self, inner: BatchController):
        self.inner = inner
        self.name = inner.name

    def reset(self, profile: BatchCostProfile, k_max: int) -> None:
        super().reset(profile, k_max)
        self.inner.reset(profile, k_max)

    def propose(self, state: BatchState) -> np.ndarray:
        k = self.inner.propose(state)
        caps = np.broadcast_to(np.asarray(k, dtype=np.int64), (len(state.slots),)).copy()
        if len(state.new_slots):
            caps[np.isin(state.slots, state.new_slots)] = 0
        return caps

    def observe(self, step: BatchStep) -> None:
        self.inner.observe(step)


@dataclass
class Prediction:
    """What the replay predicts for one vLLM run.

    Attributes:
        tok_s: Generated tokens per second.
        tpot_ms: Per request in-flight time per output token.
        drafts, accepted: Draft tokens verified and accepted over the run.
        steps: Engine steps.
        time_ms: The run's predicted time (replay plus prefill).
    """

    tok_s: float
    tpot_ms: np.ndarray
    drafts: int
    accepted: int
    steps: int
    time_ms: float


def predict_run(workload: Workload, requests: Sequence[int] | np.ndarray, profile: BatchCostProfile,
                controller: BatchController, concurrency: int | Sequence[tuple[float, int]] | AdmissionSchedule,
                k_max: int, prefill: PrefillCost | None = None, seed: int = 0) -> Prediction:
    """Replay one run (see the module docstring); with a schedule that changes with the clock its durations are
    scaled by the prefill share, so that the replay's clock keeps pace with the engine's."""
    prefill = prefill or PrefillCost.of(profile)
    reqs = np.asarray(requests, dtype=np.int64)
    extra = prefill.ms(workload.prompt_len[reqs])
    schedule = AdmissionSchedule.of(concurrency)
    timed = schedule.by == "time" and schedule.changes
    scale = 1.0
    for _ in range(2 if timed else 1):
        conc = dataclasses.replace(schedule, segments=tuple((d / scale, c) for d, c in schedule.segments)) \
            if timed else schedule
        sim = BatchReplay(workload, profile, conc, requests=reqs, k_max=k_max, seed=seed)
        ctrl = PrefillFirst(controller)
        ctrl.reset(profile, k_max)
        drafts = accepted = 0
        while not sim.done:
            step = sim.step(ctrl.propose(sim.state()))
            ctrl.observe(step)
            drafts += int(step.planned_k.sum())
            accepted += int(step.accepted.sum())
        scale = (sim.now_ms + extra) / sim.now_ms
    total = sim.now_ms + extra
    return Prediction(sim.tokens / total * 1000.0, sim.tpot_ms() * scale, drafts, accepted, sim.steps, total)

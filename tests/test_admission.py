"""The admission schedule shared by the batch replay and the hook inside vLLM: by the clock, or in phases of
requests."""

from __future__ import annotations

import numpy as np
import pytest

from specgym.baselines.batch_rules import StaticK
from specgym.envs.core.admission import AdmissionSchedule, phases
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.engines.serving.vllm_hook import SchedulerHook
from specgym.envs.profiles import load_batch_profile
from specgym.errors import SpecgymError


def test_forms_and_round_trip():
    assert AdmissionSchedule.of(4) == AdmissionSchedule.constant(4)
    assert AdmissionSchedule.of(np.int64(4)).max_concurrency == 4
    timed = AdmissionSchedule.of([(100.0, 1), (200.0, 8)])
    assert timed.by == "time" and timed.changes and timed.max_concurrency == 8
    job = phases([2, 3], [1, 4])
    assert AdmissionSchedule.of(job.to_spec()) == job and AdmissionSchedule.of(timed.to_spec()) == timed
    with pytest.raises(SpecgymError, match="by must be one of"):
        AdmissionSchedule(((1.0, 1),), by="tokens")
    with pytest.raises(SpecgymError, match="lengths > 0"):
        phases([0], [1])
    with pytest.raises(SpecgymError, match="concurrencies >= 1"):
        AdmissionSchedule.of([(10.0, 0)])


def test_time_segments_cycle_and_phases_follow_submission_order():
    timed = AdmissionSchedule.of([(100.0, 1), (200.0, 8)])
    assert [timed.limit_at(t) for t in (50, 150, 290, 310, 450)] == [1, 8, 8, 1, 8]
    job = phases([2, 3], [1, 4])
    assert [job.phase_limit(j) for j in range(7)] == [1, 1, 4, 4, 4, 4, 4]  # the last phase holds beyond
    # one step admits each waiting request under its own phase's concurrency
    assert job.admissible(0.0, admitted=0, running=0, waiting=10) == 1
    assert job.admissible(0.0, admitted=1, running=1, waiting=10) == 0  # request 1 waits for phase 0's one slot
    assert job.admissible(0.0, admitted=1, running=0, waiting=10) == 4  # request 1, then three of phase 1
    assert job.admissible(0.0, admitted=2, running=1, waiting=10) == 3
    assert job.admissible(0.0, admitted=2, running=1, waiting=2) == 2
    assert timed.admissible(150.0, admitted=0, running=3, waiting=10) == 5


def test_the_replay_serves_each_phase_at_its_concurrency(mix_workload):
    prof = load_batch_profile("batch-cpu-midpair")
    job = phases([3, 8, 4], [1, 4, 2])
    sim = BatchReplay(mix_workload, prof, job, requests=np.arange(15), k_max=3)
    in_flight = []
    ctrl = StaticK(2)
    ctrl.reset(prof, 3)
    while not sim.done:
        in_flight.append((sim.next_req, len(sim.active_slots)))
        sim.step(ctrl.propose(sim.state()))
    # no step ever has more in flight than the phase of the last admitted request allows
    assert all(n <= job.phase_limit(max(admitted - 1, 0)) for admitted, n in in_flight)
    assert max(n for admitted, n in in_flight if admitted <= 3) == 1
    assert max(n for _, n in in_flight) == 4
    # and the last phase runs at 2, not 4, once the middle phase's sequences have drained
    assert any(n == 2 for admitted, n in in_flight if admitted == 15)
    with pytest.raises(SpecgymError, match="batch replay: admission schedule"):
        BatchReplay(mix_workload, prof, [(0.0, 2)], k_max=3)


def test_the_hook_admits_in_phases():
    hook = SchedulerHook(2)
    hook.configure(schedule=phases([2, 4], [1, 4]).to_spec())
    hook._t0 = 0.0
    assert hook.limit(0.0, 16, running=0, waiting=6) == 1
    hook.log.admit_s["a"] = 0.0
    assert hook.limit(0.1, 16, running=1, waiting=5) == 1  # request 1 is phase 0's: it waits for the one slot
    assert hook.limit(0.2, 16, running=0, waiting=5) == 4  # then phase 1 joins it, up to 4 in flight
    assert hook.limit(0.2, 16, running=0, waiting=2) == 2
    assert hook.limit(0.2, 3, running=0, waiting=5) == 3  # never above the engine's own limit
    with pytest.raises(ValueError, match="configure: admission schedule"):
        hook.configure(schedule={"by": "requests", "segments": [[0, 1]]})

"""Replay engine: round semantics, common random numbers, scalar == vectorised."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.replay import run_lengths
from specgym.envs.core.rounds import DraftStep
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.envs.workloads.synthetic import generate_workload, spec_with
from specgym.errors import SpecgymError

PROFILE = CostProfile("flat", draft_ms=1.0, verify_ms=(10.0,) * 17, source="synthetic")


def test_greedy_hand_trace_gives_hand_computed_rounds(make_trace):
    # positions:    0  1  2  3  4  5  6  7  8  9
    wl = make_trace([[1, 1, 0, 1, 1, 1, 1, 0, 1, 1]], PROFILE)
    req = TraceEngine(wl, k_max=4).start(0)
    o = req.play(4)  # drafts 0..3: 1,1,0 -> accepted 2, produced 3 -> i=3
    assert (o.position, o.planned_k, o.drafted, o.accepted, o.produced) == (0, 4, 4, 2, 3)
    assert o.time_ms == 4 * 1.0 + 10.0
    o = req.play(3)  # drafts 3,4,5 all accepted -> bonus -> produced 4 -> i=7
    assert (o.position, o.accepted, o.produced) == (3, 3, 4)
    o = req.play(0)  # plain AR step at 7
    assert (o.drafted, o.produced, o.time_ms) == (0, 1, 10.0)
    o = req.play(8)  # at 8: clip to N-i-1 = 1; drafts 8 -> accepted -> produced 2 -> i=10 done
    assert (o.planned_k, o.drafted, o.accepted, o.produced, o.done) == (1, 1, 1, 2, True)
    assert req.position == 10
    with pytest.raises(SpecgymError, match="already finished"):
        req.play(1)


def test_run_lengths_respect_request_boundaries():
    acc = np.array([1, 1, 0, 1, 1, 1, 0, 1], dtype=bool)
    np.testing.assert_array_equal(run_lengths(acc, np.array([0, 5, 8])), [2, 1, 0, 2, 1, 1, 0, 1])


def test_token_level_stop_and_features(make_trace):
    wl = make_trace([[1, 1, 1, 1, 1, 1]], PROFILE)
    req = TraceEngine(wl, k_max=8).start(0)
    seen: list[DraftStep] = []

    def stop_after_two(step: DraftStep) -> bool:
        seen.append(step)
        return step.index < 2

    o = req.play(5, stop_after_two)
    assert o.drafted == 2 and o.accepted == 2 and o.produced == 3 and o.planned_k == 5
    assert [s.index for s in seen] == [1, 2] and seen[0].cap == 5 and seen[1].position == 1
    np.testing.assert_allclose(o.draft_conf, wl.draft_conf[:2])


@settings(max_examples=60, deadline=None)
@given(
    ps=st.lists(st.lists(st.sampled_from([0.0, 1.0, 0.3, 0.9]), min_size=1, max_size=40), min_size=1, max_size=4),
    ks=st.lists(st.integers(0, 10), min_size=1, max_size=30),
    seed=st.integers(0, 1000),
)
def test_replay_invariants(make_trace, ps, ks, seed):
    wl = make_trace(ps, PROFILE, temperature=0.8)
    eng = TraceEngine(wl, k_max=8, seed=seed)
    for r in range(wl.n_requests):
        req = eng.start(r)
        n = 0
        while not req.done:
            k = ks[n % len(ks)]
            o = req.play(k)
            assert 0 <= o.accepted <= o.drafted <= o.planned_k <= min(k, 8)
            assert o.produced == o.accepted + 1
            assert o.planned_k <= req.length - o.position - 1
            if k == 0:
                assert o.produced == 1 and o.time_ms == eng.t_ar
            n += 1
        assert req.position == req.length  # ends exactly at N


@settings(max_examples=25, deadline=None)
@given(k=st.integers(0, 8), seed=st.integers(0, 10_000))
def test_scalar_and_vectorised_agree(k, seed):
    wl = generate_workload("speclane-mix", 12, seed=seed % 7)
    eng = TraceEngine(wl, k_max=8, seed=seed)
    vec = VectorReplay(eng)
    vec.run_fixed(k)
    for r in range(wl.n_requests):
        req, t, rounds, acc = eng.start(r), 0.0, 0, 0
        while not req.done:
            o = req.play(k)
            t, rounds, acc = t + o.time_ms, rounds + 1, acc + o.accepted
        assert vec.time_ms[r] == pytest.approx(t)
        assert vec.rounds[r] == rounds and vec.accepted_total[r] == acc


def test_vectorised_token_stops_match_scalar():
    wl = generate_workload("speclane-mix", 10, seed=3)
    eng = TraceEngine(wl, k_max=8, seed=5)
    vec = VectorReplay(eng)
    drafted_plan = np.array([3, 1, 2, 5, 0, 4, 2, 1, 6, 3])
    while vec.active.any():
        vec.step(8, drafted=drafted_plan)
    for r in range(wl.n_requests):
        req, t = eng.start(r), 0.0
        while not req.done:
            stop_at = drafted_plan[r]
            t += req.play(8, lambda s, m=stop_at: s.index < m).time_ms if stop_at > 0 else req.play(0).time_ms
        assert vec.time_ms[r] == pytest.approx(t)


def test_common_random_numbers_are_per_request_and_seeded():
    wl = generate_workload("geometric", 20, seed=0)
    a = TraceEngine(wl, seed=1).request_runs(5)
    b = TraceEngine(wl.subset([5, 6]), seed=1).request_runs(0)  # same request id -> same draws
    c = TraceEngine(wl, seed=2).request_runs(5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("alpha,k", [(0.5, 2), (0.7, 4), (0.85, 6), (0.7, 0)])
def test_fixed_k_matches_geometric_expectation(alpha, k):
    """Mean tokens per round of fixed K on a geometric trace = (1 - a^(K+1)) / (1 - a), within sampling error."""
    wl = generate_workload(spec_with("geometric", categories=(type(
        spec_with("geometric").categories[0])("steady", 1.0, alpha, 0.0),), min_len=2000, max_len=2000), 60, seed=1)
    vec = VectorReplay(TraceEngine(wl, k_max=8, seed=11))
    produced = []
    while vec.active.any():
        act = vec.active.copy()
        cap, d, acc = vec.step(k)
        full = act & (cap == k)  # rounds not clipped by the end of the request
        produced.append(acc[full] + 1)
    produced = np.concatenate(produced)
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    sem = produced.std() / np.sqrt(len(produced))
    assert abs(produced.mean() - expected) < 4 * sem + 1e-9


def test_bad_k_max(make_trace):
    wl = make_trace([[1, 0]], PROFILE)
    for bad in (0, -1, 17, 2.5):
        with pytest.raises(SpecgymError, match="k_max must be an integer in \\[1, 16\\]"):
            TraceEngine(wl, k_max=bad)
    short = CostProfile("s", 1.0, (10.0, 10.0, 10.0))
    with pytest.raises(SpecgymError, match="needs k_max\\+1"):
        TraceEngine(wl, profile=short, k_max=4)

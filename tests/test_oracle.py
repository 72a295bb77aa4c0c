"""The clairvoyant oracle: DP correctness, vectorisation, and that nothing beats it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specgym.baselines.oracle import oracle_plan, oracle_time_one, oracle_times, run_lengths
from specgym.envs.core.cost import CostProfile
from specgym.errors import SpecgymError


def rt_flat(k_max: int, draft: float = 3.8, verify: float = 31.0, overhead: float = 0.0) -> np.ndarray:
    return CostProfile("t", draft, (verify,) * (k_max + 1), overhead).round_times(k_max)


def runs_of(accepted) -> np.ndarray:
    acc = np.asarray(accepted, dtype=bool)
    return run_lengths(acc, np.array([0, acc.size]))


def play(run, rt, k_max, ks) -> float:
    """Time of playing the K sequence ``ks`` (cycled, clipped like the engine) on known outcomes."""
    n, i, t, step = len(run), 0, 0.0, 0
    while i < n:
        k = min(ks[step % len(ks)], k_max, n - i - 1)
        t += rt[k]
        i += min(int(run[i]), k) + 1
        step += 1
    return t


def brute_force(run, rt, k_max, i=0) -> float:
    """Exhaustive recursion over every K at every round (no memo)."""
    n = len(run)
    if i >= n:
        return 0.0
    ks = range(min(k_max, n - i - 1) + 1)
    return min(rt[k] + brute_force(run, rt, k_max, i + min(int(run[i]), k) + 1) for k in ks)


def test_run_lengths_naive():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 12, 30)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    acc = rng.uniform(size=offsets[-1]) < 0.7
    run = run_lengths(acc, offsets)
    for r in range(30):
        a = acc[offsets[r]: offsets[r + 1]]
        for i in range(a.size):
            j = i
            while j < a.size and a[j]:
                j += 1
            assert run[offsets[r] + i] == j - i


def test_oracle_equals_brute_force_on_short_requests():
    rng = np.random.default_rng(1)
    for _ in range(60):
        n = int(rng.integers(1, 9))
        k_max = int(rng.integers(1, 4))
        run = runs_of(rng.uniform(size=n) < rng.uniform())
        rt = np.concatenate([[rng.uniform(5, 20)], rng.uniform(5, 40, k_max)])  # arbitrary costs, even non-monotone
        want = brute_force(run, rt, k_max)
        assert oracle_time_one(run, rt, k_max) == pytest.approx(want, rel=1e-12)
        assert oracle_times(run, np.array([0, n]), rt, k_max)[0] == pytest.approx(want, rel=1e-12)
        assert play(run, rt, k_max, oracle_plan(run, rt, k_max) + [0]) == pytest.approx(want, rel=1e-12)


def test_k0_when_drafting_cannot_pay_off():
    rt = rt_flat(8)
    run = runs_of(np.zeros(20, dtype=bool))  # alpha = 0 everywhere, draft cost > 0
    assert oracle_plan(run, rt, 8) == [0] * 20
    assert oracle_time_one(run, rt, 8) == pytest.approx(20 * 31.0)


def test_last_position_only_k0_and_full_acceptance():
    rt = rt_flat(8)
    # 18 tokens, all accepted: exactly two K=8 rounds (9 tokens each)
    assert oracle_plan(runs_of(np.ones(18, dtype=bool)), rt, 8) == [8, 8]
    # 19 tokens: 3 rounds drafting 16 tokens in all (e.g. 8, 8, then the last token alone with K clipped to 0)
    assert oracle_time_one(runs_of(np.ones(19, dtype=bool)), rt, 8) == pytest.approx(16 * 3.8 + 3 * 31)
    assert oracle_plan(runs_of([True]), rt, 8) == [0]  # i == N-1: only K = 0
    assert oracle_time_one(runs_of([True]), rt, 8) == 31.0


def test_vectorised_equals_per_request():
    rng = np.random.default_rng(2)
    lengths = np.concatenate([[1, 2, 1], rng.integers(1, 80, 200)])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    alpha = np.repeat(rng.uniform(0, 1, lengths.size), lengths)
    run = run_lengths(rng.uniform(size=offsets[-1]) < alpha, offsets)
    for k_max, rt in ((8, rt_flat(8, overhead=2.0)), (3, np.array([10.0, 12.0, 15.0, 30.0])),
                      (16, np.linspace(20, 60, 17))):
        got = oracle_times(run, offsets, rt, k_max)
        want = [oracle_time_one(run[offsets[r]: offsets[r + 1]], rt, k_max) for r in range(lengths.size)]
        np.testing.assert_array_equal(got, want)


def test_oracle_errors():
    run = np.zeros(5, dtype=np.int64)
    with pytest.raises(SpecgymError):
        oracle_times(run, np.array([0, 4]), rt_flat(8), 8)
    with pytest.raises(SpecgymError):
        oracle_times(run, np.array([0, 5]), rt_flat(4), 8)
    assert oracle_times(np.zeros(0, dtype=np.int64), np.array([0]), rt_flat(8), 8).shape == (0,)


@settings(max_examples=150, deadline=None)
@given(
    accepted=st.lists(st.booleans(), min_size=1, max_size=40),
    ks=st.lists(st.integers(0, 8), min_size=1, max_size=12),
    k_max=st.integers(1, 8),
    draft=st.floats(0.0, 20.0),
    verify=st.lists(st.floats(5.0, 60.0), min_size=9, max_size=9),
    overhead=st.floats(0.0, 5.0),
)
def test_oracle_beats_any_k_sequence(accepted, ks, k_max, draft, verify, overhead):
    rt = CostProfile("h", draft, tuple(verify), overhead).round_times(k_max)
    run = runs_of(accepted)
    best = oracle_times(run, np.array([0, run.size]), rt, k_max)[0]
    assert best <= play(run, rt, k_max, ks) * (1 + 1e-12)
    assert best == pytest.approx(play(run, rt, k_max, oracle_plan(run, rt, k_max)), rel=1e-12)

"""The informed oracle: expected-time optimality (brute force), vectorisation, equality with the clairvoyant oracle
on greedy traces, and that the clairvoyant oracle bounds it on sampled ones."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specgym.baselines.informed_oracle import informed_plan, informed_value_one
from specgym.baselines.oracle import oracle_times, run_lengths
from specgym.envs.core.cost import CostProfile
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.errors import SpecgymError
from specgym.eval.harness import INFORMED, EvalConfig, evaluate
from specgym.eval.runner import run_plan_vectorised


def play(run, rt, ks_at) -> float:
    """Time of a schedule on known outcomes: ``ks_at(i, round)`` gives K (already within the room)."""
    n, i, t, step = len(run), 0, 0.0, 0
    while i < n:
        k = ks_at(i, step)
        t += rt[k]
        i += min(int(run[i]), k) + 1
        step += 1
    return t


def outcomes(p) -> list[tuple[float, np.ndarray]]:
    """Every acceptance outcome of the N positions with its chance, as (probability, run lengths)."""
    n, out = len(p), []
    for bits in itertools.product((False, True), repeat=n):
        prob = float(np.prod([pi if b else 1.0 - pi for pi, b in zip(p, bits)]))
        if prob > 0:
            out.append((prob, run_lengths(np.array(bits), np.array([0, n]))))
    return out


def expected(cases, rt, ks_at) -> float:
    """Exact expected time of a schedule over the weighted outcomes."""
    return sum(prob * play(run, rt, ks_at) for prob, run in cases)


def random_case(rng, n_max=6, k_max_max=3):
    n = int(rng.integers(1, n_max + 1))
    k_max = int(rng.integers(1, k_max_max + 1))
    p = rng.uniform(size=n) ** rng.uniform(0.3, 3)
    p[rng.uniform(size=n) < 0.2] = rng.choice([0.0, 1.0])  # certain positions too
    rt = np.concatenate([[rng.uniform(5, 20)], rng.uniform(5, 40, k_max)])  # arbitrary costs, even non-monotone
    return p, rt, k_max


def test_dp_is_optimal_in_expectation_against_brute_force():
    """Min over every position -> K policy of the exact expected time equals V(0); no open-loop K sequence (one K per
    round, whatever happened) does better; the vectorised DP equals the reference."""
    rng = np.random.default_rng(0)
    for _ in range(25):
        p, rt, k_max = random_case(rng)
        n = len(p)
        room = [min(k_max, n - i - 1) for i in range(n)]
        value, choice = informed_value_one(p, rt, k_max)
        cases = outcomes(p)
        policies = itertools.product(*[range(r + 1) for r in room])
        best = min(expected(cases, rt, lambda i, _s, pol=pol: pol[i]) for pol in policies)
        assert value == pytest.approx(best, rel=1e-12)
        assert expected(cases, rt, lambda i, _s: choice[i]) == pytest.approx(value, rel=1e-12)
        if (k_max + 1) ** n <= 1000:
            for seq in itertools.product(range(k_max + 1), repeat=n):
                assert value <= expected(cases, rt, lambda i, s, seq=seq: min(seq[s], room[i])) * (1 + 1e-12)
        plan = informed_plan(p, np.array([0, n]), rt, k_max)
        assert plan.expected_ms[0] == pytest.approx(value, rel=1e-12)
        assert plan.choice.tolist() == choice


def test_vectorised_equals_per_request():
    rng = np.random.default_rng(1)
    lengths = np.concatenate([[1, 2, 1], rng.integers(1, 60, 150)])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    p = rng.uniform(size=offsets[-1]) ** np.repeat(rng.uniform(0.2, 3, lengths.size), lengths)
    for k_max, rt in ((8, CostProfile("t", 3.8, (31.0,) * 9, 2.0).round_times(8)),
                      (3, np.array([10.0, 12.0, 15.0, 30.0])), (16, np.linspace(20, 60, 17))):
        plan = informed_plan(p, offsets, rt, k_max)
        for r in range(lengths.size):
            sl = slice(offsets[r], offsets[r + 1])
            value, choice = informed_value_one(p[sl], rt, k_max)
            assert plan.expected_ms[r] == pytest.approx(value, rel=1e-12)
            assert plan.choice[sl].tolist() == choice


def test_equals_clairvoyant_on_greedy_traces():
    """p in {0, 1}: the expectation is the outcome, so the DP values and the played times equal the clairvoyant
    oracle's, request by request."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 120, 300)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    p = (rng.uniform(size=offsets[-1]) < np.repeat(rng.uniform(0, 1, lengths.size), lengths)).astype(float)
    for k_max, rt in ((8, CostProfile("t", 3.8, (31.0,) * 9, 2.0).round_times(8)),
                      (4, np.array([10.0, 12.0, 15.0, 30.0, 31.0]))):
        clairvoyant = oracle_times(run_lengths(p > 0.5, offsets), offsets, rt, k_max)
        np.testing.assert_array_equal(informed_plan(p, offsets, rt, k_max).expected_ms, clairvoyant)


def test_report_rows_equal_on_a_greedy_workload(mix_workload):
    rep = evaluate(EvalConfig(workload=mix_workload, controllers="fixed:3", split="all", max_requests=60,
                              bootstrap=0, per_request=True))
    inf, orc = rep["informed_oracle"], rep["oracle"]
    assert inf["throughput_tok_s"] == pytest.approx(orc["throughput_tok_s"], rel=1e-12)
    np.testing.assert_allclose(rep["per_request_time_ms"][INFORMED], rep["per_request_time_ms"]["oracle"],
                               rtol=1e-12)
    assert rep["headroom"]["chance_tok_s"] == pytest.approx(0.0, abs=1e-9)
    for t in rep["traces"].values():
        assert [k for _, k, _, _ in t["informed"]] == [k for _, k, _, _ in t["oracle"]]


@pytest.mark.parametrize("workload", ["geometric", "midpair-t08"])
def test_clairvoyant_bounds_informed_on_sampled_traces(workload):
    from specgym.envs.workloads.synthetic import generate_workload

    wl, split = (generate_workload("geometric", 80, seed=0), "all") if workload == "geometric" else (workload, "test")
    rep = evaluate(EvalConfig(workload=wl, controllers="fixed:2,marginal", split=split, bootstrap=0,
                              per_request=True))
    times = rep["per_request_time_ms"]
    assert (times[INFORMED] >= times["oracle"] * (1 - 1e-12)).all()  # same draws: request by request
    inf, orc, h = rep["informed_oracle"], rep["oracle"], rep["headroom"]
    assert inf["throughput_tok_s"] < orc["throughput_tok_s"]
    assert inf["expected_time_ms"] == pytest.approx(inf["total_time_ms"], rel=0.05)
    if workload == "midpair-t08":  # acceptance varies along each request: a wide margin over the best fixed K
        assert inf["throughput_tok_s"] > 1.1 * h["best_fixed_tok_s"]
    assert h["chance_tok_s"] == pytest.approx(orc["throughput_tok_s"] - inf["throughput_tok_s"])
    for row in rep["rows"]:
        assert row["prediction_decision_tok_s"] == pytest.approx(inf["throughput_tok_s"] - row["throughput_tok_s"])
        assert row["informed_ratio"] == pytest.approx(inf["total_time_ms"] / row["total_time_ms"])
        if row["headroom_closed_informed"] is not None:
            # the informed share of the headroom = the clairvoyant share / the informed oracle's own share
            assert row["headroom_closed_informed"] == pytest.approx(row["headroom_closed"] / inf["headroom_closed"])
    assert h["chance_share"] == pytest.approx(1.0 - inf["headroom_closed"])


def test_plan_played_with_the_engine_draws():
    """The vectorised play of the plan equals the scalar replay of the same K per position (same draws)."""
    from specgym.envs.workloads.synthetic import generate_workload

    wl = generate_workload("geometric", 40, seed=3)
    engine = TraceEngine(wl, k_max=8, seed=5)
    requests = np.array([7, 3, 21, 0, 39])
    sub = wl.subset(requests)
    plan = informed_plan(sub.p_accept, sub.offsets, engine.round_times, 8)
    res = run_plan_vectorised(engine, requests, plan.choice, sub.offsets, INFORMED)
    for m, r in enumerate(requests.tolist()):
        req, choice, t = engine.start(r), plan.choice[sub.span(m)], 0.0
        while not req.done:
            t += req.play(int(choice[req.position])).time_ms
        assert res.time_ms[m] == pytest.approx(t, rel=1e-12)
    assert (res.tokens == sub.lengths).all()


def test_errors():
    rt = np.array([10.0, 12.0, 14.0])
    with pytest.raises(SpecgymError):
        informed_plan(np.array([0.5, 1.2]), np.array([0, 2]), rt, 2)
    with pytest.raises(SpecgymError):
        informed_plan(np.array([0.5, 0.2]), np.array([0, 3]), rt, 2)
    with pytest.raises(SpecgymError):
        informed_plan(np.array([0.5]), np.array([0, 1]), rt, 3)
    empty = informed_plan(np.zeros(0), np.array([0]), rt, 2)
    assert empty.choice.shape == (0,) and empty.expected_ms.shape == (0,)

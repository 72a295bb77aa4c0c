"""The cost form: classic profiles unchanged bit for bit, the context term, per-step overhead, named drafters, the
published linear H100 profile and its batched view, and every pricer (replay, vector replay, batch replay, the
oracles, the economics) following the KV cache. Traces are SYNTHETIC."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_runs import per_start_workload

import specgym.catalogue as catalogue
from specgym.baselines.fixed import FixedK
from specgym.baselines.informed_oracle import informed_plan, informed_value_one
from specgym.baselines.oracle import oracle_time_one, oracle_times
from specgym.envs.core.cost import CostProfile, ForwardCost
from specgym.envs.core.economics import RoundCosts
from specgym.envs.core.request import drive
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.envs.profiles import load_batch_profile, load_profile
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate

H100 = load_profile("h100-llama31-8b")
# the published constants (seconds), as the shared README states them
C_KV, C_TOK, C_0 = 3.92645679e-08, 2.10103129e-05, 5.88590713e-03
D_KV, D_SPEC, D_0 = 2.37768493e-09, 8.41429603e-07, 2.13526175e-03
NGRAM, OVER = 0.005875, 1.20683946e-03


def _forward_s(kv, tokens):
    return C_KV * kv + C_TOK * tokens + C_0


@pytest.mark.parametrize("name", [n for n in catalogue.names("profile") if n != "h100-llama31-8b"])
def test_classic_profiles_price_exactly_as_before(name):
    """Every shipped classic profile: the round table is the classic formula bit for bit, no context term, and its
    JSON round-trips unchanged (workload metadata and reports keep their bytes)."""
    prof = load_profile(name)
    table = prof.round_table(prof.max_k)
    classic = [prof.verify_ms[0]] + [d * prof.draft_ms + prof.verify_ms[d] + prof.round_overhead_ms
                                     for d in range(1, prof.max_k + 1)]
    assert table.base.tolist() == classic and not table.has_context and not prof.has_context
    assert prof.t_ar_ms == prof.verify_ms[0]
    raw = json.loads(catalogue.resolve("profile", name).read_text())
    assert prof.to_dict() == raw


def test_the_h100_profile_is_the_published_model():
    ms = 1e3
    assert H100.source == "published" and "arXiv:2601.11580" in H100.description
    assert H100.drafter_names == ("eagle", "ngram") and H100.has_context
    assert H100.t_ar_ms == pytest.approx((_forward_s(0, 1) + OVER) * ms, rel=1e-12)
    for kv in (0, 300, 5000):
        for k in (1, 4, 10):
            eagle = _forward_s(kv, k + 1) + D_KV * kv + D_SPEC * (k + 1) + D_0 + OVER
            assert H100.round_time(k, kv, "eagle") == pytest.approx(eagle * ms, rel=1e-12)
            ngram = _forward_s(kv, k + 1) * (1 + NGRAM) + OVER
            assert H100.round_time(k, kv, "ngram") == pytest.approx(ngram * ms, rel=1e-12)
        assert H100.round_time(0, kv) == pytest.approx((_forward_s(kv, 1) + OVER) * ms, rel=1e-12)
        base, per_kv = H100.round_table(8, "eagle").spec0  # a speculative round that drafts nothing
        assert base + per_kv * kv == pytest.approx((_forward_s(kv, 1) + D_KV * kv + D_SPEC + D_0 + OVER) * ms,
                                                   rel=1e-12)
    assert CostProfile.from_dict(H100.to_dict()) == H100


def test_copies_and_the_batched_view_are_one_form():
    """``copies(b)`` (b sequences in lockstep as one request) and the batched step price the same step; the batched
    view loads from the same file as a BatchCostProfile."""
    for b in (1, 8, 128):
        c = H100.copies(b)
        for d, kv in ((0, 100), (3, 100), (7, 2000)):
            step = H100.batch_step_ms(b * kv, b * (d + 1), d, speculative=d > 0)
            assert c.round_time(d, kv) == pytest.approx(float(step), rel=1e-12)
    bp = load_batch_profile("h100-llama31-8b")
    assert bp.linear == H100 and bp.max_k == H100.max_k
    for b in (1, 4, 64):
        for k in (0, 2, 6):
            assert bp.step_time(b, k) == pytest.approx(float(H100.batch_step_ms(0, b * (k + 1), k,
                                                                                speculative=k > 0)), rel=1e-9)
    assert bp.step_time(1, 3) == pytest.approx(H100.round_time(3), rel=1e-12)


def test_capture_size_padding():
    f = ForwardCost(0.0, 1.0, 10.0, (1, 2, 4, 8, 16))
    assert [f.padded(t) for t in (1, 3, 5, 16, 17)] == [1, 4, 8, 16, 17]
    np.testing.assert_array_equal(f.padded(np.array([3, 9, 40])), [4, 16, 40])
    assert f.base_ms(5) == 18.0


def test_replay_prices_the_kv_cache_of_every_round():
    wl = per_start_workload(12, seed=7)
    eng = TraceEngine(wl, H100, k_max=16)
    table = eng.table  # drafter "a" (a model) is priced as the profile's model drafter, eagle
    assert table.base.tolist() == H100.round_table(16, "eagle").base.tolist()
    for r in range(wl.n_requests):
        req = eng.start(r)
        while not req.done:
            i = req.position
            o = req.play(5)
            kv = int(wl.prompt_len[r]) + i
            assert o.time_ms == pytest.approx(table.base[o.drafted] + table.per_kv[o.drafted] * kv, rel=1e-12)
    for k in (0, 3, 12):
        v = VectorReplay(eng)
        v.run_fixed(k)
        for r in range(wl.n_requests):
            assert drive(FixedK(k), eng.start(r)).time_ms == pytest.approx(v.time_ms[r], rel=1e-12)


def test_the_oracles_follow_the_kv_cache(make_trace):
    """The vectorised DPs equal the plain-Python ones with a context term, and the clairvoyant oracle is no slower than
    any fixed K; on a greedy trace the informed oracle equals the clairvoyant one."""
    rng = np.random.default_rng(0)
    wl = make_trace([(rng.random(n) < 0.7).astype(float) for n in (9, 31, 4, 60)], H100)
    eng = TraceEngine(wl, H100, k_max=12, seed=3)
    table = eng.table
    got = oracle_times(eng.runs(), wl.offsets, table, 12, kv0=wl.prompt_len)
    plan = informed_plan(wl.p_accept, wl.offsets, table, 12, kv0=wl.prompt_len)
    for r in range(wl.n_requests):
        run = eng.runs()[wl.span(r)]
        assert got[r] == pytest.approx(oracle_time_one(run, table, 12, float(wl.prompt_len[r])), rel=1e-12)
        v, _ = informed_value_one(wl.p_accept[wl.span(r)], table, 12, float(wl.prompt_len[r]))
        assert plan.expected_ms[r] == pytest.approx(v, rel=1e-12)
        assert got[r] == pytest.approx(plan.expected_ms[r], rel=1e-12)  # greedy: the same oracle
    for k in range(13):
        v = VectorReplay(eng)
        v.run_fixed(k)
        assert (got <= v.time_ms + 1e-9).all()
    with pytest.raises(SpecgymError, match="needs kv0"):
        oracle_times(eng.runs(), wl.offsets, table, 12)


def test_batch_replay_prices_steps_with_the_linear_model():
    wl = per_start_workload(8, seed=8)
    bp = load_batch_profile("h100-llama31-8b")
    eng = TraceEngine(wl, H100, k_max=16)
    for k in (0, 4):
        br = BatchReplay(wl, bp, concurrency=1, k_max=16)
        br.run_fixed(k)
        v = VectorReplay(eng)
        v.run_fixed(k)
        assert br.now_ms == pytest.approx(float(v.time_ms.sum()), rel=1e-9)
    big = BatchReplay(wl, bp, concurrency=4, k_max=16)
    big.run_fixed(3)
    assert big.tokens == wl.n_positions and big.now_ms > 0


def test_round_costs_follow_the_cache_and_the_evaluation_uses_the_plain_run_as_ar():
    costs = RoundCosts(H100, 8)
    before = list(costs.cost)
    costs.at_context(4000)
    assert all(c > b for c, b in zip(costs.cost, before)) and costs.t_ar == costs.cost[0]
    flat = RoundCosts(load_profile("cpu-midpair"), 8)
    flat.at_context(4000)
    assert not flat.has_context and flat.cost[0] == load_profile("cpu-midpair").verify_ms[0]
    wl = per_start_workload(20, seed=9)
    rep = evaluate(EvalConfig(workload=wl, controllers="marginal,fixed:2", split="all", k_max=16, bootstrap=0,
                              profile="h100-llama31-8b"))
    rows = {r["controller"]: r for r in rep["rows"]}
    t0 = rep["reference"]["fixed_time_ms"]["0"]
    assert rows["fixed:2"]["speedup_vs_ar"] == pytest.approx(t0 / rows["fixed:2"]["total_time_ms"], rel=1e-12)


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d | {"drafters": {"eagle": {"kind": "tree"}}}, "field 'kind' must be one of"),
    (lambda d: d | {"drafters": {"eagle": {"fixed": 1.0}}}, "unknown field(s) 'fixed'"),
    (lambda d: d | {"verify_ms": [1.0, 2.0]}, "derives 'verify_ms'"),
    (lambda d: d | {"forward": {"fixed_ms": 1.0}}, "missing field 'forward.per_kv_token_ms'"),
    (lambda d: d | {"step_overhead_ms": -1}, "field 'step_overhead_ms' must be >= 0"),
])
def test_profile_defects_are_one_line(change, fragment):
    with pytest.raises(SpecgymError) as exc:
        CostProfile.from_dict(change(H100.to_dict()), where="p.json")
    assert fragment in str(exc.value) and "p.json" in str(exc.value) and "\n" not in str(exc.value)


def test_a_drafter_the_profile_does_not_name():
    assert H100.draft_cost("draft") == H100.draft_cost("eagle")  # a per-position trace's drafter: the default
    assert H100.pricing_drafter("mine", "lookup") == "ngram" and H100.pricing_drafter("mine", "model") == "eagle"
    with pytest.raises(SpecgymError, match="prices drafters eagle, ngram, not 'medusa'"):
        H100.draft_cost("medusa")
    assert load_profile("cpu-midpair").draft_cost("ngram").per_token_ms == load_profile("cpu-midpair").draft_ms

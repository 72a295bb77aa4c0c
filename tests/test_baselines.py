"""Rule-by-rule tests of the baseline controllers (the spec table itself: tests/test_specs.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specgym import make_controller
from specgym.agents.specs import expand
from specgym.baselines import (
    ASSC,
    ConfidenceStop,
    Controller,
    CumulativeStop,
    EntropyStop,
    FixedK,
    HFHeuristic,
    SpecLane,
    UCBBandit,
)
from specgym.baselines.confidence import roc_threshold
from specgym.baselines.speclane import (
    gain,
    lambert_wm1,
    optimal_k_closed_form,
    optimal_k_enumerate,
    optimal_k_real,
)
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.errors import SpecgymError


def ctx(k_max: int = 8, draft_ms: float = 3.8, verify: float | list[float] = 31.0, overhead: float = 0.0):
    vm = [verify] * (k_max + 1) if isinstance(verify, float) else list(verify)
    return RequestContext("r0", "chat", 0.0, 16, k_max, CostProfile("t", draft_ms, tuple(vm), overhead))


def out(planned_k, drafted=None, accepted=0, time_ms=None, conf=None, ent=None, position=0):
    drafted = planned_k if drafted is None else drafted
    time_ms = 31.0 + 3.8 * drafted if time_ms is None else time_ms
    conf = np.full(drafted, 0.5) if conf is None else np.asarray(conf, dtype=np.float64)
    ent = np.full(drafted, 0.5) if ent is None else np.asarray(ent, dtype=np.float64)
    return RoundOutcome(position, planned_k, drafted, accepted, accepted + 1, time_ms, conf, ent)


def drafted_by(c: Controller, confs, ents=None, cap=None) -> int:
    """Play the engine's draft loop on one round: keep_drafting after tokens j = 1..cap-1."""
    cap = c.propose() if cap is None else cap
    ents = [0.0] * len(confs) if ents is None else ents
    for j in range(1, cap + 1):
        if j == cap or not c.keep_drafting(DraftStep(j, cap, j - 1, confs[j - 1], ents[j - 1])):
            return j
    return 0


# ----------------------------------------------------------------------------------------------------- FixedK
def test_fixed_k_and_clip():
    c = FixedK(4)
    c.reset(ctx())
    assert (c.propose(), c.name, c.token_level) == (4, "fixed:4", False)
    c.reset(ctx(k_max=3))
    assert c.propose() == 3
    with pytest.raises(SpecgymError):
        FixedK(-1)


# ------------------------------------------------------------------------------------------------------- ASSC
def test_assc_promotes_only_after_two_high_full_rounds():
    c = ASSC()
    c.reset(ctx())
    assert c.propose() == 4 and c.name == "assc"
    c.observe(out(4, accepted=4))  # ema 0.825 < 0.85: no streak
    assert (c.propose(), c.streak) == (4, 0)
    c.observe(out(4, accepted=4))  # ema 0.8775 >= 0.85, a == K: streak 1
    assert (c.propose(), c.streak) == (4, 1)
    c.observe(out(4, accepted=4))  # streak 2 -> K + 1
    assert (c.propose(), c.streak) == (5, 0)
    assert c.alpha_ema == pytest.approx(0.7 * (0.7 * (0.7 * 0.75 + 0.3) + 0.3) + 0.3)


def test_assc_streak_broken_by_partial_round():
    c = ASSC()
    c.reset(ctx())
    for _ in range(2):
        c.observe(out(4, accepted=4))
    assert c.streak == 1
    c.observe(out(4, accepted=3))  # ema stays high but a < K: balance branch resets the streak
    assert (c.propose(), c.streak) == (4, 0)
    c.observe(out(4, accepted=4))
    assert (c.propose(), c.streak) == (4, 1)


def test_assc_halves_on_zero_acceptance():
    c = ASSC(init_k=7)
    c.reset(ctx())
    c.observe(out(7, accepted=0))
    assert c.propose() == 3
    c.observe(out(3, accepted=0))
    assert c.propose() == 2  # floor at k_min = 2


def test_assc_steps_down_below_050_not_045():
    c = ASSC()
    c.reset(ctx())
    c.observe(out(4, accepted=1))  # ema = 0.6
    assert c.propose() == 4
    c.observe(out(4, accepted=1))  # ema = 0.495: in [0.45, 0.50) -> the code's 0.50 threshold fires
    assert c.alpha_ema == pytest.approx(0.495)
    assert c.propose() == 3


def test_assc_uses_clipped_planned_k_and_resets():
    c = ASSC()
    c.reset(ctx())
    for _ in range(3):
        c.observe(out(2, accepted=2))  # engine clipped 4 -> 2 near the end; 2/2 is full acceptance
    assert c.propose() == 5
    c.observe(out(0, accepted=0))  # planned_k == 0: skipped, no halving
    assert c.propose() == 5
    c.reset(ctx(k_max=3))
    assert (c.propose(), c.alpha_ema, c.streak) == (3, 0.75, 0)


# ------------------------------------------------------------------------------------------------ HFHeuristic
def test_hf_heuristic_plus2_minus1_cap_and_reset():
    c = HFHeuristic()
    c.reset(ctx())
    assert c.propose() == 5
    c.observe(out(5, accepted=5))
    assert c.propose() == 7
    c.observe(out(7, accepted=7))
    assert c.propose() == 8  # capped at k_max
    c.observe(out(8, accepted=3))
    assert c.propose() == 7
    for _ in range(10):
        c.observe(out(c.propose(), accepted=0))
    assert c.propose() == 1
    c.observe(out(1, drafted=1, accepted=1))
    assert c.propose() == 3
    c.observe(out(3, drafted=0, accepted=0))  # no drafted tokens: no evidence, no change
    assert c.propose() == 3
    c.reset(ctx())
    assert c.propose() == 5


def test_hf_heuristic_compares_with_drafted_not_cap():
    c = HFHeuristic()
    c.reset(ctx())
    c.observe(out(5, drafted=2, accepted=2))  # stopped early, all drafted accepted -> +2
    assert c.propose() == 7


# --------------------------------------------------------------------------------------------------- SpecLane
def test_speclane_explores_each_arm_once_then_ucb1():
    c = SpecLane()
    cx = ctx()
    c.reset(cx)
    rewards = {2: 1.2, 4: 1.5, 6: 1.1, 8: 0.9}
    seen = []
    for _ in range(4):
        k = c.propose()
        seen.append(k)
        # produced = 1 (accepted 0); time chosen so that reward = produced * t_AR / time = rewards[k]
        c.observe(out(k, accepted=0, time_ms=31.0 / rewards[k]))
    assert seen == [2, 4, 6, 8]
    assert c.in_warmup
    # fifth pick: argmax mean + sqrt(2 ln t / n) with t = 4, n = 1 -> arm 4
    bonus = math.sqrt(2 * math.log(4))
    assert c.propose() == max(rewards, key=lambda k: rewards[k] + bonus) == 4
    c.observe(out(4, accepted=0, time_ms=31.0 / 0.5))  # arm 4 now mean 1.0, n = 2
    ucb = {k: rewards[k] + math.sqrt(2 * math.log(5)) for k in (2, 6, 8)}
    ucb[4] = 1.0 + math.sqrt(2 * math.log(5) / 2)
    assert c.propose() == max(ucb, key=ucb.get) == 2


def test_speclane_switches_to_model_after_32_tokens():
    c = SpecLane()
    c.reset(ctx())
    generated, rounds = 0, 0
    while generated < 32:  # full acceptance: arms 2, 4, 6, 8 produce 3, 5, 7, 9 tokens
        assert c.in_warmup
        k = c.propose()
        assert k in (2, 4, 6, 8)
        c.observe(out(k, accepted=k))
        generated += k + 1
        rounds += 1
    assert rounds >= 4 and not c.in_warmup
    expected = optimal_k_closed_form(c.alpha, 3.8, 31.0, 1, 8)
    assert c.propose() == expected == c.best_k(c.alpha)
    c.reset(ctx())
    assert c.in_warmup and c.propose() == 2  # warm-up restarts with each request


def test_speclane_ema_positions_reached():
    c = SpecLane()
    c.reset(ctx())
    c.observe(out(4, accepted=2))  # reached = 3
    assert c.alpha == pytest.approx(0.8 * 0.6 + 0.2 * 2 / 3)
    a = c.alpha
    c.observe(out(4, accepted=4))  # reached = 4
    assert c.alpha == pytest.approx(0.8 * a + 0.2)
    a = c.alpha
    c.observe(out(0, drafted=0, accepted=0))  # no update
    assert c.alpha == a
    c.reset(ctx())
    assert c.alpha == 0.6


def test_speclane_clipped_arm_not_credited():
    c = SpecLane()
    c.reset(ctx())
    assert c.propose() == 2
    c.observe(out(1, accepted=1))  # engine clipped 2 -> 1
    assert c.propose() == 2  # arm 2 still untried


ALPHAS = [1e-9, 1e-4, *np.linspace(0.01, 0.99, 99).tolist(), 0.999, 0.999999]
RATIOS = [0.1, 0.5, 0.99, 1.0, 1.01, 1.5, 2.0, 3.0, 5.0, 8.16, 10.0, 20.0, 50.0, 100.0, 1e3, 1e5]


@pytest.mark.parametrize("k_max", [1, 2, 4, 8, 16])
def test_closed_form_equals_enumeration(k_max):
    d = 1.0
    for alpha in ALPHAS:
        for r in RATIOS:
            k_cf = optimal_k_closed_form(alpha, d, r * d, 1, k_max)
            k_en = optimal_k_enumerate(alpha, d, [0.0] + [r * d] * k_max, 1, k_max)
            g_cf, g_en = gain(k_cf, alpha, d, r * d), gain(k_en, alpha, d, r * d)
            assert g_cf >= g_en * (1 - 1e-12), (alpha, r, k_max, k_cf, k_en)
            if not math.isclose(gain(k_cf, alpha, d, r), gain(k_en, alpha, d, r), rel_tol=1e-12):
                assert k_cf == k_en


def test_closed_form_is_stationary_point():
    for alpha in (0.3, 0.55, 0.82, 0.95):
        for r in (2.0, 8.16, 30.0):
            k = optimal_k_real(alpha, r)
            f = lambda x: (1 - alpha ** (x + 1)) / (x + r)  # noqa: E731
            h = 1e-5
            if k > 0:
                assert abs(f(k + h) - f(k - h)) / (2 * h) < 1e-8
                assert f(k) >= max(f(k - 0.5), f(k + 0.5))


def test_lambert_wm1_against_scipy():
    special = pytest.importorskip("scipy.special")
    zs = np.concatenate([-np.exp(-1) + np.logspace(-6, -0.5, 60), -np.logspace(-300, -0.44, 200)])
    zs = zs[(zs >= -np.exp(-1)) & (zs < 0)]
    for z in zs:
        ref = special.lambertw(z, -1).real
        assert lambert_wm1(float(z)) == pytest.approx(ref, rel=1e-12)
    # near the branch point scipy loses accuracy; check the defining equation and the series instead
    for eps in (1e-14, 1e-10, 1e-8):
        z = -math.exp(-1) + eps
        w = lambert_wm1(z)
        assert w <= -1.0
        p = math.sqrt(2 * math.e * (z + math.exp(-1)))  # W_-1 = -1 - p - p^2/3 - ... (z itself is rounded)
        assert -1.0 - w == pytest.approx(p + p * p / 3, rel=1e-2)
    assert lambert_wm1(-math.exp(-1)) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        lambert_wm1(0.1)


def test_speclane_edge_cases():
    assert optimal_k_closed_form(1.0, 3.8, 31.0, 1, 8) == 8
    assert optimal_k_closed_form(1 - 1e-15, 3.8, 31.0, 1, 8) == 8
    assert optimal_k_closed_form(0.0, 3.8, 31.0, 1, 8) == 1
    assert optimal_k_closed_form(1e-300, 3.8, 31.0, 1, 8) == 1
    assert optimal_k_closed_form(0.5, 0.0, 31.0, 1, 8) == 8  # free drafting
    assert optimal_k_closed_form(1.0, 5.0, 1.0, 1, 8) == 1  # verify cheaper than a draft step
    c = SpecLane()
    c.reset(ctx(draft_ms=0.0))
    assert c.best_k(0.3) == 8


def test_speclane_overhead_and_nonflat_verify():
    # overhead is part of the fixed cost: same K as a flat verify of 31 + 20
    c = SpecLane()
    c.reset(ctx(overhead=20.0))
    d = SpecLane()
    d.reset(ctx(verify=51.0))
    for alpha in np.linspace(0.05, 0.97, 40):
        assert c.best_k(alpha) == d.best_k(alpha)
    # non-flat verify: enumeration with c_v(K) = verify_ms[K+1] + overhead
    vm = [31.0, 31.0, 33.0, 36.0, 40.0, 45.0, 51.0, 58.0, 66.0]
    e = SpecLane()
    e.reset(ctx(verify=vm, overhead=2.0))
    assert not e._flat
    cv = [0.0] + [vm[k] + 2.0 for k in range(1, 9)]
    differs = 0
    for alpha in np.linspace(0.05, 0.97, 40):
        k = e.best_k(alpha)
        assert k == optimal_k_enumerate(alpha, 3.8, cv, 1, 8)
        differs += k != optimal_k_closed_form(alpha, 3.8, 33.0, 1, 8)
    assert differs > 0


# ------------------------------------------------------------------------------------------ token-level stops
def test_confidence_stop_at_first_low_token():
    c = ConfidenceStop()
    c.reset(ctx())
    assert (c.propose(), c.token_level, c.name) == (8, True, "confidence:0.4")
    assert drafted_by(c, [0.9, 0.5, 0.3, 0.8, 0.9, 0.9, 0.9, 0.9]) == 3
    assert drafted_by(c, [0.39] + [0.9] * 7) == 1
    assert drafted_by(c, [0.4] * 8) == 8  # conf == tau continues


def test_confidence_adaptive_labels_exclude_after_first_rejection():
    c = ConfidenceStop(adaptive=True)
    c.reset(ctx())
    c.observe(out(5, accepted=2, conf=[0.9, 0.8, 0.7, 0.6, 0.5]))
    assert c._size == 3
    assert c._conf[:3].tolist() == [0.9, 0.8, 0.7] and c._lab[:3].tolist() == [True, True, False]
    c.observe(out(3, accepted=3, conf=[0.9, 0.8, 0.7]))  # all accepted: no negative
    assert c._size == 6 and c._n_pos == 5


def test_confidence_adaptive_refit_is_roc_minimiser():
    rng = np.random.default_rng(0)
    c = ConfidenceStop(adaptive=True)
    c.reset(ctx())
    confs, labs = [], []
    while True:
        cf = rng.uniform(0, 1, 8)
        a = int(np.argmax(cf < 0.55)) if (cf < 0.55).any() else 8
        c.observe(out(8, accepted=a, conf=cf))
        n = min(a + 1, 8)
        confs += cf[:n].tolist()
        labs += [j < a for j in range(n)]
        if sum(labs) > 5 and len(labs) - sum(labs) > 5:
            break
        assert c.tau == 0.4  # not refitted before both classes have > 5 samples
    confs_a, labs_a = np.array(confs), np.array(labs)

    def cost(t):
        pred = confs_a >= t
        return (pred & ~labs_a).sum() / (~labs_a).sum() + 3 * (~pred & labs_a).sum() / labs_a.sum()

    best = min(sorted(set(confs), reverse=True), key=cost)
    assert c.tau == best
    tau = c.tau
    c.reset(ctx())  # tau persists, samples are per request (as in transformers)
    assert c.tau == tau and c._size == 0


def test_roc_threshold_bruteforce():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(4, 40))
        conf = np.round(rng.uniform(0, 1, n), 1)  # ties on purpose
        lab = rng.uniform(0, 1, n) < conf
        if lab.all() or not lab.any():
            continue
        costs = {t: ((conf >= t) & ~lab).sum() / (~lab).sum() + 3 * ((conf < t) & lab).sum() / lab.sum()
                 for t in conf}
        best = min(costs.values())
        assert roc_threshold(conf, lab) == max(t for t, v in costs.items() if math.isclose(v, best))


def test_cumulative_stop():
    c = CumulativeStop()
    c.reset(ctx())
    assert (c.propose(), c.token_level, c.name) == (8, True, "cumulative:0.3")
    # 1 - prod: 0.05, 0.145, 0.316 > 0.3 -> stop after token 3
    assert drafted_by(c, [0.95, 0.9, 0.8, 0.99, 0.99, 0.99, 0.99, 0.99]) == 3
    assert drafted_by(c, [0.1] * 8) == 1  # never fewer than 1 token
    assert drafted_by(c, [1.0] * 8) == 8  # product restarts each round
    assert drafted_by(CumulativeStop(k_min=3), [0.1] * 8, cap=8) == 3


def test_entropy_stop():
    c = EntropyStop()
    c.reset(ctx())
    assert (c.propose(), c.token_level, c.name) == (8, True, "entropy")
    # 1 - sqrt(0.2 H) < 0.5  <=>  H > 1.25
    assert drafted_by(c, [0.5] * 8, [0.5, 1.2, 1.3, 0.1, 0.1, 0.1, 0.1, 0.1]) == 3
    assert drafted_by(c, [0.5] * 8, [1.25] * 8) == 8
    assert drafted_by(c, [0.5] * 8, [5.0] * 8) == 1
    assert EntropyStop(lam=0.6).name == "entropy:0.6"


# ---------------------------------------------------------------------------------------------------- UCB
def test_ucb_bandit_explores_then_keeps_state_across_requests():
    c = UCBBandit()
    c.reset(ctx())
    seen = []
    for _ in range(8):
        k = c.propose()
        seen.append(k)
        c.observe(out(k, accepted=min(k, 3), time_ms=31.0 + 3.8 * k))
    assert seen == list(range(1, 9))
    counts = list(c.bandit.counts)
    c.reset(ctx())
    assert c.bandit.counts == counts and c.bandit.total == 8  # kept across requests
    means = [s / n for s, n in zip(c.bandit.sums, c.bandit.counts)]
    bonus = math.sqrt(2 * math.log(8))
    assert c.propose() == 1 + int(np.argmax([m + bonus for m in means]))
    c.clear()
    assert c.bandit.total == 0 and c.propose() == 1


def test_ucb_bandit_converges_and_skips_clipped_rounds():
    c = UCBBandit()
    c.reset(ctx())
    rng = np.random.default_rng(0)
    for _ in range(3000):
        k = c.propose()
        ok = rng.uniform(size=k) < 0.6  # i.i.d. acceptance 0.6
        a = k if ok.all() else int(np.argmin(ok))
        c.observe(out(k, accepted=a))
    best = 1 + int(np.argmax(c.bandit.counts))
    g = [gain(k, 0.6, 3.8, 31.0) for k in range(1, 9)]
    assert g[best - 1] >= 0.97 * max(g)
    assert c.bandit.counts[best - 1] > 0.2 * c.bandit.total
    total = c.bandit.total
    k = c.propose()
    c.observe(out(k - 1 if k > 1 else 0, accepted=0))  # clipped by the engine: not credited
    assert c.bandit.total == total


def test_all_controllers_stay_in_range_with_small_k_max():
    rng = np.random.default_rng(3)
    for spec in expand("all", 3, kinds=("chain",))[0]:
        c = make_controller(spec, 3)
        for _ in range(3):
            c.reset(ctx(k_max=3))
            for _ in range(40):
                k = c.propose()
                assert 0 <= k <= 3, spec
                a = int(rng.integers(0, k + 1))
                c.observe(out(k, accepted=a, conf=rng.uniform(size=k), ent=rng.uniform(0, 3, size=k)))


# ------------------------------------------------------------------------------------------------ registry
@pytest.mark.parametrize(
    "spec, cls, name, token_level",
    [
        ("fixed:4", FixedK, "fixed:4", False),
        ("fixed:0", FixedK, "fixed:0", False),
        ("assc", ASSC, "assc", False),
        ("speclane", SpecLane, "speclane", False),
        ("hf-heuristic", HFHeuristic, "hf-heuristic", False),
        ("confidence", ConfidenceStop, "confidence:0.4", True),
        ("confidence:0.4", ConfidenceStop, "confidence:0.4", True),
        ("confidence:0.25", ConfidenceStop, "confidence:0.25", True),
        ("confidence:adaptive", ConfidenceStop, "confidence:adaptive", True),
        ("cumulative:0.3", CumulativeStop, "cumulative:0.3", True),
        ("entropy", EntropyStop, "entropy", True),
        ("ucb", UCBBandit, "ucb", False),
        (" UCB ", UCBBandit, "ucb", False),
    ],
)
def test_make_controller(spec, cls, name, token_level):
    c = make_controller(spec)
    assert isinstance(c, cls) and c.name == name and c.token_level is token_level


@pytest.mark.parametrize("spec", ["fixed:x", "nope", "fixed:99", "fixed", "fixed:-1", "assc:3", "confidence:abc", ""])
def test_make_controller_errors(spec):
    with pytest.raises(SpecgymError) as exc:
        make_controller(spec)
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 200, msg  # short: it names the spec and where the forms are listed
    assert "'specgym eval --help' lists the valid forms" in msg


def test_fixed_beyond_k_max_is_an_error():
    assert make_controller("fixed:16", k_max=16).propose  # fine at k_max 16
    with pytest.raises(SpecgymError):
        make_controller("fixed:9", k_max=8)


# ------------------------------------------------------------------------------------ statistical sanity (replay)
def _steady(alpha: float, n: int = 300):
    from specgym.envs.workloads.synthetic import generate_workload, steady_spec

    return generate_workload(steady_spec(alpha, 128, 384), n, seed=0)


def _speedup_vs_best_fixed(wl, spec: str) -> float:
    from specgym.eval.harness import EvalConfig, evaluate

    rep = evaluate(EvalConfig(workload=wl, controllers=spec, split="all"))
    return rep["rows"][0]["speedup_vs_best_fixed"]


@pytest.mark.parametrize("alpha", [0.55, 0.8])
def test_fixed_k_throughput_matches_closed_form(alpha):
    """Fixed-K tokens/s on a steady geometric workload = E[produced] / round time (within 1.5%)."""
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.eval.runner import run_fixed_vectorised

    wl = _steady(alpha)
    eng = TraceEngine(wl, seed=0)
    for k in (1, 3, 6):
        res = run_fixed_vectorised(eng, np.arange(wl.n_requests), k)
        expected = (1 - alpha ** (k + 1)) / (1 - alpha) / eng.round_times[k] * 1000
        measured = res.tokens.sum() / res.time_ms.sum() * 1000
        assert measured == pytest.approx(expected, rel=0.015)  # end-of-request clipping costs a little


@pytest.mark.parametrize("alpha", [0.55, 0.7, 0.9])
def test_speclane_close_to_best_fixed_on_steady_workloads(alpha):
    """With the ratio estimator SpecLane lands within 3% of the best fixed K on steady workloads (alpha >= 0.7).

    The write-up's estimator (EMA of per-round ratios, the default) is biased low and lands 3-7% below; at
    alpha = 0.55 even the ratio estimator lands ~3.2% below (UCB warm-up over K in {2,4,6,8} and the short EMA).
    The test pins these facts so a regression in either direction shows.
    """
    wl = _steady(alpha)
    ratio = _speedup_vs_best_fixed(wl, "speclane:ratio")
    default = _speedup_vs_best_fixed(wl, "speclane")
    assert ratio >= (0.97 if alpha >= 0.7 else 0.96)
    assert 0.92 <= default < 1.0
    if alpha >= 0.7:
        assert ratio > default  # the bias costs most at high acceptance


def test_speclane_beats_best_fixed_on_assc_regimes():
    from specgym.envs.workloads.synthetic import generate_workload

    wl = generate_workload("assc-regimes", 300, seed=0)
    assert _speedup_vs_best_fixed(wl, "speclane") > 1.03
    assert _speedup_vs_best_fixed(wl, "speclane:ratio") > 1.03

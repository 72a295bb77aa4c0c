"""Live measurement: kernels chosen by measurement, a cost model fitted to engine rounds, paired live statistics,
the machine calibration line.

The models here are tiny RANDOMLY-INITIALISED GPT-2s (specgym.training.models.toy) unless a test says otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym.envs.core.cost import CostProfile  # noqa: E402
from specgym.envs.engines.live import fast_linear  # noqa: E402
from specgym.envs.engines.live.calibration import (  # noqa: E402
    RoundSample,
    calibrate,
    cycled_rounds,
    fit_profile,
    spike_free_mean,
)
from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.envs.engines.live.model_loading import load_pair  # noqa: E402
from specgym.envs.engines.replay.trace_engine import TraceEngine  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.eval.bench.live import verdict  # noqa: E402
from specgym.eval.bench.machine import machine_calibration, machine_line  # noqa: E402
from specgym.training.models.toy import save_toy_pair  # noqa: E402

torch.set_num_threads(1)
needs_packing = pytest.mark.skipif(not fast_linear.packing_available(), reason="torch build without oneDNN")


@pytest.fixture(scope="module")
def toy_pair(tmp_path_factory):
    d, t = save_toy_pair(tmp_path_factory.mktemp("toy"))
    return load_pair(str(d), str(t))


@pytest.fixture(scope="module")
def plain_pair(tmp_path_factory):
    d, t = save_toy_pair(tmp_path_factory.mktemp("toy-plain"))
    return load_pair(str(d), str(t), fast_kernels=False)


@needs_packing
def test_every_kernel_computes_the_same_layer():
    w, b = torch.randn(48, 32), torch.randn(48)
    layer = fast_linear.kernel_linear(w, b)
    for rows in (1, 2, 5, 17):
        x = torch.randn(rows, 32)
        ref = torch.nn.functional.linear(x, w, b)
        for kernel in fast_linear.KERNELS:
            layer.forced = kernel
            torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-5)


@needs_packing
def test_load_measures_a_plan_per_model_and_row_count(toy_pair):
    assert set(toy_pair.kernels) == {"draft", "target"}
    for plan in toy_pair.kernels.values():
        assert [c.rows for c in plan.choices] == list(fast_linear.ROW_COUNTS)
        for c in plan.choices:  # the chosen kernel is the measured fastest
            assert set(c.ms) == set(fast_linear.KERNELS)
            assert c.ms[c.kernel] == min(c.ms.values())
        assert plan.kernel_for(4) == plan.choices[2].kernel  # 4 rows use the 3-row measurement
        assert plan.kernel_for(100) == plan.choices[-1].kernel
    modules = fast_linear.kernel_modules(toy_pair.target)
    plan = toy_pair.kernels["target"]
    assert modules and all(m.by_rows[1] == plan.kernel_for(1) and m.by_rows[9] == plan.kernel_for(9)
                           for m in modules)
    used = set(modules[0].by_rows[1:])
    assert (modules[0].packed is None) == ("packed" not in used)  # unused layouts are freed
    assert (modules[0].weight_t is None) == ("gemm_t" not in used)
    summary = toy_pair.kernel_summary()
    assert "target kernels" in summary and "1 row" in summary and plan.kernel_for(1) in summary


@needs_packing
def test_measured_kernels_keep_greedy_outputs(toy_pair, plain_pair):
    prompt = list(range(3, 20))
    for controller in (None, 3):
        fast = LiveEngine.from_pair(toy_pair).run_request(prompt, controller, 24).tokens
        slow = LiveEngine.from_pair(plain_pair).run_request(prompt, controller, 24).tokens
        assert fast == slow
    assert plain_pair.kernels == {} and "framework default" in plain_pair.kernel_summary()


@needs_packing
def test_plans_are_cached_per_architecture(tmp_path):
    d, t = save_toy_pair(tmp_path)
    first = load_pair(str(d), str(t))
    again = load_pair(str(d), str(t))
    assert again.kernels["target"].cached
    assert [c.kernel for c in again.kernels["target"].choices] == [c.kernel for c in first.kernels["target"].choices]


def _samples(draft_ms: float, rest: list[float], noise: float = 0.0, seed: int = 0) -> list[RoundSample]:
    rng = np.random.default_rng(seed)
    out = []
    for d, base in enumerate(rest):
        for c in range(40):
            dp = d * draft_ms * (1 + noise * rng.standard_normal())
            out.append(RoundSample(d, 50 + c, dp, dp + base * (1 + noise * rng.standard_normal())))
    return out


def test_fit_recovers_the_cost_model():
    rest = [5.0, 5.5, 5.7, 6.0, 6.4]
    fit = fit_profile(_samples(0.8, rest), k_max=4, name="fit")
    p = fit.profile
    assert p.source == "measured" and p.round_overhead_ms == 0.0 and p.hardware["method"] == "rounds"
    assert p.draft_ms == pytest.approx(0.8)
    assert list(p.verify_ms) == pytest.approx(rest)
    assert [p.round_time(d) for d in range(5)] == pytest.approx(fit.round_ms)
    assert fit.rounds == [40] * 5 and abs(fit.context_slope) < 1e-6
    noisy = fit_profile(_samples(0.8, rest, noise=0.05, seed=1), k_max=4)
    assert noisy.profile.round_time(3) == pytest.approx(3 * 0.8 + 6.0, rel=0.05)


def test_fit_reports_context_dependence():
    samples = [RoundSample(d, ctx, 0.5 * d, 0.5 * d + 4.0 * (1 + 0.001 * ctx)) for d in range(3)
               for ctx in range(50, 250, 5)]
    fit = fit_profile(samples, k_max=2)
    assert fit.context_slope == pytest.approx(0.1 / 1.15, rel=0.1)  # +0.4 ms per 100 tokens on ~4.6 ms
    assert "per 100 tokens" in fit.summary()


def test_other_drafters_rounds_inform_verify_but_not_the_draft_cost():
    """A head round verifies d + 1 tokens in the same forward: it counts towards verify(d + 1), and its (cheap)
    drafting phase leaves the draft model's per-token cost alone."""
    rest = [5.0, 5.5, 5.7, 6.0, 6.4]
    samples = _samples(0.8, rest)
    head = [RoundSample(d, 60, 0.1 * d, 0.1 * d + rest[d] + 1.0) for d in range(1, 5) for _ in range(40)]
    head.append(RoundSample(0, 60, 0.0, 99.0))  # a head round that drafted nothing is not a verify of one token
    fit = fit_profile(samples, k_max=4, verify_samples=head)
    assert fit.profile.draft_ms == pytest.approx(0.8)
    assert fit.profile.verify_ms[0] == pytest.approx(rest[0])
    assert list(fit.profile.verify_ms[1:]) == pytest.approx([v + 0.5 for v in rest[1:]])  # pooled half and half
    assert fit.rounds == [40, 80, 80, 80, 80]
    assert "rounds of other drafters" in fit.profile.description


def test_a_cycled_calibration_request_times_every_cap_in_one_request(toy_pair):
    eng = LiveEngine.from_pair(toy_pair, k_max=4, timing="cpu")
    rounds = cycled_rounds(eng, list(range(3, 15)), 40, range(5))
    assert {r.drafted for r in rounds} == set(range(5))  # the toy draft always drafts its cap
    assert [r.drafted for r in rounds[:5]] == [0, 1, 2, 3, 4]
    contexts = [r.context for r in rounds]
    assert contexts == sorted(contexts) and contexts[0] == 12
    assert all(r.round_ms >= r.draft_phase_ms >= 0 for r in rounds)
    with pytest.raises(SpecgymError, match="no draft caps"):
        cycled_rounds(eng, [3, 4], 4, [])


def test_fit_needs_every_drafted_count():
    with pytest.raises(SpecgymError, match=r"no rounds drafted \[2\]"):
        fit_profile([RoundSample(0, 10, 0.0, 5.0), RoundSample(1, 10, 1.0, 6.0)], k_max=2)
    assert spike_free_mean([1.0] * 18 + [100.0, 0.01]) == 1.0  # a preemption spike and a clock glitch
    assert spike_free_mean([1.0] * 18 + [2.0, 2.0]) == pytest.approx(1.1)  # slow rounds are paid live: kept


def test_calibration_prices_fixed_k_rounds_as_the_engine_runs_them(toy_pair):
    eng = LiveEngine.from_pair(toy_pair, k_max=4, timing="cpu")
    prompts = [list(range(3, 3 + n)) for n in (8, 12, 16)]
    fit = calibrate(eng, prompts, [30, 30, 30], k_max=4, name="toy-fit")
    assert fit.rounds[0] >= 90 and all(n > 0 for n in fit.rounds)
    # a request's measured time and its price under the fitted profile agree on average
    measured = predicted = 0.0
    for k in (0, 2, 4):
        res = eng.run_request(prompts[1], k, 30)
        measured += res.time_ms
        predicted += sum(fit.profile.round_time(r.drafted) for r in res.rounds)
    assert predicted == pytest.approx(measured, rel=0.5)  # cpu time of a tiny model: loose, but it is the fit


def test_verdict_reads_the_interval():
    assert verdict((1.01, 1.05), 1.03) == "faster"
    assert verdict((0.95, 0.99), 0.97) == "slower"
    assert verdict((0.99, 1.02), 1.01) == "tie"
    assert verdict(None, 1.2) == "faster"


def test_rows_by_category_and_without_loops():
    """Every row over plain and the best fixed K on each category's prompts and on the answers that do not loop; the
    rows below plain decoding on a category are named."""
    from types import SimpleNamespace

    from specgym.eval.bench.live_report import _Paired, _subsets, below_plain
    from specgym.eval.stats import PairedBootstrap

    # prompts 0-1 code (row "a" slower than plain there), 2-3 chat; prompt 3's answer loops (row "a" is fast there)
    per = np.array([[10.0, 10, 10, 10], [8, 8, 8, 8], [12, 12, 6, 2]])  # fixed:0 (plain), fixed:2, a
    wl = SimpleNamespace(category=np.array(["code", "code", "chat", "chat", "x"]),
                         looped=lambda: np.array([False, False, False, True, False]))
    setup = SimpleNamespace(wl=wl, requests=np.array([0, 1, 2, 3]))
    paired = _Paired(["fixed:0", "fixed:2", "a"], per, per.sum(1), 0, 1, PairedBootstrap(4, 200, seed=0))
    subs = _subsets(setup, paired)
    assert set(subs) == {"category:code", "category:chat", "no_loops"}
    assert subs["category:code"]["prompts"] == 2 and subs["no_loops"]["prompts"] == 3
    assert subs["category:code"]["rows"]["a"]["vs_plain"] == pytest.approx(20 / 24)
    assert subs["category:chat"]["rows"]["a"]["vs_plain"] == pytest.approx(20 / 8)
    assert subs["no_loops"]["rows"]["a"]["vs_best_fixed"] == pytest.approx(24 / 30)
    lo, hi = subs["no_loops"]["rows"]["a"]["vs_plain_ci"]
    assert lo <= 30 / 30 <= hi
    below = below_plain(subs)
    assert len(below) == 1 and below[0].startswith("a on code 0.833x [95% CI")


def test_machine_calibration_line():
    m = machine_calibration()
    assert m["numpy_gflops"] > 0 and m["copy_gb_s"] > 0 and m["python_mloops_s"] > 0
    line = machine_line(m)
    assert line.startswith("machine: ") and "GFLOP/s" in line and "GB/s" in line


@pytest.mark.slow
def test_live_bench_paired_rows_on_the_shipped_pair(tmp_path):
    """The live bench end to end on the shipped tinypair (small): paired intervals, verdicts, the fitted profile."""
    from rich.console import Console

    from specgym.eval.bench.live import run_live_bench
    from specgym.paths import MODELS_DIR

    if not (MODELS_DIR / "tinypair" / "target").exists():
        pytest.skip("shipped tinypair absent")
    r = run_live_bench(Console(file=open(tmp_path / "out.txt", "w"), width=200), pair_name="tinypair",
                       workload="tinypair-greedy", per_category=1, repeats=2,
                       specs=["fixed:1", "fixed:2", "marginal"], calibration_prompts=1, resamples=200,
                       max_new_tokens=24, hf_generate=False)
    rows = {row["controller"]: row for row in r["rows"]}
    assert set(rows) == {"fixed:0", "fixed:1", "fixed:2", "marginal"}  # plain decoding is always measured
    assert rows["fixed:0"]["speedup"] == pytest.approx(1.0)
    ref = f"fixed:{r['best_fixed_k']}"
    assert rows[ref]["verdict"] == "reference" and rows[ref]["vs_best_fixed"] == pytest.approx(1.0)
    for row in rows.values():
        lo, hi = row["vs_best_fixed_ci"]
        assert lo <= row["vs_best_fixed"] + 1e-9 and hi >= row["vs_best_fixed"] - 1e-9
        assert row["greedy_identical"]
        assert row["measured_over_predicted"] > 0
    assert "fitted on this machine" in r["profile_note"]
    assert CostProfile.from_dict(r["profile"]).hardware["method"] == "rounds"
    assert set(r["target_forward_ms"]) == {"1", "2"}
    assert len(r["times_ms"]["marginal"]) == r["prompts"]
    cats = [k for k in r["subsets"] if k.startswith("category:")]
    assert cats and sum(r["subsets"][k]["prompts"] for k in cats) == r["prompts"]
    assert set(r["subsets"][cats[0]]["rows"]) == set(rows)
    assert "below plain decoding on a category:" in (tmp_path / "out.txt").read_text()
    # one calibration request after each prompt, its cap cycling through every K: the replay is priced by their fit
    cal = r["calibration_rounds"]["draft"]
    assert {row[0] for row in cal} == set(range(len(r["pricing_profile"]["verify_ms"])))
    assert r["pricing_profile"]["name"] == "interleaved-tinypair"
    text = (tmp_path / "out.txt").read_text()
    assert "target forward through the engine" in text and "target kernels" in text


def test_replay_engine_prices_with_a_fitted_profile():
    """A fitted profile (overhead folded into verify) is a valid profile for the replay engine."""
    from specgym.envs.workloads.synthetic import generate_workload

    fit = fit_profile(_samples(0.8, [5.0, 5.5, 5.7, 6.0, 6.4, 6.6, 6.9, 7.1, 7.3]), k_max=8)
    wl = generate_workload("speclane-mix", 4, seed=0)
    eng = TraceEngine(wl, fit.profile, 8, seed=0)
    req = eng.start(0)
    o = req.play(3)
    assert o.time_ms == pytest.approx(fit.profile.round_time(o.drafted))

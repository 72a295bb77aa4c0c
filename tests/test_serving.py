"""Serving under load: ragged steps, open and closed loop, switch costs, the engines' rules, specgym's allocator,
the sweep (SYNTHETIC workloads throughout: the published traces never enter the tests)."""

from __future__ import annotations

import numpy as np
import pytest

from specgym.agents.specs import make
from specgym.baselines.acceptance_estimators import (
    AcceptanceEstimator,
    EmaPerPosition,
    EmaPerRequest,
    OnlineLogistic,
    step_labels,
)
from specgym.baselines.budget_allocator import BudgetAllocator
from specgym.baselines.sglang_adaptive import SGLangAdaptiveSpec
from specgym.baselines.trtllm_offswitch import TRTLLMOffSwitch
from specgym.baselines.vllm_adaptive import VLLMAdaptiveVerification
from specgym.envs.core.batch import BatchDecision, BatchState, BatchStep
from specgym.envs.core.batch_cost import Roofline, roofline_profile
from specgym.envs.core.switching import SwitchCosts
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.profiles import load_batch_profile
from specgym.errors import SpecgymError

H100 = load_batch_profile("h100-llama31-8b")
A100 = roofline_profile("a100", Roofline(6.7e9, 6.8e7, bandwidth_gb_s=2039, peak_tflops=312), 512, 8)


def _state(n: int, kv: int = 0, new: bool = False) -> BatchState:
    slots = np.arange(n)
    return BatchState(n, 0, n, slots, slots if new else np.arange(0), kv)


# ---------------------------------------------------------------------------------------------- the engine
def test_ragged_step_is_priced_and_accepted_exactly_as_by_hand(mix_workload):
    sim = BatchReplay(mix_workload, H100, 3, requests=np.arange(3), seed=4, k_max=8)
    st = sim.state()
    pos = sim.pos[st.slots].copy()
    runs = sim.runs[pos]
    verify, draft = np.array([0, 2, 5]), np.array([1, 4, 5])
    kv = int((mix_workload.prompt_len[:3] + 0).sum())  # every request at its first position
    assert st.kv_tokens == kv
    step = sim.step(BatchDecision(verify, draft))
    assert step.accepted.tolist() == np.minimum(runs, verify).tolist()
    assert step.produced == int(np.minimum(runs, verify).sum()) + 3
    lin = H100.linear
    assert lin is not None and lin.forward is not None
    eagle = lin.draft_cost()
    by_hand = (lin.forward.fixed_ms + lin.forward.per_token_ms * (7 + 3) + lin.forward.per_kv_ms * kv
               + eagle.fixed_ms + eagle.per_token_ms * 5 + eagle.per_kv_ms * kv + lin.step_overhead_ms)
    assert step.time_ms == pytest.approx(by_hand, rel=1e-12)
    assert step.drafted.tolist() == [1, 4, 5] and step.tier == 5
    assert (sim.pos[st.slots] == pos + step.accepted + 1).all()


def test_drafting_past_the_verified_prefix_costs_draft_forwards_only(mix_workload):
    """On a grid profile an autoregressive draft runs one forward per position over the sequences still drafting;
    drafting beyond the verified prefix changes the time, never the acceptance."""
    a = BatchReplay(mix_workload, A100, 4, requests=np.arange(4), seed=2)
    b = BatchReplay(mix_workload, A100, 4, requests=np.arange(4), seed=2)
    sa = a.step(BatchDecision(np.array([1, 1, 2, 2])))
    sb = b.step(BatchDecision(np.array([1, 1, 2, 2]), np.array([1, 3, 2, 4])))
    assert sa.accepted.tolist() == sb.accepted.tolist() and sa.produced == sb.produced
    # positions 3 and 4 are drafted by 2 and 1 sequences
    assert sb.time_ms - sa.time_ms == pytest.approx(A100.draft(2) + A100.draft(1), rel=1e-9)


def test_closed_loop_keeps_the_concurrency_and_open_loop_waits_for_arrivals(mix_workload):
    closed = BatchReplay(mix_workload, A100, 8, requests=np.arange(40), seed=1)
    sizes = []
    while not closed.done:
        st = closed.state()
        if closed.next_req < 40:
            sizes.append(st.batch)
        closed.step(BatchDecision(np.full(st.batch, 2)))
    assert set(sizes) == {8} and closed.tokens == mix_workload.lengths[:40].sum()
    opened = BatchReplay(mix_workload, A100, 16, arrival_rate=20.0, requests=np.arange(30), seed=3)
    opened.run_fixed(2)
    assert opened.done and (opened.admit_ms >= opened.arrival_ms - 1e-9).all()
    tpot = opened.tpot_ms()
    assert np.isfinite(tpot).all()
    slo = float(np.median(tpot))
    ok = tpot <= slo
    assert opened.goodput(slo) == pytest.approx(float(mix_workload.lengths[:30][ok].sum()) / opened.now_ms * 1e3)


def test_capture_sizes_pad_the_batched_tokens(mix_workload):
    plain = BatchReplay(mix_workload, H100, 4, requests=np.arange(4), seed=0)
    padded = BatchReplay(mix_workload, H100, 4, requests=np.arange(4), seed=0, capture_sizes=[8, 16, 32])
    a, b = plain.step(2), padded.step(2)  # 4 x 3 = 12 tokens, padded to 16
    per_token = H100.linear.forward.per_token_ms  # type: ignore[union-attr]
    assert b.time_ms - a.time_ms == pytest.approx(4 * per_token, rel=1e-9)
    with pytest.raises(SpecgymError, match="grid"):
        BatchReplay(mix_workload, A100, 4, requests=np.arange(4), capture_sizes=[8])


# ---------------------------------------------------------------------------------------------- switch costs
def test_switch_costs_are_paid_per_switch_with_cooldown_and_captured_tiers(mix_workload):
    ks = [1, 2, 2, 1, 3, 3]

    def run(sw: SwitchCosts | None) -> list[BatchStep]:
        sim = BatchReplay(mix_workload, A100, 2, requests=np.arange(2), seed=0, switch_costs=sw)
        return [sim.step(k) for k in ks]

    free = run(None)
    paid = run(SwitchCosts(per_switch_ms=1.5))
    switches = [s.switched for s in paid]
    assert switches == [False, True, False, True, True, False]
    assert [p.time_ms - f.time_ms for p, f in zip(paid, free)] == pytest.approx([1.5 * s for s in switches])
    held = run(SwitchCosts(cooldown_steps=2))  # after the switch to 2, the tier holds two steps: 1 -> runs as 2
    assert [s.tier for s in held] == [1, 2, 2, 2, 3, 3]
    assert held[3].drafted.max() == 2 and (held[3].planned_k <= 1).all()
    slow = run(SwitchCosts(captured=(1, 2), outside_slowdown=1.25))
    assert [s.time_ms / f.time_ms for s, f in zip(slow, free)] == pytest.approx([1, 1, 1, 1, 1.25, 1.25])
    assert SwitchCosts.parse("ms=0.5,cooldown=3,captured=0-1-3") == SwitchCosts(0.5, 3, (0, 1, 3))
    with pytest.raises(SpecgymError, match="unknown key"):
        SwitchCosts.parse("wait=3")


def test_every_controller_pays_the_switch_cost(mix_workload):
    """The engine charges the switches of whatever controller runs: replaying its decisions on a free engine is
    cheaper by exactly the switch cost times the switches."""
    sw = SwitchCosts(per_switch_ms=2.0)
    for spec in ("goodput", "sglang-adaptive", "budget:pos-ema", "vllm-adaptive"):
        sim = BatchReplay(mix_workload, A100, 8, requests=np.arange(24), seed=0, switch_costs=sw)
        free = BatchReplay(mix_workload, A100, 8, requests=np.arange(24), seed=0)
        ctrl = make(spec, 8, kinds=("batch",))
        ctrl.reset(A100, 8)
        switches = 0
        while not sim.done:
            dec = ctrl.propose(sim.state())
            free.state()
            step = sim.step(dec)
            free.step(dec)
            ctrl.observe(step)
            switches += step.switched
        assert sim.now_ms - free.now_ms == pytest.approx(2.0 * switches), spec
        assert switches > 0 or spec.startswith("vllm"), spec  # vLLM's rule drafts its full K: one tier


# ---------------------------------------------------------------------------------------------- estimators
def _step(accepted: list[int], planned: list[int], slots: list[int] | None = None) -> BatchStep:
    acc, plan = np.array(accepted), np.array(planned)
    s = np.arange(len(acc)) if slots is None else np.array(slots)
    return BatchStep(len(acc), 0, s, plan, acc, int(acc.sum()) + len(acc), 1.0, 0)


def test_labels_are_the_accepted_positions_and_the_first_rejection():
    label, seen = step_labels(_step([2, 0, 3], [3, 2, 3]), 4)
    assert seen.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 0]]
    assert label.tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]


def test_estimators_by_hand():
    ema = EmaPerRequest()
    ema.reset(4, 3)
    ema.update(_step([1, 0], [2, 3]))
    np.testing.assert_allclose(ema.confidences(np.arange(2)), [[1.0, 0.8, 1.0], [0.8, 1.0, 1.0]])
    ema.admit(np.array([0]))
    assert ema.confidences(np.array([0])).tolist() == [[1.0, 1.0, 1.0]]
    pos = EmaPerPosition(beta=0.5, prior=0.5)
    pos.reset(4, 2)
    pos.update(_step([1, 0], [2, 2]))  # position 0: labels 1, 0 -> 0.5; position 1: label 0 -> 0.25
    assert pos.rate.tolist() == pytest.approx([0.5, 0.25])
    logi = OnlineLogistic(refit_every=10)
    logi.reset(8, 2)
    good, bad = np.arange(4), np.arange(4, 8)
    for _ in range(60):  # slots 0-3 accept everything, 4-7 nothing
        logi.update(_step([2] * 4 + [0] * 4, [2] * 8, list(np.concatenate([good, bad]))))
    c = logi.confidences(np.arange(8))
    assert logi.w is not None and (c[:4, 0] > 0.9).all() and (c[4:, 0] < 0.1).all()


# ---------------------------------------------------------------------------------------------- engine rules
class FixedConfidence(AcceptanceEstimator):
    name = "fixed"

    def __init__(self, c: np.ndarray):
        self.c = c

    def confidences(self, slots: np.ndarray) -> np.ndarray:
        return self.c[slots]

    def update(self, step: BatchStep) -> None:
        pass


class LinearCosts:
    """A profile stand-in: a step costs ``2 + 1 x (batched tokens)`` ms."""

    linear = True

    def budget_step_ms(self, b, kv, verified, drafted, draft_counts=None, drafter=None):
        return 2.0 + (b + np.asarray(verified, dtype=np.float64))


def test_vllm_adaptive_verification_by_hand():
    """Survivals r0: 0.9, 0.45; r1: 0.6, 0.3. Rates (2 + top-B sum) / (2 + 2 + B): B = 0: 0.5, 1: 0.58, 2: 0.583,
    3: 0.564, 4: 0.531 -> B = 2: one token of each request verified, the full K = 2 drafted."""
    rule = VLLMAdaptiveVerification(FixedConfidence(np.array([[0.9, 0.5], [0.6, 0.5]])))
    rule.reset(LinearCosts(), 2)  # type: ignore[arg-type]
    dec = rule.propose(_state(2))
    assert np.asarray(dec.verify).tolist() == [1, 1] and dec.draft == 2
    alloc = BudgetAllocator(FixedConfidence(np.array([[0.9, 0.5], [0.6, 0.5]])))
    alloc.reset(LinearCosts(), 2)  # type: ignore[arg-type]
    dec = alloc.propose(_state(2))
    assert np.asarray(dec.verify).tolist() == [1, 1] and np.asarray(dec.draft).tolist() == [1, 1]  # drafting cut


def test_vllm_adaptive_new_requests_start_at_full_confidence(mix_workload):
    rule = make("vllm-adaptive", 4, kinds=("batch",))
    rule.reset(H100, 4)
    dec = rule.propose(_state(2, new=True))
    assert dec.draft == 4 and int(np.asarray(dec.verify).sum()) == 8  # survival 1.0 everywhere: verify all


def test_budget_allocator_respects_captured_tiers():
    alloc = BudgetAllocator(FixedConfidence(np.array([[0.9, 0.5, 0.4], [0.6, 0.5, 0.4]])),
                            SwitchCosts(captured=(0, 3)))
    alloc.reset(LinearCosts(), 3)  # type: ignore[arg-type]
    dec = alloc.propose(_state(2))
    assert int(np.max(dec.draft)) in (0, 3)  # the step runs at a captured tier


def test_sglang_adaptive_by_hand():
    """Batch 4: tier [1, 3, 5, 7], start at 7; ten warm-up batches accept 1 draft each (EMA 1.0); at the 10th the
    target is round(1) + 1 = 2 < 7 and 1 + 1 < 7 - 0.25: down to the largest candidate <= 2, i.e. 1."""
    p = SGLangAdaptiveSpec()
    p.reset(A100, 8)
    assert p.propose(_state(4)) == 7
    for i in range(10):
        p.observe(_step([1] * 4, [7] * 4))
        k = p.propose(_state(4))
        assert k == (7 if i < 9 else 1), i
    for _ in range(5):  # accepted 5 each: the EMA climbs; at the next update (batch 15) target round(EMA) + 1
        p.observe(_step([5] * 4, [1] * 4))
        k = p.propose(_state(4))
    ema = 1.0
    for _ in range(5):
        ema = 0.8 * ema + 0.2 * 5
    target = round(ema) + 1
    assert k == min(c for c in (1, 3, 5, 7) if c >= target)
    assert p.propose(_state(40)) == 1 and p.propose(_state(64)) == 0  # the batch-size tiers [0, 1] and [0]


def test_trtllm_off_switch():
    r = TRTLLMOffSwitch(3, 16)
    assert [r.propose(_state(b)) for b in (1, 16, 17, 64)] == [3, 3, 0, 0]
    assert make("trtllm-off:2:8", 8, kinds=("batch",)).max_concurrency == 8
    with pytest.raises(SpecgymError, match="trtllm-off needs"):
        make("trtllm-off:99:8", 8, kinds=("batch",))


def test_every_new_rule_serves_a_workload(mix_workload):
    for spec in ("vllm-adaptive:ema", "vllm-adaptive:logistic", "sglang-adaptive", "trtllm-off", "budget",
                 "budget:ema"):
        sim = BatchReplay(mix_workload, H100, 16, requests=np.arange(40), seed=0)
        sim.run(make(spec, 8, kinds=("batch",)))
        assert sim.done and sim.tokens == mix_workload.lengths[:40].sum(), spec


# ---------------------------------------------------------------------------------------------- the sweep
def test_sweep_json_schema_table_and_plot(tmp_path, capsys):
    """``specgym tune sweep`` writes rows with controller, concurrency, tok_s, vs_best_fixed and CI bounds; the
    vLLM rule's rows start with vllm-adaptive; the best fixed K is the best static K of the cell."""
    import json

    from specgym.cli import main

    out = tmp_path / "sweep.json"
    rc = main(["tune", "sweep", "--profile", "h100-llama31-8b", "--concurrency", "1,8", "--controllers",
               "vllm-adaptive,budget:pos-ema,sglang-adaptive", "--replications", "2", "--k-max", "4",
               "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["schema"] == "specgym-serving-sweep/1" and res["concurrencies"] == [1, 8]
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    names = {r["controller"] for r in res["rows"]}
    assert any(n.startswith("vllm-adaptive") for n in names) and {"oracle-clairvoyant", "oracle-request-rates"} <= names
    for r in res["rows"]:
        assert {"controller", "concurrency", "tok_s", "vs_best_fixed", "ci95_low", "ci95_high", "tpot_ms_median"} \
            <= set(r)
        assert r["tpot_ms_median"] > 0
        if not r["controller"].startswith("best-fixed"):
            assert r["ci95_low"] <= r["vs_best_fixed"] <= r["ci95_high"]
    for cell in res["cells"].values():
        per = cell["per_replication_tok_s"]
        totals = [sum(per[f"static:{k}"]) for k in range(5)]
        assert cell["best_fixed_k"] == int(np.argmax(totals))
        assert cell["oracle_headroom"] >= 1.0  # the clairvoyant oracle never loses to a fixed K here
        assert cell["request_rates_headroom"] > 0.5
    text = capsys.readouterr().out
    assert "| controller | c=1 | c=8 |" in text and "best-fixed" in text
    assert main(["tune", "sweep", "--profile", "h100-llama31-8b", "--json", str(out)]) != 0  # no overwrite


def test_draft_view_and_the_predictor_fed_rules():
    """The engine reports a per-position signal of the next k_max drafts (0 past a request's end); the predictor
    estimator reads the shipped predictor's probabilities there; without the view it refuses in one line."""
    from specgym.envs.workloads.trace_format import cached_workload

    wl = cached_workload("midpair-greedy")
    reqs = np.arange(6)
    sig = np.arange(int(wl.offsets[-1]), dtype=np.float64)  # position ids: the view must read them back
    sim = BatchReplay(wl, A100, 3, requests=reqs, seed=0, k_max=4, draft_signal=sig)
    st = sim.state()
    starts = wl.offsets[reqs[:3]]
    assert st.draft_view is not None and st.draft_view[:, 0].tolist() == starts.tolist()
    assert (np.diff(st.draft_view, axis=1) == 1).all()
    rule = make("budget:predictor:midpair", 4, kinds=("batch",))
    with pytest.raises(SpecgymError, match="no draft view"):
        BatchReplay(wl, A100, 3, requests=reqs, k_max=4).run(rule)
    p = rule.estimator.workload_signal(wl)
    assert p.shape == (int(wl.offsets[-1]),) and 0.0 <= p.min() and p.max() <= 1.0
    y = wl.p_accept > 0.5
    assert p[y].mean() > p[~y].mean() + 0.3  # the predictor separates accepted from rejected drafts
    for spec in ("budget:predictor:midpair", "vllm-adaptive:predictor:midpair"):
        sim = BatchReplay(wl, A100, 4, requests=reqs, seed=0, k_max=4, draft_signal=p)
        sim.run(make(spec, 4, kinds=("batch",)))
        assert sim.done and sim.tokens == wl.lengths[reqs].sum()
    with pytest.raises(SpecgymError, match="one value per position"):
        BatchReplay(wl, A100, 3, requests=reqs, draft_signal=np.zeros(5))


def test_sweep_with_switch_costs_and_capture_sizes(mix_workload):
    """Every row of a sweep under switch costs and CUDA-graph padding is priced by the same engine; the padded
    sweep is never faster than the unpadded one for a fixed K (padding only adds tokens)."""
    from specgym.eval.sweep import sweep

    kw = dict(concurrencies=[4], specs=["budget:pos-ema"], replications=2, k_max=4)
    plain = sweep(mix_workload, H100, **kw)  # type: ignore[arg-type]
    padded = sweep(mix_workload, H100, capture_sizes=[16, 32, 64], switch_costs=SwitchCosts(0.5, 1), **kw)  # type: ignore[arg-type]
    assert padded["capture_sizes"] == [16, 32, 64] and padded["switch_costs"]["per_switch_ms"] == 0.5
    for k in range(5):
        a = plain["cells"]["4"]["per_replication_tok_s"][f"static:{k}"]
        b = padded["cells"]["4"]["per_replication_tok_s"][f"static:{k}"]
        assert all(y <= x + 1e-9 for x, y in zip(a, b)), k

"""specgym's side of a vLLM engine, without vLLM: the scheduler hook (K per step, admission, step log), the plugin's
controller factory, the profile built from engine steps, and the batch replay's prediction of a vLLM run. The real
engine end to end is ``tests/test_vllm.py``."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from specgym.agents.vllm_plugin import controller_factory, register
from specgym.baselines.batch_rules import GoodputRule, StaticK
from specgym.envs.core.batch import BatchState
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.engines.serving.vllm_engine import VllmRun, external_ids
from specgym.envs.engines.serving.vllm_hook import SchedulerHook, _Lookup
from specgym.envs.engines.serving.vllm_profile import (
    CellTimes,
    PrefillCost,
    build_profile,
    fit_prefill,
    plain_profile,
    prefill_excess,
    steady_steps,
    step_costs,
)
from specgym.errors import SpecgymError
from specgym.eval.bench.vllm import (
    ProfilingPass,
    VllmPlan,
    cell_requests,
    cell_schedule,
    machine_state,
    mixed_cells,
    plain_drift,
    pooled,
    profiling_pass,
    run_order,
    stalled_steps,
    truncated,
)
from specgym.eval.vllm_replay import PrefillFirst, predict_run


def _profile(k_max: int = 3) -> BatchCostProfile:
    """Steps of 10 + 2K ms at batch 1 and 16 + 5K ms at batch 4 (K = 0 in the speculative engine: +1 ms)."""
    spec = {(b, k): (10.0 if b == 1 else 16.0) + (2.0 if b == 1 else 5.0) * k + (1.0 if k == 0 else 0.0)
            for b in (1, 4) for k in range(k_max + 1)}
    return build_profile("t", (1, 4), spec, {1: 10.0, 4: 16.0}, k_max, PrefillCost(1.0, 0.1), "test", {})


class FakeScheduler:
    """What the hook reads of vLLM's ``Scheduler``."""

    def __init__(self) -> None:
        self.waiting: list[str] = []
        self.running: list[str] = ["x"]
        self.max_num_active_reqs = 16


def _output(new: dict[str, int], decode: dict[str, int], k: int) -> SimpleNamespace:
    """A ``SchedulerOutput``: new requests (prompt tokens) and decoding ones (drafts verified this step)."""
    tokens = {**new, **{r: d + 1 for r, d in decode.items()}}
    return SimpleNamespace(num_scheduled_tokens=tokens, scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new],
                           scheduled_spec_decode_tokens={r: [7] * d for r, d in decode.items() if d},
                           num_spec_tokens_to_schedule=k)


def _runner(generated: dict[str, int]) -> SimpleNamespace:
    ids = list(generated)
    return SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(ids)},
                           sampled_token_ids=[[1] * generated[r] for r in ids])


def _step(hook: SchedulerHook, sched: FakeScheduler, new: dict[str, int], decode: dict[str, int],
          generated: dict[str, int], finished: set[str]) -> int:
    """One scheduler step through the hook, as vLLM calls it; returns the K the lookup gave."""
    hook.before_schedule(sched, 16)
    k = _Lookup(hook, sched)[len(new) + len(decode)] if hook.active else hook.num_spec_tokens
    hook.after_schedule(_output(new, decode, k))
    hook.after_update(hook.verified(_output(new, decode, k), _runner(generated)), finished)
    return k


def test_the_hook_takes_the_draft_length_decision():
    hook = SchedulerHook(4, controller_factory)
    sched = FakeScheduler()
    assert not hook.active and hook.decide(3, 0) == 4  # nothing configured: vLLM's own num_speculative_tokens
    hook.configure(table=[0, 4, 4, 2, 1])
    assert [hook.decide(b, 0) for b in (1, 2, 3, 4, 9)] == [4, 4, 2, 1, 1]  # beyond the table: its last entry
    with pytest.raises(SpecgymError, match="0..4"):
        hook.configure(policy="static:6")  # beyond the engine's num_speculative_tokens
    hook.configure(table=[9] * 5)
    assert hook.decide(2, 0) == 4  # a table is clipped to it, as vLLM's own lookup is
    hook.configure(policy="static:2")
    assert _step(hook, sched, {"a": 50}, {}, {"a": 1}, set()) == 2
    assert hook.log.prefill_tokens == [50] and hook.log.drafts == [0] and "a" in hook.log.admit_s
    assert _step(hook, sched, {"b": 30}, {"a": 2}, {"a": 3, "b": 1}, set()) == 2
    assert _step(hook, sched, {}, {"a": 2, "b": 2}, {"a": 1, "b": 2}, {"a"}) == 2
    log = hook.take_log()
    assert log["batch"] == [1, 2, 2] and log["drafts"] == [0, 2, 4] and log["accepted"] == [0, 2, 1]
    assert log["produced"] == [1, 4, 3] and log["finished"] == [0, 0, 1] and set(log["finish_s"]) == {"a"}
    assert hook.take_log()["batch"] == []  # the log restarts


def test_the_hook_feeds_the_controller_and_refuses_per_sequence_k():
    hook = SchedulerHook(6, controller_factory)
    hook.configure(policy="goodput", profile="batch-cpu-midpair")
    ctrl = hook.controller
    assert isinstance(ctrl, GoodputRule)
    before = ctrl.ema_acc
    sched = FakeScheduler()
    _step(hook, sched, {"a": 10}, {}, {"a": 1}, set())
    _step(hook, sched, {}, {"a": 4}, {"a": 5}, set())  # all 4 drafts accepted
    assert ctrl.ema_acc > before
    hook.configure(policy="per-seq:assc", profile="batch-cpu-midpair")
    hook._pending = None
    with pytest.raises(ValueError, match="one K per step"):
        hook.decide(2, 0)


def test_admission_follows_the_schedule_and_cycles():
    hook = SchedulerHook(2)
    hook.configure(schedule=[[100.0, 1], [200.0, 8]])
    hook._t0 = 0.0
    assert [hook.limit(t, 16) for t in (0.05, 0.15, 0.29, 0.31, 0.45)] == [1, 8, 8, 1, 8]
    assert hook.limit(0.15, 4) == 4  # never above the engine's own limit
    with pytest.raises(ValueError, match="lengths > 0"):
        hook.configure(schedule=[[0.0, 1]])


def test_the_plugin_factory_and_the_no_op_entry_point(monkeypatch):
    assert isinstance(controller_factory("static:3", 6, None), StaticK)
    with pytest.raises(SpecgymError, match="SPECGYM_VLLM_PROFILE"):
        controller_factory("goodput", 6, None)
    with pytest.raises(SpecgymError, match="prices K up to"):
        controller_factory("goodput", 16, "batch-cpu-midpair")
    for var in ("SPECGYM_VLLM", "SPECGYM_VLLM_CONTROLLER"):
        monkeypatch.delenv(var, raising=False)
    register()  # off: nothing happens (and nothing needs vLLM)
    monkeypatch.setenv("SPECGYM_VLLM_CONTROLLER", "bogus")
    with pytest.raises(SpecgymError, match="bad controller spec .bogus."):
        register()  # a bad spec fails in the front end, before any engine starts


def test_engine_core_ids_map_back_to_request_ids():
    assert external_ids({"3-1a2b3c4d": 1.0, "plain": 2.0, "a-b-12345678": 3.0}) == {"3": 1.0, "plain": 2.0,
                                                                                    "a-b": 3.0}


def _log(batch: list[int], drafts: list[int], prefill: list[int], new: list[int], period_ms: float) -> dict:
    n = len(batch)
    return {"start_s": [i * period_ms / 1000.0 for i in range(n)], "batch": batch, "drafts": drafts,
            "prefill_tokens": prefill, "new_requests": new, "core_cpu_ms": [1.0] * n,
            "worker_cpu_ms": [10.0 + i for i in range(n)]}


def test_profile_from_engine_steps():
    log = _log([2, 2, 2, 2, 1], [0, 6, 6, 4, 3], [80, 0, 0, 0, 0], [2, 0, 0, 0, 0], 20.0)
    assert steady_steps(log, 2, 3) == pytest.approx([20.0, 20.0])  # not the prefill step, not the short one
    assert steady_steps(log, 2, 3, "cpu").tolist() == [12.0, 13.0]  # engine core + worker CPU time
    assert np.isnan(step_costs(log)[-1])  # the last step has no successor
    assert np.isnan(step_costs({**log, "worker_cpu_ms": [1.0]}, "cpu")).all()  # misaligned: unknown
    # the prefill step drafts nothing: its baseline is the batch's K = 0 step, not the run's K = 3 step
    rows = prefill_excess(log, {(2, 0): 12.0, (2, 3): 15.0})
    assert rows == [(2, 80, pytest.approx(8.0))]
    assert prefill_excess(log, {(2, 0): 7.0, (2, 3): 9.0}, "cpu") == [(2, 80, pytest.approx(4.0))]
    assert prefill_excess(log, {(4, 0): 12.0}) == []  # a batch the profile did not measure gives no row
    # one sequence prefills while the other verifies 3 drafts: 1.5 drafts per sequence, between K = 0 and 3
    mixed = _log([2, 2], [3, 0], [40, 0], [1, 0], 20.0)
    assert prefill_excess(mixed, {(2, 0): 12.0, (2, 3): 15.0}) == [(1, 40, pytest.approx(20.0 - 13.5))]
    fit = fit_prefill([(1, 50, 1.0 + 0.1 * 50), (2, 80, 2.0 + 0.1 * 80), (1, 20, 1.0 + 0.1 * 20)])
    assert fit.per_request_ms == pytest.approx(1.0) and fit.per_token_ms == pytest.approx(0.1)
    assert fit.ms([50, 20]) == pytest.approx(2.0 + 7.0)
    # a negative term is dropped and the other refitted alone (not clipped with the joint fit's value kept)
    per_token = fit_prefill([(1, 100, 80.0), (2, 210, 170.0), (3, 290, 230.0)])
    assert per_token.per_request_ms == 0.0 and per_token.per_token_ms == pytest.approx(
        (100 * 80 + 210 * 170 + 290 * 230) / (100**2 + 210**2 + 290**2))
    prof = _profile()
    assert prof.step_time(4, 2) == pytest.approx(26.0) and prof.step_time(1, 0) == pytest.approx(11.0)
    assert plain_profile(prof).step_time(1, 0) == pytest.approx(10.0)
    assert plain_profile(prof).step_time(4, 3) == prof.step_time(4, 3)
    assert PrefillCost.of(prof) == PrefillCost(1.0, 0.1)
    with pytest.raises(SpecgymError, match="no steady steps"):
        build_profile("t", (1, 4), {(1, 0): 1.0}, {1: 1.0, 4: 1.0}, 1, PrefillCost(), "", {})
    cells = CellTimes()
    cells.steps["cpu"][(1, 0)] = [3.0, 1.0, 2.0]
    assert cells.medians("cpu") == {(1, 0): 2.0} and cells.medians() == {}


def test_prefill_first_and_the_prediction(mix_workload):
    state = BatchState(3, 0, 3, np.array([0, 1, 2]), np.array([2]))
    ctrl = PrefillFirst(StaticK(3))
    assert ctrl.propose(state).tolist() == [3, 3, 0]
    prof = dataclasses.replace(_profile(), hardware={})  # no prefill cost
    reqs = np.arange(12)
    free = predict_run(mix_workload, reqs, prof, StaticK(2), 4, 3)
    sim = BatchReplay(mix_workload, prof, 4, requests=reqs, k_max=3)
    sim.run(PrefillFirst(StaticK(2)))
    assert free.time_ms == pytest.approx(sim.now_ms) and free.steps == sim.steps
    paid = predict_run(mix_workload, reqs, prof, StaticK(2), 4, 3, PrefillCost(1.0, 0.1))
    extra = 12 * 1.0 + 0.1 * float(mix_workload.prompt_len[reqs].sum())
    assert paid.time_ms == pytest.approx(sim.now_ms + extra)
    assert paid.tok_s < free.tok_s and paid.accepted == free.accepted
    mixed = predict_run(mix_workload, reqs, prof, StaticK(2), [(50.0, 1), (50.0, 4)], 3, PrefillCost(1.0, 0.1))
    assert mixed.steps > 0 and np.isfinite(mixed.tpot_ms).all()


def test_truncated_workload_serves_the_first_positions(mix_workload):
    cut = truncated(mix_workload, 20)
    assert int(cut.lengths.max()) == 20 and cut.n_requests == mix_workload.n_requests
    r = 3
    assert np.array_equal(cut.p_accept[cut.span(r)], mix_workload.p_accept[mix_workload.span(r)][:20])
    assert truncated(mix_workload, None) is mix_workload


def test_every_repetition_serves_every_run_once_in_its_own_order():
    order = run_order([1, 4, "mixed"], ["fixed:1", "fixed:2", "table"], repeats=3, seed=0)
    cells = {(c, p) for c in (1, 4, "mixed") for p in ("fixed:1", "fixed:2", "table")}
    assert len(order) == 3 and all(len(rep) == 9 and set(rep) == cells for rep in order)
    assert len({tuple(rep) for rep in order}) == 3  # not the same order twice (drift must not follow a policy)
    assert order == run_order([1, 4, "mixed"], ["fixed:1", "fixed:2", "table"], repeats=3, seed=0)  # seeded


def test_stalled_steps_count_slow_decode_steps_not_prefills():
    start = np.arange(6, dtype=np.float64)
    dur = np.array([0.9, 0.01, 0.01, 0.08, 0.01, 0.01])  # a long prefill, then one decode step 8x the median
    log = {"start_s": start.tolist(), "end_s": (start + dur).tolist(), "prefill_tokens": [300, 0, 0, 0, 0, 0],
           "batch": [1] * 6, "drafts": [2] * 6}
    run = VllmRun(wall_s=1.0, tokens=10, log=log, spec={}, outputs=[])
    assert stalled_steps(run) == 1
    assert stalled_steps(run, factor=10.0) == 0
    # a phased run: steps at 64 sequences take 10x those at 1 and are no stall; one slow step among them is
    start = np.arange(12, dtype=np.float64)
    dur = np.array([0.01] * 8 + [0.1] * 3 + [0.6])  # the run's median step is a batch-1 step
    log = {"start_s": start.tolist(), "end_s": (start + dur).tolist(), "prefill_tokens": [0] * 12,
           "batch": [1] * 8 + [64] * 4, "drafts": [2] * 8 + [64] * 4}
    assert stalled_steps(VllmRun(wall_s=1.0, tokens=10, log=log, spec={}, outputs=[])) == 1


def test_profiling_passes_pool_their_steps():
    """Passes measured at different times of one benchmark pool into one set of cells (the prediction's profile)."""
    first, later = CellTimes(), CellTimes()
    first.steps["wall"][(4, 3)] = [20.0, 21.0]
    first.prefill["wall"].append((4, 120, 9.0))
    later.steps["wall"][(4, 3)] = [26.0]
    later.steps["wall"][(1, 0)] = [12.0]
    both = first.merged(later)
    assert both.steps["wall"] == {(4, 3): [20.0, 21.0, 26.0], (1, 0): [12.0]}
    assert both.prefill["wall"] == [(4, 120, 9.0)]
    assert both.medians()[(4, 3)] == 21.0
    assert first.steps["wall"][(4, 3)] == [20.0, 21.0]  # the passes themselves are left as they were


class FakeEngine:
    """Serves runs whose every decode step takes ``step_ms`` (what :func:`measure_cells` reads), and notes them."""

    def __init__(self, k_max: int, step_ms: float, served: list[str]):
        self.config = SimpleNamespace(k_max=k_max, max_num_seqs=4)
        self.step_ms, self.served = step_ms, served

    def serve(self, prompts, lengths, table=None, schedule=None):
        b, k = len(prompts), 0 if table is None else table[0]
        n = 6
        start = np.arange(n) * self.step_ms / 1000.0
        log = {"start_s": start.tolist(), "end_s": (start + self.step_ms / 1000.0).tolist(), "batch": [b] * n,
               "k": [k] * n, "drafts": [0] + [b * k] * (n - 1), "prefill_tokens": [3 * b] + [0] * (n - 1),
               "new_requests": [b] + [0] * (n - 1), "decoding": [0] + [b] * (n - 1),
               "core_cpu_ms": [self.step_ms / 2] * n, "worker_cpu_ms": [self.step_ms / 2] * n}
        self.served.append(f"{'spec' if self.config.k_max else 'plain'}:{b}:{k}")
        return VllmRun(wall_s=1.0, tokens=n * b, log=log, spec={}, outputs=[])


def test_profiling_passes_run_both_engines_and_alternate_which_goes_first():
    served: list[str] = []
    plain, spec = FakeEngine(0, 10.0, served), FakeEngine(2, 14.0, served)
    plan = VllmPlan(profile_batches=(1, 2), profile_tokens=8)
    first = profiling_pass(plain, spec, [[1, 2], [3]], plan, 1, 0)
    assert served[:2] == ["plain:1:0", "plain:2:0"] and len(served) == 2 + 2 * 3  # plain, then every (b, K)
    assert sorted(first.plain.medians()) == [(1, 0), (2, 0)] and len(first.spec.medians()) == 6
    served.clear()
    plain.step_ms = 12.0
    second = profiling_pass(plain, spec, [[1, 2], [3]], plan, 1, 1)
    assert served[0].startswith("spec:") and served[-2:] == ["plain:1:0", "plain:2:0"]  # the other way round
    spec_cells, plain_cells = pooled([first, second])
    one, two = first.plain.steps["wall"][(1, 0)], second.plain.steps["wall"][(1, 0)]
    assert plain_cells.steps["wall"][(1, 0)] == one + two and one and set(np.round(two, 6)) == {12.0}
    assert spec_cells.steps["wall"][(2, 2)] == first.spec.steps["wall"][(2, 2)] + second.spec.steps["wall"][(2, 2)]
    drift = plain_drift([first, second])
    assert drift is not None and drift["batch"] == 1 and drift["step_ms"] == pytest.approx([10.0, 12.0])
    assert drift["spread"] == pytest.approx(0.2)
    assert plain_drift([first]) is None


def test_a_machine_whose_plain_step_moves_is_not_rated_quiet():
    def drift(*steps: float) -> dict:
        passes = []
        for ms in steps:
            cells = CellTimes()
            cells.steps["wall"][(1, 0)] = [ms]
            passes.append(ProfilingPass(cells, CellTimes()))
        out = plain_drift(passes)
        assert out is not None
        return out

    assert machine_state([0.2], [1.9], drift(9.4, 9.9, 9.6)) == "quiet"  # 5% apart
    assert machine_state([0.2], [1.9], None) == "quiet"
    assert machine_state([0.2], [1.9], drift(9.3, 16.7)) == ("drifting (plain step at batch 1: 9.3-16.7 ms over 2 "
                                                             "profiling passes)")
    assert machine_state([0.9], [1.9], drift(9.4, 9.4)).startswith("busy (load average 0.9 before")


def test_the_mixed_cells_of_the_benchmark():
    plan = VllmPlan(concurrency=(1, 4, 16), requests=8, mixed_requests=32, mixed_segment_ms=4000.0)
    timed, phased = cell_schedule(plan, "mixed"), cell_schedule(plan, "phased")
    assert timed.by == "time" and [c for _, c in timed.segments] == [1, 16, 4]
    assert phased.by == "requests" and phased.segments == ((8.0, 1), (32.0, 16), (8.0, 4))  # each cell's requests
    assert [cell_requests(plan, c) for c in (1, 4, 16, "mixed", "phased")] == [8, 8, 32, 32, 48]
    assert not cell_schedule(plan, 4).changes and cell_schedule(plan, 4).max_concurrency == 4
    args = SimpleNamespace(vllm_no_mixed=False, vllm_mixed="phased, mixed")
    assert mixed_cells(args) == ("phased", "mixed")
    assert mixed_cells(SimpleNamespace(vllm_no_mixed=True, vllm_mixed="mixed")) == ()
    with pytest.raises(SpecgymError, match="bench vllm --mixed: unknown cell 'bursty'"):
        mixed_cells(SimpleNamespace(vllm_no_mixed=False, vllm_mixed="bursty"))


def test_tune_names_the_batch_sizes_where_plain_decoding_beats_every_k(mix_workload):
    """A vLLM-measured profile prices an engine without speculation apart from K = 0 (the drafter still runs): where
    it beats every K, the tuned table cannot match it and the result says so."""
    from specgym.eval.tune import describe, tune_vllm

    spec = {(b, k): (10.0 if b == 1 else 16.0) + (2.0 if b == 1 else 5.0) * k + 1.0 * (k == 0)
            for b in (1, 4) for k in range(4)}
    prof = build_profile("t", (1, 4), spec, {1: 10.0, 4: 12.0}, 3, PrefillCost(0.0, 0.0), "test", {})
    res = tune_vllm(mix_workload, prof, max_batch=4, k_max=3, check_batches=())
    e = res["tokens_per_step"]
    best = [max(b * e[k] / prof.step_time(b, k) for k in range(4)) for b in (1, 4)]
    assert best[0] > 1 / 10.0 and best[1] < 4 / 12.0  # speculation pays at 1, not at 4 (the premise)
    assert res["plain_faster"] and res["plain_faster"][-1][1] == 4 and res["plain_faster"][0][0] > 1
    assert res["ranges"][0]["speedup_vs_plain"] > 1.0 > res["ranges"][-1]["speedup_vs_plain"]
    text = "\n".join(describe(res))
    assert "vs plain decoding" in text and "faster than every K at batch sizes" in text
    no_plain = dataclasses.replace(prof, hardware={})  # a profile that never measured plain decoding
    res = tune_vllm(mix_workload, no_plain, max_batch=4, k_max=3, check_batches=())
    assert res["plain_faster"] is None and "speedup_vs_plain" not in res["ranges"][0]
    assert "vs plain decoding" not in "\n".join(describe(res))

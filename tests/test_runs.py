"""Runs, the one notion every engine reads: per-position traces (draws under a seed) and per-start traces (format
v3, stored per drafter), through the scalar and vectorised replay, the batch replay, the oracles and the format.
Every trace here is SYNTHETIC."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from specgym.baselines.fixed import FixedK
from specgym.baselines.oracle import oracle_time_one, oracle_times
from specgym.cli import main
from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.controller import Controller
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.replay import request_uniforms, run_lengths
from specgym.envs.core.request import drive
from specgym.envs.core.rounds import DraftStep, RoundOutcome
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.envs.workloads.trace_format import (
    META_KEY,
    drafter_entry,
    load_workload,
    save_workload,
    workload_from_requests,
    workload_to_table,
)
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.references import references
from specgym.training.predictor import workload_dataset

PROFILE = CostProfile("runs-test", 1.0, tuple(10.0 + 0.4 * n for n in range(17)), 0.5, source="synthetic")


def per_start_workload(n_req: int = 12, seed: int = 0, with_per_position: bool = False):
    """SYNTHETIC per-start trace with two drafters (``a``: model, ``b``: lookup); runs overshoot the end sometimes."""
    rng = np.random.default_rng(seed)
    reqs = []
    for r in range(n_req):
        n = int(rng.integers(5, 40))
        req = {"request_id": f"s{r}", "category": "c" if r % 2 else "d", "temperature": 0.0,
               "prompt_len": int(rng.integers(3, 30)),
               "runs": {"a": rng.geometric(0.35, n) - 1, "b": rng.geometric(0.7, n) - 1}}
        if with_per_position:
            p = (rng.random(n) < 0.6).astype(np.float32)
            req.update(p_accept=p, draft_conf=np.clip(0.2 + 0.6 * p, 0, 1), draft_entropy=1.0 - 0.5 * p)
        reqs.append(req)
    drafters = [drafter_entry("a", "model"), drafter_entry("b", "lookup")]
    if with_per_position:
        drafters.append(drafter_entry("draft", "model", "per-position"))
    return workload_from_requests("per-start", {"kind": "synthetic", "generator": "tests"}, PROFILE, reqs,
                                  drafters=drafters)


def test_per_position_runs_are_the_runs_of_the_draws(make_trace, flat_profile):
    rng = np.random.default_rng(1)
    wl = make_trace([rng.random(n) for n in (7, 15, 3)], flat_profile)
    eng = TraceEngine(wl, seed=5)
    u = np.concatenate([request_uniforms(5, wl.request_id[r], int(n)) for r, n in enumerate(wl.lengths)])
    np.testing.assert_array_equal(eng.runs(), run_lengths(u < wl.p_accept, wl.offsets))
    for r in range(wl.n_requests):
        np.testing.assert_array_equal(eng.request_runs(r), eng.runs()[wl.span(r)])
    assert not np.array_equal(TraceEngine(wl, seed=6).runs(), eng.runs()) or wl.n_positions < 5


def test_a_round_produces_min_run_k_plus_one_and_a_token_stop_min_run_j_plus_one():
    wl = per_start_workload()
    eng = TraceEngine(wl, k_max=16)
    assert eng.drafter == "a" and eng.seed == 0
    for r in range(wl.n_requests):
        runs = wl.runs["a"][wl.span(r)].astype(int)
        for k in (0, 1, 3, 16):
            req = eng.start(r)
            while not req.done:
                i = req.position
                o = req.play(k)
                cap = min(k, req.length - i - 1)
                assert (o.planned_k, o.produced) == (cap, min(int(runs[i]), cap) + 1)
        req = eng.start(r)
        while not req.done:  # a token-level stop after j drafts
            i = req.position
            cap = min(5, req.length - i - 1)
            o = req.play(5, lambda s: s.index < 2)
            j = min(2, cap)
            assert o.drafted == j and o.produced == min(int(runs[i]), j) + 1
            assert np.isnan(o.draft_conf).all() and len(o.draft_conf) == o.drafted  # the trace has no confidence


def test_per_start_runs_do_not_depend_on_the_seed_and_the_drafter_is_a_parameter():
    wl = per_start_workload()
    np.testing.assert_array_equal(TraceEngine(wl, seed=0).runs(), TraceEngine(wl, seed=99).runs())
    eng = TraceEngine(wl, k_max=16)
    np.testing.assert_array_equal(eng.runs("b"), wl.runs["b"])
    np.testing.assert_array_equal(TraceEngine(wl, drafter="b").runs(), wl.runs["b"])
    req = eng.start(0)
    o = req.play(16, drafter="b")  # a round with another drafter, priced by its costs
    assert o.produced == min(int(wl.runs["b"][0]), req.length - 1) + 1
    with pytest.raises(SpecgymError, match="has no drafter 'zzz'; it holds a, b"):
        TraceEngine(wl, drafter="zzz")


def test_vector_replay_equals_the_scalar_loop_on_per_start_traces():
    wl = per_start_workload(20, seed=2)
    eng = TraceEngine(wl, k_max=16)
    for k in (1, 4, 16):
        v = VectorReplay(eng)
        v.run_fixed(k)
        for r in range(wl.n_requests):
            tot = drive(FixedK(k), eng.start(r))
            assert tot.tokens == v.pos[r] - v.start[r] and tot.rounds == v.rounds[r]
            assert tot.time_ms == pytest.approx(v.time_ms[r], rel=1e-12)


def test_batch_replay_at_concurrency_one_equals_the_single_request_replay():
    wl = per_start_workload(10, seed=3)
    grid = BatchCostProfile("b", (1, 2), (1.0, 1.5), (PROFILE.verify_ms, tuple(v * 1.2 for v in PROFILE.verify_ms)),
                            (0.5, 0.6), source="synthetic")
    eng = TraceEngine(wl, PROFILE, k_max=16)
    for k in (2, 7):
        br = BatchReplay(wl, grid, concurrency=1, k_max=16)
        br.run_fixed(k)
        v = VectorReplay(eng)
        v.run_fixed(k)
        assert br.tokens == int((v.pos - v.start).sum())
        assert br.now_ms == pytest.approx(float(v.time_ms.sum()), rel=1e-12)


def test_oracle_and_informed_oracle_on_per_start_traces():
    """The clairvoyant DP plans over the stored runs (which may exceed the room: K is clipped); the informed oracle of
    a deterministic per-start trace is the clairvoyant one."""
    wl = per_start_workload(15, seed=4)
    eng = TraceEngine(wl, k_max=16)
    refs = references(eng, np.arange(wl.n_requests))
    for r in range(wl.n_requests):
        want = oracle_time_one(wl.runs["a"][wl.span(r)], eng.round_times, 16)
        assert refs.oracle_ms[r] == pytest.approx(want, rel=1e-12)
    np.testing.assert_allclose(refs.informed.time_ms, refs.oracle_ms, rtol=1e-12)
    assert refs.t_best >= refs.t_oracle
    choice = np.zeros(wl.n_positions, np.int64)
    oracle_times(eng.runs(), wl.offsets, eng.round_times, 16, choice=choice)
    assert choice.max() <= 16 and choice.min() >= 0


def test_v3_round_trip_and_v2_files_stay_v2(tmp_path, make_trace, flat_profile):
    wl = per_start_workload(with_per_position=True)
    back = load_workload(save_workload(wl, tmp_path / "v3.parquet"))
    assert json_meta(tmp_path / "v3.parquet")["format_version"] == 3
    assert back.drafters == wl.drafters and back.drafter_names == ["a", "b", "draft"]
    for d in ("a", "b"):
        np.testing.assert_array_equal(back.runs[d], wl.runs[d])
    np.testing.assert_array_equal(back.p_accept, wl.p_accept)
    sub = back.subset([3, 1])
    np.testing.assert_array_equal(sub.runs["b"][sub.span(0)], back.runs["b"][back.span(3)])
    assert back.slice(2, 5).runs["a"].shape[0] == int(back.lengths[2:5].sum())
    # a per-position drafter listed beside per-start ones replays its draws
    assert TraceEngine(back, drafter="draft", seed=1).runs().shape == (back.n_positions,)
    v2 = make_trace([[1, 0, 1], [0, 1]], flat_profile)
    save_workload(v2, tmp_path / "v2.parquet")
    assert json_meta(tmp_path / "v2.parquet")["format_version"] == 2


def json_meta(path):
    import json

    return json.loads(pq.read_schema(path).metadata[META_KEY])


def test_absent_per_position_columns_load_as_none(tmp_path):
    wl = per_start_workload()
    back = load_workload(save_workload(wl, tmp_path / "s.parquet"))
    assert all(getattr(back, c) is None for c in ("p_accept", "draft_conf", "draft_entropy", "target_entropy"))
    assert set(pq.read_schema(tmp_path / "s.parquet").names) >= {"runs_a", "runs_b"}
    assert "p_accept" not in pq.read_schema(tmp_path / "s.parquet").names


@pytest.mark.parametrize("change, fragment", [
    (lambda t, m: (t.drop_columns(["runs_b"]), m), "drafter 'b' is per-start but column 'runs_b' is missing"),
    (lambda t, m: (t, m | {"drafters": m["drafters"][:1]}), "column 'runs_b' has no per-start entry"),
    (lambda t, m: (t, m | {"drafters": []}), "column 'runs_a' has no per-start entry"),
    (lambda t, m: (t, m | {"format_version": 2}), "missing column 'p_accept'"),
])
def test_v3_defects_are_one_line(tmp_path, change, fragment):
    wl = per_start_workload()
    table, meta = change(workload_to_table(wl), wl.metadata())
    import json

    path = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), path)
    with pytest.raises(SpecgymError, match=fragment.replace("(", r"\(").replace(")", r"\)")) as exc:
        load_workload(path)
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)


def test_negative_runs_and_unlisted_runs_are_refused():
    wl = per_start_workload()
    with pytest.raises(SpecgymError, match="must be in"):
        workload_from_requests("x", {"kind": "synthetic"}, PROFILE,
                               [{"request_id": "a", "category": "c", "temperature": 0.0, "prompt_len": 1,
                                 "runs": {"a": [1, -1]}}], drafters=[drafter_entry("a", "model")])
    with pytest.raises(SpecgymError, match="has no entry in metadata field 'drafters'"):
        workload_from_requests("x", {"kind": "synthetic"}, PROFILE,
                               [{"request_id": "a", "category": "c", "temperature": 0.0, "prompt_len": 1,
                                 "runs": {"a": [1, 0]}}])
    assert wl.lacks == {"p_accept", "draft_conf", "draft_entropy", "target_entropy"}


class _ReadsConf(Controller):
    name = "reads-conf"
    token_level = True
    needs = frozenset({"draft_conf"})

    def propose(self) -> int:
        return 3

    def keep_drafting(self, step: DraftStep) -> bool:
        return step.conf > 0.5

    def observe(self, outcome: RoundOutcome) -> None:
        pass


def test_consumers_of_absent_columns_work_or_refuse_in_one_line(tmp_path, capsys, one_line_error):
    wl = per_start_workload(30, seed=5)
    with pytest.raises(SpecgymError, match="needs the per-position column.*'draft_conf'.*per-start"):
        drive(_ReadsConf(), TraceEngine(wl).start(0))
    with pytest.raises(SpecgymError, match="no 'draft_conf' column, which the acceptance predictor's training"):
        workload_dataset(wl, "all", ("conf",))
    # the evaluation: runnable controllers run (marginal with single-bin calibration), the others refuse
    report = evaluate(EvalConfig(workload=wl, controllers="marginal,assc,speclane,hf-heuristic,ucb,fixed:3",
                                 split="all", k_max=16, bootstrap=0))
    rows = {r["controller"]: r for r in report["rows"]}
    assert set(rows) >= {"marginal", "assc", "speclane", "hf-heuristic", "ucb", "fixed:3"}
    assert all(np.isfinite(r["throughput_tok_s"]) for r in rows.values())
    assert report["workload"]["mean_p_accept_by_category"] == {"d": None, "c": None}
    path = save_workload(wl, tmp_path / "s.parquet")
    for spec, col in (("confidence:0.4", "draft_conf"), ("cumulative:0.3", "draft_conf"), ("entropy", "draft_entropy")):
        assert main(["eval", "--workload", str(path), "--controllers", spec, "--split", "all", "--bootstrap", "0",
                     "--out", str(tmp_path / f"e-{spec}"), "--no-plots"]) != 0
        one_line_error(capsys, spec.split(":")[0], repr(col), "per-start")
    assert main(["workloads", "show", str(path)]) == 0
    assert "run a" in capsys.readouterr().out


def test_per_start_workloads_shard_and_merge(tmp_path):
    """A per-start workload split into a sharded folder and loaded back is the same workload (runs included)."""
    wl = per_start_workload(9, seed=6)
    src = save_workload(wl, tmp_path / "w.parquet")
    assert main(["workloads", "split", str(src), "--out", str(tmp_path / "ds"), "--shard-requests", "4"]) == 0
    back = load_workload(tmp_path / "ds")
    assert back.metadata() == wl.metadata() and back.p_accept is None
    for d in wl.runs:
        np.testing.assert_array_equal(back.runs[d], wl.runs[d])
    assert main(["workloads", "merge", str(tmp_path / "ds"), "--out", str(tmp_path / "m.parquet")]) == 0
    assert (tmp_path / "m.parquet").read_bytes() == src.read_bytes()

"""Trace format v2 signals: the lookup index against its definition, round trip, v1 compatibility, one-line errors
for bad columns, and the replay engine emitting the recorded signals."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specgym.envs.core.controller import Controller
from specgym.envs.core.lookup import NGramIndex, lookup_brute, lookup_columns
from specgym.envs.core.request import drive
from specgym.envs.core.rounds import DraftStep, RoundOutcome
from specgym.envs.core.signals import TOPK, projection_to_meta, sketch_projection
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.trace_format import (
    FORMAT_VERSION,
    META_KEY,
    load_workload,
    save_workload,
    workload_from_requests,
    workload_to_table,
)
from specgym.errors import SpecgymError


# ------------------------------------------------------------------------------------------------- lookup index
@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, 3), max_size=6),
       ops=st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=5), st.integers(0, 5)), max_size=25))
def test_incremental_lookup_equals_brute_force(prompt, ops):
    """Rounds of speculative appends (drafts) and rollbacks to an accepted prefix: after every append and every
    rollback the index answers what the definition says about the current sequence."""
    index = NGramIndex(prompt)
    assert index.lookup() == lookup_brute(prompt)
    for drafts, accepted in ops:
        base = len(index)
        for t in drafts:
            assert index.lookup() == lookup_brute(index.seq)
            index.append(t)
            assert index.lookup() == lookup_brute(index.seq)
        index.truncate(base + min(accepted, len(drafts)))
        assert index.lookup() == lookup_brute(index.seq)
        index.append(accepted % 4)
        index.commit()
        assert index.lookup() == lookup_brute(index.seq)


@settings(max_examples=100, deadline=None)
@given(prompt=st.lists(st.integers(0, 4), min_size=1, max_size=8), completion=st.lists(st.integers(0, 4), min_size=1,
                                                                                        max_size=30))
def test_lookup_columns_follow_the_definition(prompt, completion):
    drafts = [(t + i) % 5 for i, t in enumerate(completion)]
    lens, toks, agree = lookup_columns(prompt, completion, drafts)
    for i in range(len(completion)):
        n, tok = lookup_brute(prompt + completion[:i])
        assert (lens[i], toks[i], agree[i]) == (n, tok, n > 0 and tok == drafts[i])
    assert lens.dtype == np.int8 and toks.dtype == np.int32 and agree.dtype == np.bool_


def test_lookup_examples_and_rollback_floor():
    assert lookup_brute([1, 2, 3, 1, 2]) == (2, 3)
    assert lookup_brute([5, 1, 2, 9, 1, 2, 7, 1, 2]) == (2, 7)  # the most recent earlier occurrence
    assert lookup_brute([7]) == (0, -1) and lookup_brute([1, 1]) == (1, 1)
    assert lookup_brute([1, 2, 3, 4, 5, 1, 2, 3, 4, 5]) == (4, 1)  # n <= 4: [2, 3, 4, 5] then 1
    index = NGramIndex([1, 2, 3])
    with pytest.raises(ValueError, match="committed"):
        index.truncate(2)


# ------------------------------------------------------------------------------------------------- format
def _requests(n_req=3, temperature=0.0, sketch_dim=0, seed=0):
    """Hand-made requests with consistent v2 signal columns (greedy: p_accept = [rank == 0])."""
    rng = np.random.default_rng(seed)
    reqs = []
    for r in range(n_req):
        n = 5 + 3 * r
        prompt = rng.integers(0, 6, 4).tolist()
        tokens = rng.integers(0, 6, n).astype(np.int32)
        rank = rng.integers(0, 3, n).astype(np.int32)
        draft = np.where(rank == 0, tokens, (tokens + 1) % 6).astype(np.int32)
        topk = np.sort(rng.dirichlet(np.ones(12), n)[:, :TOPK], axis=1)[:, ::-1].astype(np.float32)
        lens, toks, agree = lookup_columns(prompt, tokens.tolist(), draft)
        req = {"request_id": f"r{r}", "category": "c", "temperature": temperature, "prompt_len": 4,
               "p_accept": (rank == 0).astype(np.float32), "draft_conf": topk[:, 0],
               "draft_entropy": np.ones(n, np.float32), "split": "test", "token_id": tokens, "draft_token": draft,
               "target_rank": rank, "draft_topk": topk, "lookup_len": lens, "lookup_token": toks,
               "lookup_agree": agree}
        if sketch_dim:
            req["hidden_sketch"] = rng.standard_normal((n, sketch_dim)).astype(np.float32)
        reqs.append(req)
    return reqs


def _meta(sketch_dim=0):
    meta = {"topk": TOPK, "lookup_max_n": 4, "vocab_size": 6}
    if sketch_dim:
        meta["hidden_sketch"] = projection_to_meta(sketch_projection(16, sketch_dim, 3), 3)
    return meta


def _v2(flat_profile, sketch_dim=0):
    return workload_from_requests("v2", {"kind": "recorded"}, flat_profile, _requests(sketch_dim=sketch_dim),
                                  signal_meta=_meta(sketch_dim))


@pytest.mark.parametrize("sketch_dim", [0, 5])
def test_v2_round_trip(tmp_path, flat_profile, sketch_dim):
    wl = _v2(flat_profile, sketch_dim)
    back = load_workload(save_workload(wl, tmp_path / "v2.parquet"))
    assert back.signal_names == wl.signal_names and ("hidden_sketch" in back.signal_names) == bool(sketch_dim)
    for col in wl.signal_names:
        a, b = getattr(wl, col), getattr(back, col)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert back.signal_meta == wl.signal_meta
    if sketch_dim:
        np.testing.assert_array_equal(back.sketch_projection(), sketch_projection(16, sketch_dim, 3))
    assert json.loads(pq.read_schema(tmp_path / "v2.parquet").metadata[META_KEY])["format_version"] == 2
    sub = back.subset([2, 0])
    np.testing.assert_array_equal(sub.draft_topk[sub.span(0)], back.draft_topk[back.span(2)])
    np.testing.assert_array_equal(sub.lookup_len[sub.span(1)], back.lookup_len[back.span(0)])


def test_v1_traces_load_with_absent_signals(tmp_path, mix_workload, make_trace, flat_profile):
    """A v1 file (every shipped workload today) loads; its signals are None, and replay emits no signals record."""
    assert FORMAT_VERSION == 3  # the newest written; a v2-only workload is still written as v2 (test above)
    wl = make_trace([[1, 0, 1, 1], [0, 1]], flat_profile)
    meta = wl.metadata() | {"format_version": 1}
    path = tmp_path / "v1.parquet"
    pq.write_table(workload_to_table(wl).replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), path)
    back = load_workload(path)
    assert back.signal_names == [] and back.signal_columns() is None and back.sketch_projection() is None
    assert all(getattr(back, c) is None for c in ("token_id", "target_rank", "draft_topk", "lookup_len"))
    rounds: list[RoundOutcome] = []
    drive(_Recording(), TraceEngine(back).start(0), on_round=rounds.append)
    assert rounds and all(o.signals is None for o in rounds)
    synth = load_workload(save_workload(mix_workload, tmp_path / "synth.parquet"))
    assert synth.signal_names == [] and synth.signal_columns() is None


def _rewrite(tmp_path, wl, name, col, values, meta=None):
    table = workload_to_table(wl)
    if values is None:
        table = table.drop_columns([col])
    else:
        table = table.set_column(table.column_names.index(col), col, values)
    path = tmp_path / name
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(meta or wl.metadata()).encode()}), path)
    return path


def _lists(wl, col, flat, type_):
    return pa.ListArray.from_arrays(pa.array(wl.offsets.astype(np.int32)), pa.array(flat, type_))


@pytest.mark.parametrize("case,match", [
    ("int64 ids", r"bad\.parquet: column 'token_id' must be a list of int32, got list<int64>"),
    ("short", r"bad\.parquet: column 'target_rank' lengths differ from 'p_accept'"),
    ("lookup 5", r"bad\.parquet: field 'lookup_len' has a value outside \[0, 4\] \(request 'r0', position 2\)"),
    ("unsorted", r"bad\.parquet: field 'draft_topk' is not sorted in descending order"),
    ("topk width", r"bad\.parquet: column 'draft_topk' must be a list of fixed_size_list<float>\[8\]"),
    ("lookup token", r"bad\.parquet: field 'lookup_token' must be -1 exactly where lookup_len is 0"),
    ("rank", r"bad\.parquet: field 'target_rank' disagrees with p_accept \(greedy"),
    ("vocab", r"bad\.parquet: field 'token_id' has a value >= the vocabulary size 6"),
    ("sketch meta", r"bad\.parquet: column 'hidden_sketch' needs metadata field 'signals.hidden_sketch'"),
])
def test_bad_signal_columns_are_one_line_errors(tmp_path, flat_profile, case, match):
    wl = _v2(flat_profile, sketch_dim=3)
    meta = wl.metadata()
    if case == "int64 ids":
        path = _rewrite(tmp_path, wl, "bad.parquet", "token_id", _lists(wl, "token_id", wl.token_id, pa.int64()))
    elif case == "short":
        bad = pa.array([v[:-1] for v in np.split(wl.target_rank, wl.offsets[1:-1])], pa.list_(pa.int32()))
        path = _rewrite(tmp_path, wl, "bad.parquet", "target_rank", bad)
    elif case == "lookup 5":
        v = wl.lookup_len.copy()
        v[2] = 5
        path = _rewrite(tmp_path, wl, "bad.parquet", "lookup_len", _lists(wl, "lookup_len", v, pa.int8()))
    elif case == "unsorted":
        v = wl.draft_topk[:, ::-1].copy()
        fixed = pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), TOPK)
        path = _rewrite(tmp_path, wl, "bad.parquet", "draft_topk",
                        pa.ListArray.from_arrays(pa.array(wl.offsets.astype(np.int32)), fixed))
    elif case == "topk width":
        fixed = pa.FixedSizeListArray.from_arrays(pa.array(wl.draft_topk[:, :4].ravel()), 4)
        path = _rewrite(tmp_path, wl, "bad.parquet", "draft_topk",
                        pa.ListArray.from_arrays(pa.array(wl.offsets.astype(np.int32)), fixed))
    elif case == "lookup token":
        v = wl.lookup_token.copy()
        v[wl.lookup_len == 0] = 0
        path = _rewrite(tmp_path, wl, "bad.parquet", "lookup_token", _lists(wl, "lookup_token", v, pa.int32()))
    elif case == "rank":
        v = wl.target_rank.copy()
        v[v == 0] = 1
        path = _rewrite(tmp_path, wl, "bad.parquet", "target_rank", _lists(wl, "target_rank", v, pa.int32()))
    elif case == "vocab":
        meta["signals"] = dict(meta["signals"], vocab_size=6)
        v = wl.token_id.copy()
        v[0] = 6
        path = _rewrite(tmp_path, wl, "bad.parquet", "token_id", _lists(wl, "token_id", v, pa.int32()), meta)
    else:
        meta["signals"] = {k: v for k, v in meta["signals"].items() if k != "hidden_sketch"}
        path = _rewrite(tmp_path, wl, "bad.parquet", "hidden_sketch", workload_to_table(wl).column("hidden_sketch"),
                        meta)
    with pytest.raises(SpecgymError, match=match) as err:
        load_workload(path)
    assert "\n" not in str(err.value)


def test_signals_in_some_requests_only(flat_profile):
    reqs = _requests()
    del reqs[1]["lookup_len"]
    with pytest.raises(SpecgymError, match="field 'lookup_len' present in some requests only"):
        workload_from_requests("x", {"kind": "recorded"}, flat_profile, reqs, signal_meta=_meta())


# ------------------------------------------------------------------------------------------------- replay
class _Recording(Controller):
    """Token-level controller with a fixed pattern of caps and stops; keeps every DraftStep it saw."""

    name = "recording"
    token_level = True

    def __init__(self):
        self.steps: list[DraftStep] = []
        self.n = 0

    def propose(self) -> int:
        self.n += 1
        return [3, 0, 5, 2][self.n % 4]

    def keep_drafting(self, step: DraftStep) -> bool:
        self.steps.append(step)
        return step.index < 3

    def observe(self, outcome: RoundOutcome) -> None:
        pass


def test_trace_engine_emits_the_recorded_signals(flat_profile):
    wl = _v2(flat_profile, sketch_dim=4)
    engine = TraceEngine(wl, flat_profile)
    n_rows = 0
    for r in range(wl.n_requests):
        base = int(wl.offsets[r])
        ctl = _Recording()
        rounds: list[RoundOutcome] = []
        drive(ctl, engine.start(r), on_round=rounds.append)
        for o in rounds:
            sig = o.signals
            assert sig is not None and len(sig) == o.drafted
            rows = slice(base + o.position, base + o.position + o.drafted)
            np.testing.assert_array_equal(sig.topk, wl.draft_topk[rows])
            np.testing.assert_array_equal(sig.lookup_len, wl.lookup_len[rows])
            np.testing.assert_array_equal(sig.lookup_agree, wl.lookup_agree[rows])
            np.testing.assert_array_equal(sig.hidden_sketch, wl.hidden_sketch[rows])
            n_rows += o.drafted
        for step in ctl.steps:
            assert step.signals is not None and len(step.signals) == step.index
            p = base + step.position
            np.testing.assert_array_equal(step.signals.topk[-1], wl.draft_topk[p])
            assert step.signals.lookup_agree[-1] == wl.lookup_agree[p]
    assert n_rows > 5

"""The hybrid of a prompt-lookup chain and a model drafter's tree (``tree-hybrid``), in replay.

On requests of the shipped real-pair recording (``smollm2-greedy``: the head's ``ranks_head`` / ``topk_head``, the
n-gram drafter's runs, the context lookup): with a width-1 head tree as the model side it is the lookup switch with
the head's chain, round for round; its fit is the scalar replay of the switch it picks; spellings and refusals are
one line. The live rounds are tested with the head trees (tests/test_head_tree.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specgym.agents.specs import make
from specgym.baselines import tree_hybrid
from specgym.baselines.tree_hybrid import NEVER, TreeHybrid, fit_hybrid, inner_outcomes
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.tree_runner import run_tree_controller


@pytest.fixture(scope="module")
def wl():
    """Twelve val and four test requests of the shipped recording (val is its fit split)."""
    full = cached_workload("smollm2-greedy")
    val, test = full.split_indices("val"), full.split_indices("test")
    out = full.subset(np.concatenate([val[:12], test[:4]]))
    assert out.fit_split == "val" and out.ranks_head is not None and out.lookup_len is not None
    return out


def _rows(wl, specs: str, split: str = "val") -> dict[str, dict]:
    rep = evaluate(EvalConfig(wl, specs, split=split, bootstrap=0))
    return {r["spec"]: r for r in rep["rows"]}


def test_with_a_head_chain_it_is_the_lookup_switch_round_for_round(wl):
    """``tree-hybrid:M:KN:tree-static:1-1-1@head`` (the head's chain of 3 as a width-1 tree) and
    ``lookup-switch:M:KN:3@head`` replay the same rounds, to the millisecond; M of 5 never switches (the head's chain
    alone, ``fixed:3@head``)."""
    rows = _rows(wl, "tree-hybrid:2:5:tree-static:1-1-1@head,lookup-switch:2:5:3@head,"
                     "tree-hybrid:1:8:tree-static:1-1-1@head,lookup-switch:1:8:3@head,"
                     f"tree-hybrid:{NEVER}:4:tree-static:1-1-1@head,fixed:3@head")
    for a, b in (("tree-hybrid:2:5:tree-static:1-1-1@head", "lookup-switch:2:5:3@head"),
                 ("tree-hybrid:1:8:tree-static:1-1-1@head", "lookup-switch:1:8:3@head"),
                 (f"tree-hybrid:{NEVER}:4:tree-static:1-1-1@head", "fixed:3@head")):
        assert rows[a]["total_time_ms"] == pytest.approx(rows[b]["total_time_ms"], rel=1e-12), (a, b)
        assert (rows[a]["tokens"], rows[a]["rounds"]) == (rows[b]["tokens"], rows[b]["rounds"])
    assert rows["lookup-switch:2:5:3@head"]["total_time_ms"] != rows["fixed:3@head"]["total_time_ms"]


def test_lookup_rounds_are_the_chain_replays(wl):
    """A lookup round from every position: the recorded n-gram run, the cap clipped to the request's end and to no
    proposal without a match, priced by the n-gram drafter's round table (what the chain replay plays)."""
    from specgym.envs.engines.replay.trace_engine import TraceEngine

    engine = TreeEngine(wl, None, 8, drafter="head")
    chain = TraceEngine(wl, None, 8)
    plain = 0
    for r in range(wl.n_requests):
        req, ref = engine.start(r), chain.start(r)
        for i in range(req.length):
            req.seek(i)
            ref.position, ref.done = i, False
            o, c = req.play_lookup(6), ref.verify(6, min(6, req.length - i - 1), "ngram")
            assert (o.accepted, o.produced, o.depth) == (c.accepted, c.produced, c.drafted)
            assert o.time_ms == pytest.approx(c.time_ms, rel=1e-12)
            plain += o.depth == 0
    assert plain > 0  # positions without a lookup match play a plain step
    with pytest.raises(SpecgymError, match="outside"):
        engine.start(0).seek(10_000)


@pytest.mark.parametrize("inner", ["tree-eagle:4:4:5", "tree-static:2-2-1"])
def test_the_fit_is_the_scalar_replay_of_the_switch_it_picks(wl, inner):
    """Every switch's vectorised total is checked on a sample against the scalar replay; the fit is the least."""
    engine = TreeEngine(wl, wl.profile, 8, drafter="head")
    model = make(f"{inner}@head", kinds=("tree",))
    fit = fit_hybrid(engine, model, 8)
    assert fit.split == "val" and fit.candidates == 5 * 8
    reqs = wl.split_indices("val")
    best = TreeHybrid(model, fit.m, fit.k_lookup)
    assert float(run_tree_controller(engine, reqs, best).time_ms.sum()) == pytest.approx(fit.time_ms, rel=1e-9)
    for m, k in ((1, 1), (3, 8), (NEVER, 2)):
        other = float(run_tree_controller(engine, reqs, TreeHybrid(model, m, k)).time_ms.sum())
        assert other >= fit.time_ms * (1 - 1e-12)


def test_the_harness_fits_on_the_fit_split_and_evaluates_the_test_split(wl, monkeypatch):
    asked: list[str | None] = []
    real = tree_hybrid.fit_hybrid
    monkeypatch.setattr(tree_hybrid, "fit_hybrid", lambda *a, **k: asked.append(k.get("split")) or real(*a, **k))
    rep = evaluate(EvalConfig(wl, "tree-hybrid@head", split="test", bootstrap=0))
    assert asked == [None]  # the default: the workload's fit split, never the evaluated one
    row = rep["rows"][0]
    assert row["spec"] == "tree-hybrid@head" and row["approximate"]
    assert any("fitted on" in n and "switches replayed" in n and "val split" in n for n in rep["notes"]), rep["notes"]


def test_the_inner_round_at_every_position_is_the_scalar_round(wl):
    engine = TreeEngine(wl, wl.profile, 8, drafter="head")
    reqs = wl.split_indices("val")[:3]
    for spec in ("tree-eagle:3:2:4@head", "tree-static:3-1@head"):
        ctrl = make(spec, kinds=("tree",))
        acc, tm = inner_outcomes(engine, reqs, ctrl)
        j = 0
        for r in reqs.tolist():
            req = engine.start(r)
            for i in range(req.length):
                req.seek(i)
                o = ctrl.play(req)
                assert (o.accepted, o.time_ms) == (acc[j], pytest.approx(tm[j], rel=1e-12)), (spec, r, i)
                j += 1
        assert j == len(acc)


def test_spellings_and_refusals_are_one_line(wl):
    ctrl = make("tree-hybrid@head", kinds=("tree",))
    assert isinstance(ctrl, TreeHybrid) and ctrl.name == "tree-hybrid:tree-eagle:fit@head"
    assert ctrl.drafter == ctrl.inner.drafter == "head" and ctrl.m is None
    given = make("tree-hybrid:2:6:tree-static:2-1", kinds=("tree",))
    assert (given.m, given.k_lookup, given.drafter, given.inner.name) == (2, 6, None, "tree-static:2-1")
    assert make("tree-eagle@head", kinds=("tree",)).drafter == "head"  # a bare tree spec names its drafter too
    for bad in ("tree-hybrid:2", "tree-hybrid:0:4", "tree-hybrid:2:9", "tree-hybrid:tree-static:2-1@head:2",
                "tree-hybrid:fixed:3", "tree-hybrid:tree-hybrid", "tree-hybrid@ngram"):
        with pytest.raises(SpecgymError) as exc:
            make(bad, kinds=("tree",))
        assert "\n" not in str(exc.value) and "tree-" in str(exc.value), bad
    with pytest.raises(SpecgymError, match="call prepare"):
        ctrl.reset(None)
    stateful = make("tree-hybrid:tree-chain:marginal", kinds=("tree",))
    with pytest.raises(SpecgymError, match=r"give the switch \(tree-hybrid:M:KN:"):
        stateful.prepare(wl, wl.profile)
    bare = dataclasses.replace(wl, lookup_len=None)
    with pytest.raises(SpecgymError, match="lookup"):
        TreeEngine(bare, None, 8, drafter="head").start(0).play_lookup(3)

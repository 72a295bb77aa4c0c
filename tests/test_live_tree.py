"""Live tree verification: greedy output equals plain decoding, caches hold the accepted path, replay == live.

The toy models are tiny RANDOMLY-INITIALISED GPT-2s (specgym.training.models.toy), not trained models; the tests of
the shipped trained pairs are skipped when a pair is absent.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym import make_controller  # noqa: E402
from specgym.agents.specs import make  # noqa: E402
from specgym.envs.core.cost import CostProfile  # noqa: E402
from specgym.envs.core.tree import TreeShape  # noqa: E402
from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair  # noqa: E402
from specgym.envs.engines.live.tree import (  # noqa: E402
    LiveTreeRequest,
    ancestor_matrix,
    run_live_tree,  # noqa: E402
    tree_parents,
)
from specgym.errors import SpecgymError  # noqa: E402
from specgym.paths import MODELS_DIR  # noqa: E402
from specgym.training.models.toy import toy_models, toy_tokenizer  # noqa: E402

torch.set_num_threads(1)

PROFILE = CostProfile(name="toy", draft_ms=0.5, verify_ms=tuple(5.0 + 0.1 * n for n in range(65)), source="synthetic")
PROMPTS = ["def f(x):\n    return x + 1\n", "the cat sat on the mat. ", "12 + 7 = 19, 3 * 4 ="]
WIDTHS = [(1,), (1, 1, 1, 1), (2, 2, 1), (3, 2, 1), (4,), (2, 2, 2, 2, 2), (3, 3, 3), (8, 1, 1)]
#: An irregular rank-closed tree (Sequoia's shapes are of this kind): child counts in breadth-first order.
IRREGULAR = TreeShape.from_children([3, 2, 1, 0, 1, 0, 0, 0], "irregular")


@pytest.fixture(scope="module")
def toy():
    tok = toy_tokenizer()
    draft, target = toy_models(len(tok), seed=0)
    return tok, LiveEngine(draft, target, k_max=8, timing=PROFILE)


def _play(eng, ids, tree, n):
    req = LiveTreeRequest(eng, ids, n)
    while not req.done:
        req.play_tree(tree)
    return req


@pytest.mark.parametrize("tree", [TreeShape.from_widths(w) for w in WIDTHS] + [IRREGULAR], ids=repr)
def test_tree_greedy_equals_plain(toy, tree):
    tok, eng = toy
    for p in PROMPTS:
        ids = tok(p)["input_ids"]
        ref = eng.run_plain(ids, 40).tokens
        res = _play(eng, ids, tree, 40).tree_result
        assert res.tokens == ref, (tree, p)
        assert sum(r.produced for r in res.rounds) == 40
        assert all(r.nodes == int(tree.nodes_upto[r.depth]) and r.accepted <= r.depth for r in res.rounds)


def test_wider_trees_accept_more_per_round(toy):
    """On the same prompts, a tree containing the chain accepts at least as much per round on average (a sanity
    check that off-path nodes are used: a broken mask or cache would make wide trees no better than chains)."""
    tok, eng = toy
    acc = {}
    for w in [(1, 1, 1), (3, 3, 3)]:
        rounds = [r for p in PROMPTS for r in _play(eng, tok(p)["input_ids"], TreeShape.from_widths(w),
                                                     60).tree_result.rounds]
        acc[w] = np.mean([r.accepted for r in rounds])
    assert acc[(3, 3, 3)] > acc[(1, 1, 1)]


def test_width_one_tree_is_the_chain_round_by_round(toy):
    tok, eng = toy
    for p in PROMPTS:
        ids = tok(p)["input_ids"]
        for k in (1, 3, 6):
            chain = eng.run_request(ids, k, 40)
            tree = _play(eng, ids, TreeShape.chain(k), 40).tree_result
            assert [(r.position, r.accepted) for r in tree.rounds] == \
                [(r.position, r.accepted) for r in chain.rounds]
            assert [r.time_ms for r in tree.rounds] == pytest.approx([r.time_ms for r in chain.rounds])


@pytest.mark.parametrize("eagle", [False, True])
def test_caches_hold_exactly_the_accepted_sequence(toy, eagle):
    """After every round the target cache equals a fresh prefill of the accepted sequence (all but its last token),
    and the draft cache a prefix of it: compaction kept the accepted path's keys/values at their new slots."""
    tok, eng = toy
    ids = tok(PROMPTS[0])["input_ids"]
    req = LiveTreeRequest(eng, ids, 30)
    tree = TreeShape.from_widths((3, 2, 2))
    while not req.done:
        if eagle:
            req.play_eagle(4, 3, 10)
        else:
            req.play_tree(tree)
        for cache, model in ((req.tcache, eng.target), (req.dcache, eng.draft)):
            n = cache.length
            assert n <= len(req.seq) - 1 or cache is req.dcache
            fresh = eng.new_cache(model)
            eng.forward(model, req.seq[:n], fresh)
            torch.testing.assert_close(cache.k[:, :, :n], fresh.k[:, :, :n], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(cache.v[:, :, :n], fresh.v[:, :, :n], atol=1e-5, rtol=1e-4)
        assert req.tcache.length == len(req.seq) - 1


def test_ancestor_mask():
    tree = TreeShape.from_widths((2, 2))
    parent = tree_parents(tree, tree.nodes)
    assert parent == [-1, 0, 0, 1, 1, 2, 2]
    anc = ancestor_matrix(parent)
    assert anc[5].tolist() == [True, False, True, False, False, True, False]
    assert anc.sum() == 1 + 2 * 2 + 4 * 3


@pytest.mark.parametrize("spec", ["tree-static:2-2-1", "tree-static:1-1-1-1", "tree-chain:fixed:3", "tree-chain:assc",
                                  "tree-chain:speclane", "tree-eagle", "tree-eagle:4:2:6", "tree-eagle:6:8:40"])
def test_tree_controllers_live_equal_plain(toy, spec):
    tok, eng = toy
    ctrl = make(spec, 8, kinds=("tree",))
    for p in PROMPTS:
        ids = tok(p)["input_ids"]
        res = run_live_tree(eng, ids, ctrl, 40)
        assert res.tokens == eng.run_plain(ids, 40).tokens, spec
        assert res.accepted > 0


def test_tree_chain_live_matches_the_chain_controller(toy):
    """``tree-chain:SPEC`` live takes the chain controller's decisions: the same rounds as SPEC on the chain
    engine (the controller observes the same outcomes)."""
    tok, eng = toy
    ids = tok(PROMPTS[1])["input_ids"]
    tree = run_live_tree(eng, ids, make("tree-chain:assc", 8, kinds=("tree",)), 50)
    chain = eng.run_request(ids, make_controller("assc", 8), 50)
    assert [(r.position, r.depth, r.accepted) for r in tree.rounds] == \
        [(r.position, r.drafted, r.accepted) for r in chain.rounds]


def test_eagle_live_rounds(toy):
    """Live EAGLE-2: beam 1 with budget = depth is the chain of that depth (same rounds as the chain engine); wider
    beams verify at most ``budget`` nodes, charge ``depth`` draft forwards, and accept more per round here."""
    tok, eng = toy
    ids = tok(PROMPTS[0])["input_ids"]
    one = run_live_tree(eng, ids, make("tree-eagle:4:1:4", 8, kinds=("tree",)), 40)
    chain = eng.run_request(ids, 4, 40)
    assert [(r.position, r.accepted) for r in one.rounds] == [(r.position, r.accepted) for r in chain.rounds]
    wide = run_live_tree(eng, ids, make("tree-eagle:4:4:16", 8, kinds=("tree",)), 40)
    assert all(r.nodes <= 16 and r.depth <= 4 for r in wide.rounds)
    full = [r for r in wide.rounds if r.position + 5 <= 40]
    assert all(r.time_ms == pytest.approx(4 * PROFILE.draft_ms + PROFILE.verify_nodes(r.nodes + 1)) for r in full)
    assert np.mean([r.accepted for r in wide.rounds]) > np.mean([r.accepted for r in one.rounds])


def test_sequoia_live(toy):
    """The Sequoia tree (fitted on a synthetic rank workload, labelled so) decodes live exactly."""
    from specgym.eval.bench.tree import rank_workload

    tok, eng = toy
    ctrl = make("tree-sequoia:24", 8, kinds=("tree",))
    ctrl.prepare(rank_workload(40), PROFILE)
    assert ctrl.tree.nodes > 1
    ids = tok(PROMPTS[2])["input_ids"]
    assert run_live_tree(eng, ids, ctrl, 40).tokens == eng.run_plain(ids, 40).tokens


def test_live_tree_errors(toy):
    tok, eng = toy
    ids = tok(PROMPTS[0])["input_ids"]
    from specgym.paths import PREDICTORS_DIR

    if any(PREDICTORS_DIR.glob("midpair*")):  # tree-predicted grows its tree from trace signals: replay only
        with pytest.raises(SpecgymError, match="replay only"):
            run_live_tree(eng, ids, make("tree-predicted:midpair", 8, kinds=("tree",)), 10)
    with pytest.raises(SpecgymError, match="token-level"):
        run_live_tree(eng, ids, make("tree-chain:confidence", 8, kinds=("tree",)), 10)
    with pytest.raises(SpecgymError, match="lean forward"):
        LiveTreeRequest(LiveEngine(eng.draft, eng.target, k_max=8, timing=PROFILE, lean=False), ids, 10)
    with pytest.raises(SpecgymError, match="above the engine's k_max"):
        LiveTreeRequest(eng, ids, 10).play_tree(TreeShape.chain(9))
    from specgym.agents.hf_generate import generate_with_controller

    with pytest.raises(SpecgymError, match="chains only"):
        generate_with_controller(eng.target, eng.draft, torch.tensor([ids]), make("tree-sequoia", 8, kinds=("tree",)))


def _shipped(name: str):
    return pytest.param(name, marks=pytest.mark.skipif(
        not (MODELS_DIR / name / "target" / "config.json").exists(), reason=f"shipped pair {name} not built"))


@pytest.mark.parametrize("name", [_shipped("midpair"), _shipped("tinypair")])
def test_shipped_pair_tree_greedy_equals_plain(name):
    pair = load_pair(str(MODELS_DIR / name / "draft"), str(MODELS_DIR / name / "target"))
    eng = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE)
    ids = encode_prompt(pair.tokenizer, "def parse(self, text):\n")
    ref = eng.run_plain(ids, 48).tokens
    for w in [(1,), (2, 2, 1), (3, 2, 1)]:
        res = _play(eng, ids, TreeShape.from_widths(w), 48).tree_result
        assert res.tokens == ref, w
        assert res.accepted > 0


@pytest.mark.parametrize("name", [_shipped("midpair")])
def test_tree_replay_equals_live_round_by_round(name):
    """Tree replay is exact against live for static trees: on recorded test requests of the pair's greedy workload
    (first 48 tokens), every live round's accepted depth equals the tree replay's at the same position."""
    from specgym.envs.engines.replay.tree_engine import TreeEngine
    from specgym.envs.workloads.trace_format import cached_workload

    pair = load_pair(str(MODELS_DIR / name / "draft"), str(MODELS_DIR / name / "target"))
    wl = cached_workload(f"{name}-greedy")
    live = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE)
    replay = TreeEngine(wl, PROFILE, max_depth=8)
    test = wl.split_indices("test")
    picked = [int(next(r for r in test if wl.category[r] == cat)) for cat in wl.categories()]
    n_rounds = wide = 0
    for r in picked:
        ids = encode_prompt(pair.tokenizer, wl.prompt_text[r])
        for tree in (TreeShape.from_widths((2, 2, 1)), TreeShape.from_widths((3, 2, 1)), TreeShape.from_widths((4, 2)),
                     TreeShape.chain(4)):
            res = _play(live, ids, tree, 48).tree_result
            rr = replay.start(r)
            for out in res.rounds:
                if out.depth < tree.depth:  # clipped at the live run's end (48 tokens, not the recorded length)
                    break
                assert rr.position == out.position
                o = rr.play(tree)
                assert (o.accepted, o.depth, o.nodes) == (out.accepted, out.depth, out.nodes), \
                    (wl.request_id[r], tree, out)
                n_rounds += 1
                wide += tree.child.shape[1] > 1
    assert n_rounds > 50 and wide > 30


def test_profile_measures_tree_verify_by_node_count(tmp_path):
    """``measure_profile(tree_nodes=...)`` measures verify of every node count with a tree mask (not extrapolated),
    and a chain-fitted profile gains those costs by :func:`extend_tree_verify`."""
    from specgym.envs.engines.live.profiler import extend_tree_verify, measure_profile
    from specgym.training.models.toy import save_toy_pair

    d, t = save_toy_pair(tmp_path / "pair", seed=0)
    pair = load_pair(str(d), str(t))
    prof = measure_profile(pair, k_max=4, context=32, repeats=3, warmup=1, tree_nodes=20)
    assert len(prof.verify_ms) == 21 and not prof.verify_extrapolated(21) and prof.verify_extrapolated(22)
    assert "tree attention" in prof.description and all(v > 0 for v in prof.verify_ms)
    chain = CostProfile("fit", 0.1, (1.0, 1.1, 1.2, 1.3, 1.4), source="measured")
    ext = extend_tree_verify(chain, prof)
    assert ext.verify_ms[:5] == chain.verify_ms and len(ext.verify_ms) == 21
    if "times the micro-benchmarked" in ext.description:  # timings so noisy that shifted entries went negative
        assert ext.verify_nodes(21) == pytest.approx(1.4 * prof.verify_ms[20] / prof.verify_ms[4], abs=1e-3)
    else:
        assert ext.verify_nodes(21) == pytest.approx(1.4 + prof.verify_ms[20] - prof.verify_ms[4], abs=1e-3)
    assert all(v > 0 for v in ext.verify_ms)
    with pytest.raises(SpecgymError, match="tree_nodes"):
        measure_profile(pair, k_max=4, tree_nodes=65)


def test_profile_cli_tree_nodes(tmp_path, capsys):
    from specgym.cli import main
    from specgym.envs.profiles import load_profile
    from specgym.training.models.toy import save_toy_pair

    d, t = save_toy_pair(tmp_path / "pair", seed=0)
    common = ["profile", "--draft", str(d), "--target", str(t), "--k-max", "4", "--context", "32", "--repeats", "2",
              "--warmup", "1", "--method", "micro"]
    assert main([*common, "--tree-nodes", "65", "--out", str(tmp_path / "bad.json")]) == 2
    assert "--tree-nodes 65" in capsys.readouterr().err and not (tmp_path / "bad.json").exists()
    assert main([*common, "--tree-nodes", "12", "--out", str(tmp_path / "p.json")]) == 0
    assert len(load_profile(tmp_path / "p.json").verify_ms) == 13
    assert main([*common, "--tree-nodes", "0", "--out", str(tmp_path / "c.json")]) == 0
    assert len(load_profile(tmp_path / "c.json").verify_ms) == 5


@pytest.mark.slow
@pytest.mark.parametrize("name", [_shipped("midpair")])
def test_live_bench_runs_trees_beside_chains(name, tmp_path):
    """The live bench with tree specs (short): tree rows paired with the chain rows, outputs identical to plain,
    a tree-vs-chain comparison with its interval, the profiles extended with measured tree verify."""
    from rich.console import Console

    from specgym.eval.bench.live import run_live_bench

    r = run_live_bench(Console(file=open(tmp_path / "out.txt", "w"), width=200), pair_name=name,
                       workload=f"{name}-greedy", per_category=1, repeats=1, profile="cpu-midpair",
                       specs=["fixed:2", "tree-static:2-1", "tree-eagle:3:2:4", "tree-chain:fixed:2"],
                       calibration_prompts=1, resamples=200, max_new_tokens=16, hf_generate=False,
                       micro_repeats=2)
    rows = {row["controller"]: row for row in r["rows"]}
    assert set(rows) == {"fixed:0", "fixed:2", "tree-static:2-1", "tree-eagle:3:2:4", "tree-chain:fixed:2"}
    assert all(row["greedy_identical"] for row in rows.values())
    assert all(row["vs_best_fixed_ci"] is not None and row["predicted_tok_s"] > 0 for row in rows.values())
    tvc = r["tree_vs_chain"]
    assert tvc["tree"] in ("tree-static:2-1", "tree-eagle:3:2:4") and tvc["chain"] in ("fixed:0", "fixed:2")
    assert tvc["verdict"] in ("faster", "slower", "tie") and len(tvc["ci"]) == 2
    assert len(r["profile"]["verify_ms"]) == 65 and len(r["micro_profile"]["verify_ms"]) == 65
    assert r["tree_shapes"]["tree-static:2-1"].startswith("2-1 (4 nodes")
    assert r["approximate_predictions"] == ["tree-eagle:3:2:4"]  # EAGLE-2 is exact live, modelled in replay
    assert "tree vs chain" in (tmp_path / "out.txt").read_text()


def test_live_bench_specs_checked_before_anything_runs(capsys):
    from specgym.cli import main
    from specgym.eval.bench.live import check_live_specs

    assert check_live_specs("fixed:2, tree-static:2-2-1,tree-eagle,tree-chain:fixed:3,tree-sequoia:20") == \
        ["fixed:2", "tree-static:2-2-1", "tree-eagle", "tree-chain:fixed:3", "tree-sequoia:20"]
    for bad in ("tree-static:0-2", "tree-bogus", "fixed:2,nope", "tree-chain:confidence"):
        with pytest.raises(SpecgymError):
            check_live_specs(bad)
    assert main(["bench", "live", "--controllers", "fixed:2,tree-static:2-x"]) == 2
    assert "tree-static:2-x" in capsys.readouterr().err


@pytest.mark.parametrize("name", [_shipped("midpair")])
def test_tree_ppo_live_equals_plain(name):
    """The shipped tree-mode PPO policy decodes live through tree verification, exactly (it observes each round as
    the chain round along the draft's rank-0 spine)."""
    from specgym.paths import POLICIES_DIR

    if not (POLICIES_DIR / "midpair-tree").exists():
        pytest.skip("shipped midpair-tree policy absent")
    pair = load_pair(str(MODELS_DIR / name / "draft"), str(MODELS_DIR / name / "target"))
    eng = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE)
    ids = encode_prompt(pair.tokenizer, "def parse(self, text):\n")
    ctrl = make("tree-ppo:midpair-tree", 8, kinds=("tree",))
    res = run_live_tree(eng, ids, ctrl, 48)
    assert res.tokens == eng.run_plain(ids, 48).tokens
    assert len({r.nodes for r in res.rounds}) >= 1 and res.accepted > 0

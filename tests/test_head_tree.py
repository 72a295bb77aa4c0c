"""Trees drafted by the draft head, live: greedy output equals plain decoding, each round accepts what the head's
recorded ranks predict, the caches and the head's feature follow the accepted path, EAGLE-2 runs on the head; and
recorded (``ranks_head``, ``topk_head``) and replayed: the tree replay of a recorded request gives the live rounds.

The pair is the tiny RANDOM Llama of tests/conftest.py (its weights scaled by 8 so that its greedy text varies) and a
head built with ``build_head`` whose input layer is a least-squares fit of the target's next feature on these
prompts (its MLP zeroed): a synthetic, untrained stand-in that ranks the target's token first often and lower
often enough to exercise every tree (not a trained head).
"""

from __future__ import annotations

import numpy as np
import pytest
from head_pairs import TEXTS, tiny_head_pair

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specgym.agents.specs import make  # noqa: E402
from specgym.envs.core.cost import CostProfile, DraftCost  # noqa: E402
from specgym.envs.core.kinds import HEAD_DRAFTER  # noqa: E402
from specgym.envs.core.tree import TreeShape  # noqa: E402
from specgym.envs.engines.live.draft_head import build_head, target_features  # noqa: E402
from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.envs.engines.live.head_tree import NO_RANK, head_ranks, recorded_head_ranks  # noqa: E402
from specgym.envs.engines.live.tree import LiveTreeRequest, run_live_tree  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402

torch.set_num_threads(1)

N = 32
PROFILE = CostProfile("toy-head", draft_ms=0.5, verify_ms=tuple(5.0 + 0.1 * n for n in range(65)), source="synthetic",
                      drafters=(("draft", DraftCost("model", 0.0, 0.5)), (HEAD_DRAFTER, DraftCost("model", 0.3, 0.2))))
SHAPES = [TreeShape.chain(3), TreeShape.from_widths((2, 2, 1)), TreeShape.from_widths((3, 2, 1)),
          TreeShape.from_widths((4,)), TreeShape.from_widths((8, 1, 1)), TreeShape.from_widths((2, 2, 2, 2)),
          TreeShape.from_children([3, 2, 1, 0, 1, 0, 0, 0], "irregular")]


@pytest.fixture(scope="module")
def pair(tiny_target):
    """``(tokenizer, engine, prompt ids, plain completions by prompt)``: the tiny Llama as target (and draft) with a
    fitted head (tests/head_pairs.py)."""
    return tiny_head_pair(tiny_target, PROFILE, N)


def _play(eng, ids, tree, n=N):
    req = LiveTreeRequest(eng, ids, n, drafter=HEAD_DRAFTER)
    while not req.done:
        req.play_tree(tree)
    return req


def test_head_trees_equal_plain_and_accept_what_the_recorded_ranks_predict(pair):
    """Every shape, every prompt: the output is plain decoding's, and each round's accepted depth is the tree walk
    over the head's true-path ranks from the round's start (:func:`head_ranks`): the children really are the head's
    top-c tokens, the feature really is the target's at the last accepted node."""
    _, eng, prompts, plain = pair
    ranks = {tuple(ids): recorded_head_ranks(eng.target, eng.head, ids, plain[tuple(ids)], 8) for ids in prompts}
    off_spine = accepted = 0
    for tree in SHAPES:
        for ids in prompts:
            res = _play(eng, ids, tree).tree_result
            assert res.tokens == plain[tuple(ids)], (tree, ids)
            assert sum(r.produced for r in res.rounds) == N
            for r in res.rounds:
                rk = ranks[tuple(ids)][r.position]
                assert r.accepted == tree.accepted(rk.tolist(), r.depth), (tree, r)
                assert r.nodes == int(tree.nodes_upto[r.depth])
                off_spine += bool((rk[: r.accepted] > 0).any())
                accepted += r.accepted
    assert accepted > 100 and off_spine > 20  # the tests see deep paths through non-top-1 children
    r0 = ranks[tuple(prompts[0])]
    assert r0.dtype == np.int16 and r0.shape == (N, 8) and (r0[-1, 1:] == NO_RANK).all()


def test_a_width_one_head_tree_is_the_head_chain_round_by_round(pair):
    """The chain ``(1,) * K`` drafted as a tree by the head plays the rounds of the chain engine's ``K@head``, priced
    alike (the profile's head drafter)."""
    _, eng, prompts, _ = pair
    for ids in prompts[:2]:
        for k in (1, 3, 6):
            chain = eng.start(ids, N)
            while not chain.done:
                chain.play(k, drafter=HEAD_DRAFTER)
            tree = _play(eng, ids, TreeShape.chain(k)).tree_result
            assert [(r.position, r.accepted) for r in tree.rounds] == \
                [(r.position, r.accepted) for r in chain.result.rounds]
            assert [r.time_ms for r in tree.rounds] == pytest.approx([r.time_ms for r in chain.result.rounds])
    t = _play(eng, prompts[0], TreeShape.from_widths((2, 2))).tree_result.rounds[0].time_ms
    assert t == pytest.approx(0.3 + 2 * 0.2 + PROFILE.verify_nodes(7))  # two head steps, seven tokens verified


@pytest.mark.parametrize("eagle", [False, True])
def test_caches_and_the_head_feature_follow_the_accepted_path(pair, eagle):
    """After every round the target cache equals a fresh prefill of the accepted sequence (all but its last token)
    and the head's feature is the target's hidden state before the last token; the draft model's cache is not
    touched by head rounds."""
    _, eng, prompts, _ = pair
    req = LiveTreeRequest(eng, prompts[1], N, drafter=HEAD_DRAFTER)
    dlen = req.dcache.length
    tree = TreeShape.from_widths((3, 2, 2))
    while not req.done:
        if eagle:
            req.play_eagle(4, 3, 10)
        else:
            req.play_tree(tree)
        n = req.tcache.length
        assert n == len(req.seq) - 1
        fresh = eng.new_cache(eng.target)
        with torch.inference_mode():
            _, hidden = eng.forward_hidden(eng.target, req.seq[:n], fresh)
        torch.testing.assert_close(req.tcache.k[:, :, :n], fresh.k[:, :, :n], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(req.tcache.v[:, :, :n], fresh.v[:, :, :n], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(req.feature, hidden[-1], atol=1e-4, rtol=1e-4)
    assert req.dcache.length == dlen


def _eagle_reference(head, feature, last, depth, beam, budget):
    """EAGLE-2's kept nodes as token paths, grown one node at a time (no batching): what the batched head must do."""
    nodes = [(1.0, 0, (), head.step(feature[None], torch.tensor([last])))]  # score, depth, path, feature
    frontier = [0]
    for d in range(1, depth + 1):
        new = []
        for g in frontier:
            score, _, path, f = nodes[g]
            probs = torch.softmax(head.scores(f).float(), -1)[0]
            top = torch.topk(probs, beam)
            for p, c in zip(top.values.tolist(), top.indices.tolist()):
                tok = int(head.ids[c])
                new.append(len(nodes))
                nodes.append((score * p, d, path + (tok,), head.step(f, torch.tensor([tok]))))
        frontier = sorted(new, key=lambda g: (-nodes[g][0], g))[:beam]
    kept = sorted(range(1, len(nodes)), key=lambda g: (-nodes[g][0], nodes[g][1], g))[:budget]
    paths = {nodes[g][2] for g in kept}
    return {p for p in paths if all(p[:j] in paths for j in range(1, len(p)))}


def test_eagle_on_the_head(pair):
    """EAGLE-2 on the head: greedy-exact; every round verifies the tree a node-by-node reference grows (its accepted
    depth: the longest true continuation among the kept paths); beam 1 with budget = depth is the head chain."""
    _, eng, prompts, plain = pair
    deep = 0
    for ids in prompts:
        truth = plain[tuple(ids)]
        for depth, beam, budget in ((4, 1, 4), (4, 4, 16), (6, 3, 12)):
            req = LiveTreeRequest(eng, ids, N, drafter=HEAD_DRAFTER)
            while not req.done:
                feature, last, i = req.feature.clone(), req.seq[-1], req.position
                r = req.play_eagle(depth, beam, budget)
                with torch.inference_mode():
                    kept = _eagle_reference(eng.head, feature, last, min(depth, N - i - 1), beam, budget)
                want = max(j for j in range(len(truth) - i) if tuple(truth[i:i + j]) in kept or j == 0)
                assert r.accepted == want and r.nodes == len(kept), (ids, depth, beam, r)
                assert r.depth == max((len(p) for p in kept), default=0) <= depth and r.nodes <= budget
                deep += r.accepted >= 2 and beam > 1
            assert req.tree_result.tokens == truth, (ids, depth, beam)
    assert deep > 5
    ids = prompts[0]
    one = run_live_tree(eng, ids, make("tree-eagle:4:1:4", 8, kinds=("tree",)), N, drafter=HEAD_DRAFTER)
    chain = eng.start(ids, N)
    while not chain.done:
        chain.play(4, drafter=HEAD_DRAFTER)
    assert [(r.position, r.accepted) for r in one.rounds] == [(r.position, r.accepted) for r in chain.result.rounds]


@pytest.mark.parametrize("spec", ["tree-static:2-2-1", "tree-chain:fixed:3", "tree-chain:assc", "tree-eagle:4:2:6"])
def test_tree_controllers_run_on_the_head(pair, spec):
    """run_live_tree(drafter="head") (or a controller naming ``drafter = "head"``) drives tree controllers with the
    head, exactly; chain controllers inside ``tree-chain`` observe the head's spine confidence."""
    _, eng, prompts, plain = pair
    ctrl = make(spec, 8, kinds=("tree",))
    for ids in prompts[:2]:
        res = run_live_tree(eng, ids, ctrl, N, drafter=HEAD_DRAFTER)
        assert res.tokens == plain[tuple(ids)], spec
        assert res.accepted > 0
    ctrl.drafter = HEAD_DRAFTER
    via_attr = run_live_tree(eng, prompts[0], ctrl, N)
    assert [(r.position, r.accepted) for r in via_attr.rounds] == \
        [(r.position, r.accepted) for r in run_live_tree(eng, prompts[0], make(spec, 8, kinds=("tree",)), N,
                                                          drafter=HEAD_DRAFTER).rounds]


def test_a_one_token_prompt_drafts_from_the_second_round(pair):
    """A one-token prompt has no feature before its last token: the first head round verifies the root alone (as the
    head chain proposes nothing), and its verify forward gives the head its feature."""
    _, eng, prompts, _ = pair
    ids = prompts[0][:1]
    plain = eng.run_plain(ids, 12).tokens
    for play in (lambda r: r.play_tree(TreeShape.from_widths((2, 1))), lambda r: r.play_eagle(3, 2, 4)):
        req = LiveTreeRequest(eng, ids, 12, drafter=HEAD_DRAFTER)
        assert req.feature is None
        while not req.done:
            play(req)
        rounds = req.tree_result.rounds
        assert req.tree_result.tokens == plain and rounds[0].nodes == 0 and rounds[1].nodes > 0


def test_spine_statistics_of_head_trees(pair):
    _, eng, prompts, _ = pair
    req = LiveTreeRequest(eng, prompts[0], N, drafter=HEAD_DRAFTER)
    req.play_tree(TreeShape.from_widths((2, 2, 1)), stats=True)
    assert len(req.spine_conf) == 3 and ((req.spine_conf > 0) & (req.spine_conf <= 1)).all()
    assert (req.spine_entropy >= 0).all()
    req.play_tree(TreeShape.from_children([2, 0, 1, 0], "spine-ends"), stats=True)  # the rank-0 child is a leaf
    assert len(req.spine_conf) == 1


def test_head_trees_refuse_in_one_line(pair):
    _, eng, prompts, _ = pair
    ids = prompts[0]
    with pytest.raises(SpecgymError, match=r"greedy: temperature 0.7 needs tree speculative sampling .* not "
                                           r"implemented") as err:
        LiveTreeRequest(eng, ids, 8, drafter=HEAD_DRAFTER, temperature=0.7)
    assert "\n" not in str(err.value)
    with pytest.raises(SpecgymError, match="not implemented"):
        run_live_tree(eng, ids, make("tree-static:2-1", 8, kinds=("tree",)), 8, drafter=HEAD_DRAFTER, temperature=1)
    with pytest.raises(SpecgymError, match="not 'ngram'"):
        LiveTreeRequest(eng, ids, 8, drafter="ngram")
    bare = LiveEngine(eng.draft, eng.target, k_max=8, timing=PROFILE)
    with pytest.raises(SpecgymError, match="no draft head"):
        LiveTreeRequest(bare, ids, 8, drafter=HEAD_DRAFTER)
    with pytest.raises(SpecgymError, match="lean forward"):
        LiveTreeRequest(LiveEngine(eng.draft, eng.target, k_max=8, timing=PROFILE, lean=False, head=eng.head), ids, 8,
                        drafter=HEAD_DRAFTER)
    with pytest.raises(SpecgymError, match="vocabulary of"):
        small = build_head(eng.head.width, 4, eng.target.get_input_embeddings().weight, [1, 2, 3])
        LiveTreeRequest(LiveEngine(eng.draft, eng.target, k_max=8, timing=PROFILE, head=small), ids, 8,
                        drafter=HEAD_DRAFTER).play_tree(TreeShape.from_widths((4,)))


def test_head_ranks_mark_tokens_the_head_cannot_propose(pair):
    """A token outside the head's vocabulary has no rank (:data:`NO_RANK`), so no tree accepts it; ranks beyond the
    completion are :data:`NO_RANK` too."""
    _, eng, prompts, plain = pair
    ids = prompts[0]
    seq = list(ids) + plain[tuple(ids)]
    feats = target_features(eng.target, seq)
    ranks = head_ranks(eng.head, feats, seq, len(ids), 3)
    inside = set(eng.head.ids.tolist())
    for g in range(N):
        for j in range(3):
            if g + j >= N:
                assert ranks[g, j] == NO_RANK
            elif seq[len(ids) + g + j] not in inside:
                assert ranks[g, j] == NO_RANK
            else:
                assert 0 <= ranks[g, j] < len(inside)
    hidden = [t for t in range(eng.head.embedding.shape[0]) if t not in inside][:1]
    forced = seq[: len(ids)] + hidden * 4
    assert (head_ranks(eng.head, target_features(eng.target, forced), forced, len(ids), 2) == NO_RANK).all()


def test_head_ranks_agree_with_the_recorded_head_runs(pair):
    """``runs_head`` (what recordings store for head chains) is the count of leading rank-0 entries of the ranks:
    the ranks hold the chain's acceptance and, beyond it, the trees'."""
    from specgym.envs.engines.live.draft_head import head_runs

    _, eng, prompts, plain = pair
    for ids in prompts:
        seq = list(ids) + plain[tuple(ids)]
        feats = target_features(eng.target, seq)
        ranks = head_ranks(eng.head, feats, seq, len(ids), 6)
        lead = np.where((ranks == 0).all(axis=1), 6, (ranks != 0).argmax(axis=1))
        assert lead.tolist() == head_runs(eng.head, feats, seq, len(ids), 6).tolist()


def test_a_tree_spec_names_the_head():
    """``TREE_SPEC@head`` builds the tree rule with ``drafter = "head"`` (what the live tree runner and the head's
    tree replay read); other drafters are refused."""
    from specgym.agents.specs import build

    r = build("tree-eagle:5:3:10@head", kinds=("tree",))
    assert (r.controller.drafter, r.controller.name, r.entry.kind) == ("head", "tree-eagle:5:3:10@head", "tree")
    assert build("tree-static:2-2-1", kinds=("tree",)).controller.drafter is None
    with pytest.raises(SpecgymError, match="drafted by the draft model or @head, not @ngram"):
        build("tree-static:2-2-1@ngram", kinds=("tree",))


# ------------------------------------------------------------------------------------------ recorded and replayed


@pytest.fixture(scope="module")
def recorded(pair, tmp_path_factory):
    """``(path, workload)``: the three prompts recorded greedily (``specgym record``'s recorder) by the pair with its
    head, so the trace carries ``ranks_head`` and ``topk_head``."""
    from specgym.envs.engines.live.model_loading import LivePair
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.workloads.prompts import PromptSpec
    from specgym.envs.workloads.trace_format import load_workload

    tok, eng, _, _ = pair
    live_pair = LivePair(eng.target, eng.target, tok, "tiny-target", "tiny-target", head=eng.head)
    out = tmp_path_factory.mktemp("rec") / "head.parquet"
    specs = [PromptSpec(f"q{i}", t, "code") for i, t in enumerate(TEXTS)]
    record_workload(live_pair, specs, out, RecordingSpec(N, 0.0, PROFILE, seed=0, split_fractions=(0.0, 0.0, 1.0)))
    return out, load_workload(out)


def _replayed(tree_eng, r, play):
    req = tree_eng.start(r)
    rounds = []
    while not req.done:
        rounds.append(play(req))
    return rounds


def test_a_recording_stores_the_heads_per_start_ranks(pair, recorded):
    """``ranks_head[g]`` is :func:`head_ranks` of the start ``g`` capped at 64 (the cap also where the head cannot
    propose the token or past the completion), int8; its leading zeros are the head chain's runs; ``topk_head`` holds
    the head's top-8 probabilities there (uint16, times 65535), descending."""
    from specgym.envs.engines.live.model_loading import encode_prompt
    from specgym.envs.workloads.workload import HEAD_RANK_CAP, HEAD_TOPK_SCALE

    tok, eng, _, _ = pair
    _, wl = recorded
    assert wl.ranks_head.dtype == np.int8 and wl.ranks_head.shape == (wl.n_positions, 8)
    assert wl.topk_head.dtype == np.uint16 and wl.topk_head.shape == (wl.n_positions, 64)
    assert wl.signal_meta["head_ranks"]["version"] == 1 and wl.signal_meta["head_ranks"]["depth"] == 8
    for r in range(wl.n_requests):
        ids = encode_prompt(tok, wl.prompt_text[r])
        comp = wl.token_id[wl.span(r)].tolist()
        want = recorded_head_ranks(eng.target, eng.head, ids, comp, 8)
        rows = wl.ranks_head[wl.span(r)].astype(np.int64)
        np.testing.assert_array_equal(rows, np.minimum(want, HEAD_RANK_CAP))
        assert (rows[-1, 1:] == HEAD_RANK_CAP).all()
        lead = np.where((rows == 0).all(axis=1), 8, (rows != 0).argmax(axis=1))
        np.testing.assert_array_equal(lead, np.minimum(wl.runs[HEAD_DRAFTER][wl.span(r)], 8))
    top = wl.topk_head.reshape(wl.n_positions, 8, 8).astype(np.float64) / HEAD_TOPK_SCALE
    assert (np.diff(top, axis=2) <= 0).all() and top[:, 0, 0].min() > 0 and (top.sum(axis=2) <= 1 + 1e-3).all()
    assert ((wl.ranks_head > 0) & (wl.ranks_head < HEAD_RANK_CAP)).sum() > 20  # deep off-spine ranks are exercised


def test_an_older_recording_gains_the_head_ranks(pair, recorded):
    """``with_head_ranks`` adds to a recording without them exactly the columns the recorder writes."""
    from specgym.envs.engines.live.model_loading import LivePair
    from specgym.envs.engines.live.recorder import with_head_ranks

    tok, eng, _, _ = pair
    _, wl = recorded
    meta = {k: v for k, v in wl.signal_meta.items() if k != "head_ranks"}
    bare = wl.with_columns({k: v for k, v in wl.flat_columns().items() if not k.endswith("_head") or
                            k.startswith("runs_")}, signal_meta=meta)
    assert bare.ranks_head is None and bare.topk_head is None
    again = with_head_ranks(bare, LivePair(eng.target, eng.target, tok, "t", "t", head=eng.head))
    np.testing.assert_array_equal(again.ranks_head, wl.ranks_head)
    np.testing.assert_array_equal(again.topk_head, wl.topk_head)
    assert again.signal_meta == wl.signal_meta
    with pytest.raises(SpecgymError, match="no draft head"):
        with_head_ranks(bare, LivePair(eng.target, eng.target, tok, "t", "t"))


def test_replayed_head_trees_accept_what_the_live_head_trees_accept(pair, recorded):
    """Every shape, every recorded request: the tree replay of the head tree (``drafter="head"``, from
    ``ranks_head``) gives the live head tree's rounds on the same prompt: positions, accepted tokens, nodes and
    (priced by the same profile) times; the vectorised static replay gives the same totals; EAGLE-2 with beam 1 (a
    chain, so its replay is exact) too."""
    from specgym.baselines.tree_eagle import EagleTree
    from specgym.envs.engines.live.model_loading import encode_prompt
    from specgym.envs.engines.replay.tree_engine import TreeEngine

    tok, eng, _, _ = pair
    _, wl = recorded
    tree_eng = TreeEngine(wl, PROFILE, 8, drafter=HEAD_DRAFTER)
    deep = 0
    for tree in SHAPES:
        static = tree_eng.run_static(np.arange(wl.n_requests), tree)
        for r in range(wl.n_requests):
            live = _play(eng, encode_prompt(tok, wl.prompt_text[r]), tree).tree_result
            assert live.tokens == wl.token_id[wl.span(r)].tolist()
            rep = _replayed(tree_eng, r, lambda q: q.play(tree))
            assert [(o.position, o.accepted, o.nodes) for o in rep] == \
                [(o.position, o.accepted, o.nodes) for o in live.rounds], (tree, r)
            assert [o.time_ms for o in rep] == pytest.approx([o.time_ms for o in live.rounds])
            assert (static["rounds"][r], static["accepted"][r]) == (len(live.rounds), live.accepted)
            assert static["time_ms"][r] == pytest.approx(live.time_ms)
            deep += sum(o.accepted >= 2 for o in rep)
    assert deep > 20
    chain = EagleTree(4, 1, 4)
    for r in range(wl.n_requests):
        live = run_live_tree(eng, encode_prompt(tok, wl.prompt_text[r]), make("tree-eagle:4:1:4", 8, kinds=("tree",)),
                             N, drafter=HEAD_DRAFTER)
        rep = _replayed(tree_eng, r, chain.play)
        assert [(o.position, o.accepted) for o in rep] == [(o.position, o.accepted) for o in live.rounds]
        assert all(o.approximate for o in rep)


def test_the_hybrid_live_equals_plain_and_replays_round_for_round(pair, recorded):
    """``tree-hybrid`` live (prompt-lookup chains on a context match, head trees otherwise): the output is plain
    decoding's, both kinds of round are played, and the tree replay of the recording gives the live rounds
    (positions, accepted tokens; times priced by the same profile, the n-gram drafter's for a lookup chain, where
    the replay's modelled proposal length is the live one)."""
    from specgym.envs.engines.live.model_loading import encode_prompt
    from specgym.envs.engines.replay.tree_engine import TreeEngine

    tok, eng, _, _ = pair
    _, wl = recorded
    assert "ngram" in wl.drafter_names and wl.lookup_len is not None
    tree_eng = TreeEngine(wl, PROFILE, 8, drafter=HEAD_DRAFTER)
    kinds = {"lookup": 0, "tree": 0}
    for spec in ("tree-hybrid:1:4:tree-static:2-2-1@head", "tree-hybrid:2:8:tree-eagle:3:2:5@head"):
        for r in range(wl.n_requests):
            ids = encode_prompt(tok, wl.prompt_text[r])
            ctrl = make(spec, 8, kinds=("tree",))
            live = run_live_tree(eng, ids, ctrl, N)
            assert live.tokens == wl.token_id[wl.span(r)].tolist(), (spec, r)
            if "eagle" in spec:  # EAGLE-2's replay is approximate: its rounds are not the live ones
                continue
            req, replayed, lookup_at = tree_eng.start(r), make(spec, 8, kinds=("tree",)), []
            replayed.reset(req.context)
            rep = []
            while not req.done:
                lookup_at.append(req.lookup_len() >= replayed.m)
                rep.append(replayed.play(req))
            # a lookup chain's length is modelled as its cap (the recording keeps its run): live, a proposal whose
            # match lies near the context's end is shorter; the rounds are the same
            assert [(o.position, o.accepted) for o in rep] == [(o.position, o.accepted) for o in live.rounds]
            assert all(a.nodes >= b.nodes for a, b in zip(rep, live.rounds))
            same = [(a.time_ms, b.time_ms) for a, b in zip(rep, live.rounds) if a.nodes == b.nodes]
            assert 2 * len(same) >= len(rep) and [a for a, _ in same] == pytest.approx([b for _, b in same])
            kinds["lookup"] += sum(lookup_at)
            kinds["tree"] += len(lookup_at) - sum(lookup_at)
    assert kinds["lookup"] > 5 and kinds["tree"] > 5, kinds
    # a drafter-choice rule choosing per round (tree-online's structure; the switch needs no fit on this recording):
    # live equals plain, and the live rounds are the replayed ones
    from specgym.baselines.lookup_switch import LookupSwitch
    from specgym.baselines.tree_online import TreeDrafterChoice

    def online():
        return TreeDrafterChoice(LookupSwitch(1, 4, 3, HEAD_DRAFTER), make("tree-static:2-2-1@head", 8,
                                                                          kinds=("tree",)), "switch")

    for r in range(wl.n_requests):
        live = run_live_tree(eng, encode_prompt(tok, wl.prompt_text[r]), online(), N)
        assert live.tokens == wl.token_id[wl.span(r)].tolist()
        replayed = online()
        replayed.reset(tree_eng.context(r))
        rep = _replayed(tree_eng, r, replayed.play)
        assert [(o.position, o.accepted) for o in rep] == [(o.position, o.accepted) for o in live.rounds]


def test_a_head_tree_policy_decides_live_as_in_replay(pair, recorded, tmp_path):
    """A tree policy on the head (random, untrained) decides every live round as it decides the replayed round: it
    observes the same rounds (priced by the same profile, as the head) without spine features in both."""
    from tree_policies import tree_artifact

    from specgym.agents.artifact import write_artifact
    from specgym.envs.engines.live.model_loading import encode_prompt
    from specgym.envs.engines.replay.tree_engine import TreeEngine

    tok, eng, _, _ = pair
    _, wl = recorded
    path = write_artifact(tree_artifact(HEAD_DRAFTER, seed=5), tmp_path / "policy")
    tree_eng = TreeEngine(wl, PROFILE, 8, drafter=HEAD_DRAFTER)
    shapes = set()
    for r in range(wl.n_requests):
        live_ctrl, rep_ctrl = (make(f"tree-ppo:{path}", 8, kinds=("tree",)) for _ in range(2))
        chosen: list[str] = []
        real = live_ctrl.action

        def spy(real=real, ctrl=live_ctrl, chosen=chosen) -> int:
            a = real()
            chosen.append(ctrl.menu[a].label)
            return a

        live_ctrl.action = spy  # type: ignore[method-assign]
        live = run_live_tree(eng, encode_prompt(tok, wl.prompt_text[r]), live_ctrl, N)
        assert live.tokens == wl.token_id[wl.span(r)].tolist()
        req = tree_eng.start(r)
        rep_ctrl.reset(req.context)
        replayed = []
        while not req.done:
            replayed.append(rep_ctrl.menu[rep_ctrl.action()].label)
            rep_ctrl.play(req)
        assert replayed == chosen
        shapes |= set(chosen)
    assert len(shapes) > 1
    eagle = tree_artifact(HEAD_DRAFTER, seed=2, extra=("eagle:3:2:4", "eagle:4:4:5"))
    eagle.biases[-1][-1] = 100.0  # always the EAGLE-2 round: live, from the head's real probabilities
    path = write_artifact(eagle, tmp_path / "eagle")
    for r in range(wl.n_requests):
        live = run_live_tree(eng, encode_prompt(tok, wl.prompt_text[r]), make(f"tree-ppo:{path}", 8, kinds=("tree",)),
                             N)
        assert live.tokens == wl.token_id[wl.span(r)].tolist() and max(o.nodes for o in live.rounds) > 4


def test_the_modelled_eagle_scores_are_the_heads_true_path_probabilities(pair, recorded):
    """``draft_topk`` of a head request reads ``topk_head`` at the round's start: at depth 1 the head's real top-8
    probabilities of the round's root, as EAGLE-2 live sees them (to the storage's 1/65535)."""
    from specgym.envs.engines.live.model_loading import encode_prompt
    from specgym.envs.engines.replay.tree_engine import TreeEngine

    tok, eng, _, _ = pair
    _, wl = recorded
    req = TreeEngine(wl, PROFILE, 8, drafter=HEAD_DRAFTER).start(0)
    live = LiveTreeRequest(eng, encode_prompt(tok, wl.prompt_text[0]), N, drafter=HEAD_DRAFTER)
    with torch.inference_mode():
        f = eng.head.step(live.feature[None], torch.tensor([live.seq[-1]]))
        want = torch.topk(torch.softmax(eng.head.scores(f).float(), -1), 8).values[0].numpy()
    np.testing.assert_allclose(req.draft_topk(5)[0], want, atol=2e-5)
    assert req.draft_topk(12).shape == (12, 8) and not req.draft_topk(12)[8:].any()


def test_eval_replays_head_trees_from_the_recording(recorded):
    """``specgym eval`` runs ``TREE_SPEC@head`` rows on a recording with ``ranks_head``: the static head tree's
    totals are the tree engine's; EAGLE-2 on the head is labelled approximate."""
    from specgym.envs.engines.replay.tree_engine import TreeEngine
    from specgym.eval.harness import EvalConfig, evaluate

    path, wl = recorded
    rep = evaluate(EvalConfig(workload=str(path), controllers="fixed:3@head,tree-static:2-2-1@head,"
                                                              "tree-eagle:4:2:6@head", split="all", bootstrap=0,
                              profile=PROFILE))
    rows = {row["controller"]: row for row in rep["rows"]}
    static = TreeEngine(wl, PROFILE, 8, drafter=HEAD_DRAFTER).run_static(np.arange(wl.n_requests),
                                                                        TreeShape.from_widths((2, 2, 1)))
    assert rows["tree-static:2-2-1@head"]["total_time_ms"] == pytest.approx(static["time_ms"].sum())
    assert "tree-eagle:4:2:6@head (approximate)" in rows


def test_replay_of_head_trees_refuses_in_one_line(recorded):
    """Without ``ranks_head`` (every shipped trace so far) the row is refused naming the column; a rule fitted on the
    draft model's columns and one that observes the spine's confidences are refused on the head; the engine refuses
    trees deeper than the recorded depth and other drafters."""
    from specgym.envs.engines.replay.tree_engine import TreeEngine
    from specgym.eval.harness import EvalConfig, evaluate

    path, wl = recorded
    cases = [("midpair-greedy", "tree-static:2-2-1@head", "has no 'ranks_head' column"),
             (str(path), "tree-sequoia:32@head", "fitted on the draft model's columns"),
             (str(path), "tree-chain:fixed:3@head", "observes the spine's confidences")]
    for workload, spec, match in cases:
        with pytest.raises(SpecgymError, match=match) as err:
            evaluate(EvalConfig(workload=workload, controllers=spec, split="all", max_requests=2, bootstrap=0,
                                profile=PROFILE if workload == str(path) else None))
        assert "\n" not in str(err.value)
    with pytest.raises(SpecgymError, match="holds 8 depths"):
        TreeEngine(wl, PROFILE, 12, drafter=HEAD_DRAFTER).start(0).play(TreeShape.chain(10))
    with pytest.raises(SpecgymError, match="not 'ngram'"):
        TreeEngine(wl, PROFILE, 8, drafter="ngram")
    # topk_head is optional: without it static head trees replay, EAGLE-2 on the head is refused naming it
    from specgym.baselines.tree_eagle import EagleTree

    lean = TreeEngine(wl.with_columns({k: v for k, v in wl.flat_columns().items() if k != "topk_head"}), PROFILE, 8,
                      drafter=HEAD_DRAFTER)
    assert lean.start(0).play(TreeShape.from_widths((2, 1))).produced >= 1
    with pytest.raises(SpecgymError, match="no 'topk_head' column"):
        EagleTree(4, 2, 6).play(lean.start(0))


def test_the_head_rank_columns_are_checked_on_load(recorded, tmp_path):
    """A trace whose ``head_ranks`` block has another version, or lacks it beside the columns, is refused in one
    line naming the file and the field; a trace without the columns (the shipped ones) loads with ``None``."""
    import json

    import pyarrow.parquet as pq

    from specgym.envs.workloads.trace_format import META_KEY, load_workload, read_workload_file, workload_to_table

    _, wl = recorded
    for change, match in ((lambda m: m["signals"]["head_ranks"].update(version=2), "head_ranks.version' is 2"),
                          (lambda m: m["signals"].pop("head_ranks"), "needs metadata field 'signals.head_ranks'")):
        table = workload_to_table(wl)
        meta = json.loads(table.schema.metadata[META_KEY])
        change(meta)
        bad = tmp_path / "bad.parquet"
        pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), bad)
        with pytest.raises(SpecgymError, match=match) as err:
            read_workload_file(bad)
        assert str(bad) in str(err.value) and "\n" not in str(err.value)
    old = load_workload("midpair-greedy")
    assert old.ranks_head is None and old.topk_head is None


def test_the_shipped_real_pair_recording_replays_head_trees(tmp_path):
    """``smollm2-greedy`` ships with the head's per-start ranks and top-8 (added by ``with_head_ranks``), so a user's
    ``specgym eval`` runs head trees in replay with no recording of their own; a static head tree accepts more per
    round than the head chain it extends."""
    import json

    from specgym.cli import main
    from specgym.envs.workloads.trace_format import cached_workload

    wl = cached_workload("smollm2-greedy")
    assert wl.ranks_head is not None and wl.topk_head is not None and len(wl.ranks_head) == len(wl.token_id)
    out = tmp_path / "ev"
    assert main(["eval", "--workload", "smollm2-greedy", "--split", "val", "--controllers",
                 "fixed:3@head,tree-static:2-2-1@head,tree-eagle:5:3:10@head", "--no-plots", "--out", str(out)]) == 0
    rows = {r["spec"]: r for r in json.loads((out / "report.json").read_text())["rows"]}
    chain, tree = rows["fixed:3@head"], rows["tree-static:2-2-1@head"]
    assert tree["mean_accept_len"] > chain["mean_accept_len"] > 1.0
    assert rows["tree-eagle:5:3:10@head"]["throughput_tok_s"] > 0

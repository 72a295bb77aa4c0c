"""Chain rules that read draft confidence on the draft head (``confidence:T@head``, ``cumulative:H@head``): the replay
of the shipped recording stops where the head's recorded confidences (``topk_head``) say, token by token; the live
head gives the same confidences as it drafts, so live rounds equal replayed ones and greedy output equals plain
decoding; a rule the head cannot serve is refused in one line.

The live pair is the tiny RANDOM Llama of tests/conftest.py with a least-squares fitted head (the construction of
tests/test_head_tree.py, copied: a synthetic stand-in, not a trained head).
"""

from __future__ import annotations

import numpy as np
import pytest
from head_pairs import TEXTS, tiny_head_pair

from specgym.agents.specs import build, make
from specgym.baselines.drafter_chain import ChainOnDrafter
from specgym.envs.core.drafter_choice import drive_drafters
from specgym.envs.core.kinds import HEAD_DRAFTER
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError
from specgym.eval.drafter_runner import run_drafter_controller

K_MAX = 8


def _rounds(ctrl, req, drafters):
    out = []
    drive_drafters(ctrl, req, drafters, out.append)
    return out


def _by_hand(conf: np.ndarray, runs: np.ndarray, tau: float) -> list[tuple[int, int, int]]:
    """``(position, drafted, accepted)`` of ``confidence:tau@head`` on one request: draft up to ``k_max`` (clipped to
    the request's end), stop after the first token whose head confidence ``conf[g, j - 1]`` is below tau, accept the
    head's run from the round's start."""
    n, i, rows = len(runs), 0, []
    while i < n:
        cap = min(K_MAX, n - i - 1)
        drafted = next((j for j in range(1, cap) if conf[i, j - 1] < tau), cap)
        accepted = min(int(runs[i]), drafted)
        rows.append((i, drafted, accepted))
        i += accepted + 1
    return rows


@pytest.fixture(scope="module")
def smollm2():
    wl = cached_workload("smollm2-greedy")
    return wl, TraceEngine(wl, load_profile("cpu-smollm2"), K_MAX)


@pytest.mark.parametrize("tau", [0.2, 0.5, 0.8])
def test_replayed_confidence_on_the_head_is_the_hand_computation(smollm2, tau):
    """A few val requests of the shipped recording: every round's position, drafted and accepted tokens are the hand
    computation from ``topk_head`` (the head's top probability at each depth from the round's start) and
    ``runs_head``; the round carries those confidences, no entropy, no signals; the harness row sums them."""
    wl, eng = smollm2
    conf = wl.topk_head.reshape(wl.n_positions, -1, 8)[:, :, 0].astype(np.float64) / 65535.0
    reqs = wl.split_indices("val")[:6]
    ctrl = make(f"confidence:{tau}@head", K_MAX, kinds=("drafter",))
    stopped = drafted = accepted = 0
    for r in reqs:
        sl = wl.span(int(r))
        want = _by_hand(conf[sl], wl.runs[HEAD_DRAFTER][sl], tau)
        got = _rounds(ctrl, eng.start(int(r)), wl.drafter_names)
        assert [(o.position, o.drafted, o.accepted) for o in got] == want, (tau, r)
        for o in got:
            np.testing.assert_allclose(o.draft_conf, conf[sl][o.position, : o.drafted], atol=1e-6)
            assert np.isnan(o.draft_entropy).all() and o.signals is None
            assert o.drafter == HEAD_DRAFTER or not o.drafted
        stopped += sum(0 < d < min(K_MAX, len(conf[sl]) - p - 1) for p, d, _ in want)
        drafted += sum(d for _, d, _ in want)
        accepted += sum(a for _, _, a in want)
    assert stopped > 10  # the stops are exercised
    res = run_drafter_controller(eng, reqs, make(f"confidence:{tau}@head", K_MAX, kinds=("drafter",)))
    assert (int(res.drafted.sum()), int(res.accepted.sum())) == (drafted, accepted)


def test_the_stop_is_asked_as_the_head_drafts_with_its_confidence_only(smollm2):
    """The engine asks the rule after each head token (not up front): the rule's context lacks the head's entropy but
    not its confidence, and ``marginal@head`` (whose feature tracker reads confidence and entropy together) keeps its
    no-feature path, so it plays the same rounds with or without ``topk_head``."""
    wl, eng = smollm2
    r = int(wl.split_indices("val")[0])
    ctrl = make("cumulative@head", K_MAX, kinds=("drafter",))
    steps = []
    inner_keep = ctrl.inner.keep_drafting
    ctrl.inner.keep_drafting = lambda step: steps.append(step) or inner_keep(step)
    got = _rounds(ctrl, eng.start(r), wl.drafter_names)
    assert ctrl.token_level and "draft_entropy" in ctrl.inner.ctx.lacks and "draft_conf" not in ctrl.inner.ctx.lacks
    assert steps and all(np.isfinite(s.conf) and np.isnan(s.entropy) and s.signals is None for s in steps)
    assert len(steps) == sum(max(o.drafted - (o.drafted == o.planned_k), 0) for o in got)
    bare = wl.with_columns({k: v for k, v in wl.flat_columns().items() if k != "topk_head"})
    bare_eng = TraceEngine(bare, eng.profile, K_MAX)
    reqs = wl.split_indices("val")
    with_conf = run_drafter_controller(eng, reqs, make("marginal@head", K_MAX, kinds=("drafter",)))
    without = run_drafter_controller(bare_eng, reqs, make("marginal@head", K_MAX, kinds=("drafter",)))
    assert np.array_equal(with_conf.time_ms, without.time_ms) and np.array_equal(with_conf.drafted, without.drafted)
    m = make("marginal@head", K_MAX, kinds=("drafter",))
    m.reset(eng.context(r), wl.drafter_names)
    assert m.token_level and m.inner.tracker.has_conf is False


def test_rules_the_head_cannot_serve_are_refused_in_one_line(smollm2):
    wl, eng = smollm2
    for spec, fragment in (("entropy@head", "entropy reads draft_entropy, which the draft head's rounds do not carry"),
                           ("confidence@ngram", "reads draft_conf, which ngram's proposals do not carry"),
                           ("predicted:midpair@head", "predicted:midpair@head: predictor .*midpair.json predicts the "
                                                      "draft model's tokens"),
                           ("entropy@ngram", "of the default drafter.s tokens")):
        with pytest.raises(SpecgymError, match=fragment) as err:
            build(spec, K_MAX, kinds=("drafter",))
        assert "\n" not in str(err.value)
    assert isinstance(build("confidence:0.4@head", K_MAX, kinds=("drafter",)).controller, ChainOnDrafter)
    bare = wl.with_columns({k: v for k, v in wl.flat_columns().items() if k != "topk_head"})
    with pytest.raises(SpecgymError, match="does not carry.*'topk_head'") as err:
        run_drafter_controller(TraceEngine(bare, eng.profile, K_MAX), wl.split_indices("val")[:1],
                               make("confidence:0.4@head", K_MAX, kinds=("drafter",)))
    assert "\n" not in str(err.value) and "confidence:0.4@head" in str(err.value)


# ------------------------------------------------------------------------------------------ live, on a tiny pair
N = 32


@pytest.fixture(scope="module")
def pair(tiny_target):
    """``(tokenizer, engine, profile)``: the tiny Llama as target (and draft) with a fitted head
    (tests/head_pairs.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from specgym.envs.core.cost import CostProfile, DraftCost

    profile = CostProfile("toy-head", draft_ms=0.5, verify_ms=tuple(5.0 + 0.1 * n for n in range(65)),
                          source="synthetic", drafters=(("draft", DraftCost("model", 0.0, 0.5)),
                                                        (HEAD_DRAFTER, DraftCost("model", 0.3, 0.2))))
    tok, eng, _, _ = tiny_head_pair(tiny_target, profile, N, K_MAX)
    return tok, eng, profile


@pytest.fixture(scope="module")
def recorded(pair, tmp_path_factory):
    """The three prompts recorded greedily by the pair with its head (``topk_head`` included)."""
    from specgym.envs.engines.live.model_loading import LivePair
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.workloads.prompts import PromptSpec
    from specgym.envs.workloads.trace_format import load_workload

    tok, eng, profile = pair
    out = tmp_path_factory.mktemp("rec") / "head.parquet"
    record_workload(LivePair(eng.target, eng.target, tok, "tiny-target", "tiny-target", head=eng.head),
                    [PromptSpec(f"q{i}", t, "code") for i, t in enumerate(TEXTS)], out,
                    RecordingSpec(N, 0.0, profile, seed=0, split_fractions=(0.0, 0.0, 1.0)))
    return load_workload(out)


def test_the_heads_confident_proposal_is_its_greedy_proposal(pair):
    """``propose_confident`` drafts :meth:`propose`'s tokens with the head's softmax maximum at each; a stop after token
    j runs exactly j head steps."""
    torch = pytest.importorskip("torch")
    _, eng, _ = pair
    head = eng.head
    f = torch.randn(head.width, generator=torch.Generator().manual_seed(0))
    toks, confs = head.propose_confident(f, 5, 6)
    assert toks == head.propose(f, 5, 6) and len(confs) == 6
    fx, tok, want = f[None], torch.tensor([5]), []
    with torch.inference_mode():
        for t in toks:
            fx = head.step(fx, tok)
            want.append(float(torch.softmax(head.scores(fx).float(), -1).max()))
            tok = torch.tensor([t])
    assert confs == pytest.approx(want, abs=1e-6)
    calls, step = [], head.step
    head.step = lambda *a: calls.append(1) or step(*a)
    try:
        asked = []
        got, _ = head.propose_confident(f, 5, 6, lambda j, c, p: asked.append((j, c)) or j < 2)
    finally:
        del head.step
    assert got == toks[:2] and len(calls) == 2 and [j for j, _ in asked] == [1, 2]
    assert [c for _, c in asked] == pytest.approx(confs[:2], abs=1e-6)


@pytest.mark.parametrize("spec", ["confidence:0.6@head", "confidence:0.9@head", "cumulative:0.2@head",
                                  "marginal@head"])
def test_live_head_confidence_rounds_are_the_replayed_rounds(pair, recorded, spec):
    """Each recorded request: the live rounds of the rule on the head (positions, drafted, accepted) are the replay's
    of the recording, the confidences of the round's judged tokens agree (uint16 rounding), and the output is plain
    decoding's."""
    from specgym.envs.engines.live.model_loading import encode_prompt

    tok, eng, profile = pair
    wl = recorded
    rep_eng = TraceEngine(wl, profile, K_MAX)
    stopped = 0
    for r in range(wl.n_requests):
        ids = encode_prompt(tok, wl.prompt_text[r])
        req = eng.start(ids, N)
        live = _rounds(make(spec, K_MAX, kinds=("drafter",)), req, eng.drafter_names)
        assert req.result.tokens == wl.token_id[wl.span(r)].tolist() == eng.run_plain(ids, N).tokens
        rep = _rounds(make(spec, K_MAX, kinds=("drafter",)), rep_eng.start(r), wl.drafter_names)
        assert [(o.position, o.drafted, o.accepted) for o in live] == \
            [(o.position, o.drafted, o.accepted) for o in rep], (spec, r)
        for a, b in zip(live, rep):
            judged = min(a.accepted + 1, a.drafted)  # past the first rejection replay has the correct-prefix values
            np.testing.assert_allclose(a.draft_conf[:judged], b.draft_conf[:judged], atol=1e-4)
            assert np.isnan(a.draft_entropy).all() and (a.drafter == b.drafter or not a.drafted)
        stopped += sum(0 < o.drafted < o.planned_k for o in live)
    if not spec.startswith("marginal"):
        assert stopped > 3, spec  # the rule really stops the head mid-round


def test_live_confidence_on_the_head_needs_a_greedy_request(pair):
    _, eng, _ = pair
    with pytest.raises(SpecgymError, match=r"confidence:0.4@head reads the head's draft confidence.*temperature 0.7"):
        drive_drafters(make("confidence:0.4@head", K_MAX, kinds=("drafter",)),
                       eng.start([5, 6, 7], 8, temperature=0.7, seed=1), eng.drafter_names)


def test_live_head_predictor_rounds_are_the_replayed_rounds(pair, recorded, tmp_path):
    """``predicted:FILE@head`` (a hand-set head predictor: the head's top-8, position and index, not trained) plays the
    same rounds live as in replay: the live head's ``DraftStep`` carries its top-8 (``drafter_topk``, from its softmax)
    as the recording's ``topk_head`` does, and the predictor prices every judged step."""
    from specgym.envs.core.acceptance_predictor import HEAD_GROUPS, AcceptancePredictor, save_predictor
    from specgym.envs.engines.live.model_loading import encode_prompt

    tok, eng, profile = pair
    wl = recorded
    w = np.array([[1.0, -0.5, 0.8, 0.2, 0.5, -0.3, 0.4, 0.2, 0.0, -0.6]]).T
    pred = AcceptancePredictor("hand-head", HEAD_GROUPS, "logistic", np.zeros(10), np.ones(10), ((w, np.zeros(1)),),
                               threshold=1.0, drafter=HEAD_DRAFTER)
    path = save_predictor(pred, tmp_path / "hand-head.json")
    spec = f"predicted:{path}@head"
    rep_eng = TraceEngine(wl, profile, K_MAX)
    priced = stopped = 0
    for r in range(wl.n_requests):
        ids = encode_prompt(tok, wl.prompt_text[r])
        req = eng.start(ids, N)
        ctrl = make(spec, K_MAX, kinds=("drafter",))
        steps = []
        keep = ctrl.inner.keep_drafting
        ctrl.inner.keep_drafting = lambda step: steps.append(step) or keep(step)
        live = _rounds(ctrl, req, eng.drafter_names)
        assert req.result.tokens == wl.token_id[wl.span(r)].tolist()
        rep = _rounds(make(spec, K_MAX, kinds=("drafter",)), rep_eng.start(r), wl.drafter_names)
        assert [(o.position, o.drafted, o.accepted) for o in live] == \
            [(o.position, o.drafted, o.accepted) for o in rep], r
        assert all(len(s.drafter_topk) == 8 and s.drafter_topk[0] == pytest.approx(s.conf, abs=1e-6) for s in steps)
        assert ctrl.inner.fallbacks == 0
        priced += ctrl.inner.predicted
        stopped += sum(0 < o.drafted < o.planned_k for o in live)
    assert priced > 10 and stopped > 3  # the predictor really stops the head mid-round

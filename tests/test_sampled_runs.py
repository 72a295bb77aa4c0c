"""Whole-proposal drafters under sampling: prompt lookup and the draft head keep the target's distribution live
(exact speculative sampling), and a sampled recording's per-start runs are one exact draw of that round."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym.envs.core.cost import CostProfile  # noqa: E402
from specgym.envs.core.kinds import HEAD_DRAFTER, NGRAM_DRAFTER  # noqa: E402
from specgym.envs.engines.live.draft_head import build_head  # noqa: E402
from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.envs.engines.live.sampled_runs import SampledRequest, head_proposals, ngram_proposals  # noqa: E402
from specgym.training.models.toy import toy_models  # noqa: E402

torch.set_num_threads(1)
PROFILE = CostProfile("toy", draft_ms=1.0, verify_ms=tuple(10.0 + 0.5 * i for i in range(17)),
                      round_overhead_ms=0.5, source="synthetic")


def _head(target, mlp: int = 16, seed: int = 0):
    """An untrained head over the target's embedding: it proposes tokens the target often rejects."""
    torch.manual_seed(seed)
    emb = target.get_input_embeddings().weight
    return build_head(int(emb.shape[1]), mlp, emb, list(range(int(emb.shape[0])))).eval().requires_grad_(False)


def _probs(target, prefix, vocab, temperature):
    with torch.no_grad():
        logits = target(torch.tensor([prefix])).logits[0, -1, :vocab].double()
    return torch.softmax(logits / temperature, -1).numpy()


@pytest.mark.parametrize("drafter", [NGRAM_DRAFTER, HEAD_DRAFTER])
def test_sampled_whole_proposal_rounds_keep_the_targets_distribution(drafter):
    """Chi-square on the first two sampled tokens (vocab 6; the first round drafts two): drafting by prompt lookup
    (a deterministic proposal, q one-hot) or by the head (its own softmax) changes nothing of the law of the output."""
    vocab, temperature = 6, 0.9
    draft, target = toy_models(vocab, seed=3, draft_noise=0.6, head_scale=0.8)
    eng = LiveEngine(draft, target, k_max=3, timing=PROFILE, head=_head(target))
    prompt = [2, 3, 4, 2, 3]  # the suffix "2 3" recurs: prompt lookup proposes "4 2 3"
    p1 = _probs(target, prompt, vocab, temperature)
    joint = np.array([p1[a] * _probs(target, prompt + [a], vocab, temperature) for a in range(vocab)])
    n = 3000
    counts = np.zeros((vocab, vocab))
    drafted = rejected = 0
    for s in range(n):
        req = eng.start(prompt, 3, temperature=temperature, seed=s)
        while not req.done:
            req.play(3, drafter=drafter)
        counts[tuple(req.result.tokens[:2])] += 1
        drafted += req.result.drafted
        rejected += sum(r.drafted - r.accepted for r in req.result.rounds)
    assert drafted >= n and rejected > 0.2 * n  # drafts were made and the resampling path is exercised
    obs, exp = counts.ravel(), joint.ravel() * n
    keep = exp >= 5
    obs_k, exp_k = np.append(obs[keep], obs[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
    exp_k = exp_k * obs_k.sum() / exp_k.sum()
    stat = float(((obs_k - exp_k) ** 2 / exp_k).sum())
    dof = len(obs_k) - 1
    critical = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3  # chi-square's 99.9% quantile
    assert stat < critical, (stat, dof)
    # power: a round that kept every draft would put the proposal's token first far more often than the target
    if drafter == NGRAM_DRAFTER:
        assert counts[4].sum() / n < p1[4] + 0.05 and p1[4] < 0.9


@pytest.fixture(scope="module")
def toy():
    from specgym.training.models.toy import toy_tokenizer

    tok = toy_tokenizer()
    draft, target = toy_models(len(tok), seed=0)
    eng = LiveEngine(draft, target, k_max=8, timing=PROFILE, signals=False)
    text = "the cat sat on the mat. the cat sat on the mat. the cat"
    ids = tok(text)["input_ids"]
    res = eng.run_plain(ids, 30, temperature=0.3, seed=4)
    return eng, target, ids, res.tokens


def _brute_runs(target, ids, p_len, proposals, q, u, vocab, temperature):
    """Each start's run from full forwards of the target over its context and proposal (no cache, no mask)."""
    runs = []
    for g in range(proposals.shape[0]):
        run = 0
        for j in range(proposals.shape[1]):
            y = int(proposals[g, j])
            if y < 0:
                break
            p = _probs(target, ids[: p_len + g] + proposals[g, :j].tolist(), vocab, temperature)
            qx = 1.0 if q is None else float(q[g, j])
            if not u[g, j] < min(1.0, p[y] / qx):
                break
            run += 1
        runs.append(run)
    return np.array(runs)


def test_recorded_sampled_runs_are_one_exact_draw_per_start(toy):
    """The tree-masked, cached depth forwards give each start the run full forwards over its own context and
    proposal give, for prompt lookup and for the head (whose drawn probabilities are those of its chain)."""
    eng, target, prompt, completion = toy
    temperature, k = 0.3, 5
    req = SampledRequest(eng.runner_of(target), prompt, completion, temperature, eng.vocab)
    ids = list(prompt) + list(completion)
    rng = np.random.default_rng(0)
    props = ngram_proposals(ids, len(prompt), k, *eng.ngram_n)
    assert (props[:, 0] >= 0).sum() >= 10  # the repeated text gives prompt lookup proposals
    u = rng.random(props.shape)
    runs = req.runs(props, None, u)
    np.testing.assert_array_equal(runs, _brute_runs(target, ids, len(prompt), props, None, u, eng.vocab, temperature))
    assert runs.max() >= 1 and (runs[props[:, 0] >= 0] == 0).any()
    # proposals the target sampled itself (the completion from each start) reach the deeper, masked depths
    n = len(completion)
    own = np.array([(list(completion[g:g + k]) + [-1] * k)[:k] for g in range(n)])
    q_own = np.full(own.shape, 0.5)
    u = rng.random(own.shape)
    deep = req.runs(own, q_own, u)
    np.testing.assert_array_equal(deep, _brute_runs(target, ids, len(prompt), own, q_own, u, eng.vocab,
                                                    temperature))
    assert deep.max() >= 3
    head = _head(target, seed=1)
    toks, q = head_proposals(head, req, k, rng.random(props.shape))
    # the drawn probabilities are the head's chain fed its own draws
    f = req.hidden[len(prompt) - 2]
    last = ids[len(prompt) - 1]
    for j in range(k):
        f = head.step(f[None], torch.tensor([last]))[0]
        dist = torch.softmax(head.scores(f[None])[0] / temperature, -1)
        last = int(toks[0, j])
        assert float(dist[last]) == pytest.approx(float(q[0, j]), rel=1e-5)
    u = rng.random(props.shape)
    runs = req.runs(toks, q, u)
    np.testing.assert_array_equal(runs, _brute_runs(target, ids, len(prompt), toks, q, u, eng.vocab, temperature))
    assert runs.max() >= 1


def test_a_sampled_recording_stores_each_drafters_draws_and_replays_them(tmp_path):
    """A sampled recording of a pair with a head carries ``runs_ngram`` and ``runs_head`` (said to be draws in its
    metadata); recomputing them on the finished workload gives the same draws; fixed K of each drafter replays."""
    import dataclasses

    from specgym.envs.engines.live.model_loading import load_pair
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload, with_drafter_runs
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.envs.workloads.prompts import PromptSpec
    from specgym.envs.workloads.trace_format import load_workload
    from specgym.training.models.toy import save_toy_pair

    d, t = save_toy_pair(tmp_path / "pair", seed=0)
    pair = load_pair(str(d), str(t))
    pair = dataclasses.replace(pair, head=_head(pair.target))
    texts = ["the cat sat on the mat. the cat sat on", "abcabcabc abcabc abc", "one two, one two, one"]
    specs = [PromptSpec(f"q{i}", text, "prose") for i, text in enumerate(texts)]
    out = tmp_path / "s.parquet"
    wl, _ = record_workload(pair, specs, out, RecordingSpec(24, 0.3, PROFILE, seed=1))
    back = load_workload(out)
    assert set(back.runs) == {NGRAM_DRAFTER, HEAD_DRAFTER}
    info = {d["name"]: d for d in back.drafters}
    assert info[HEAD_DRAFTER]["runs"] == "per-start" and "speculative sampling" in info[HEAD_DRAFTER]["source"]
    for name in (NGRAM_DRAFTER, HEAD_DRAFTER):
        assert len(back.runs[name]) == back.n_positions and back.runs[name].max() <= 16
    bare = back.with_columns({k: v for k, v in back.flat_columns().items() if not k.startswith("runs_")},
                             drafters=[])
    again = with_drafter_runs(bare, pair)
    for name in (NGRAM_DRAFTER, HEAD_DRAFTER):
        np.testing.assert_array_equal(again.runs[name], back.runs[name])
    for name in (NGRAM_DRAFTER, HEAD_DRAFTER):
        eng = TraceEngine(back, drafter=name, k_max=4)
        for r in range(back.n_requests):
            req = eng.start(r)
            runs = back.runs[name][back.span(r)]
            while not req.done:
                o = req.play(4)
                assert o.accepted == min(int(runs[o.position]), o.drafted)

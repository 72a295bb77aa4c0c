"""The prompt-lookup (n-gram) drafter: vLLM's proposer semantics, its per-start runs, and live drafter choice
(greedy-exact, outputs equal to plain decoding) on a toy pair written by the tests."""

from __future__ import annotations

import numpy as np
import pytest

from specgym.envs.core.ngram_proposer import ngram_propose, ngram_runs


def _brute(tokens, k, min_n, max_n):
    """The definition, spelled out: the longest n in [min_n, max_n] with an earlier occurrence, its earliest one."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        for s in range(0, L - n):
            if tokens[s:s + n] == tokens[L - n:]:
                return tokens[s + n:s + n + k]
    return []


def test_vllm_docstring_example_and_brute_force():
    assert ngram_propose([1, 2, 3, 4, 2, 3], 4, 2, 3) == [4, 2, 3]  # vLLM's own example
    assert ngram_propose([1, 2, 3], 4, 1, 4) == []
    assert ngram_propose([5, 5], 3, 1, 4) == [5]
    rng = np.random.default_rng(0)
    for _ in range(300):
        seq = rng.integers(0, 4, int(rng.integers(1, 30))).tolist()
        k, lo = int(rng.integers(1, 6)), int(rng.integers(1, 3))
        hi = int(rng.integers(lo, 5))
        assert ngram_propose(seq, k, lo, hi) == _brute(seq, k, lo, hi), (seq, k, lo, hi)


def test_runs_are_the_leading_matches_of_each_start_proposal():
    prompt, comp = [1, 2, 3], [1, 2, 3, 1, 2, 9]
    runs = ngram_runs(prompt, comp, 4)
    for g in range(len(comp)):
        prop = ngram_propose(prompt + comp[:g], 4)
        want = next((j for j, (a, b) in enumerate(zip(prop, comp[g:])) if a != b), min(len(prop), len(comp) - g))
        assert runs[g] == want
    assert runs[0] == 0 and runs[3] == 2  # at g = 3 the context 1 2 3 1 2 3 proposes 1 2 3; the text goes 1 2 9


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def toy():
    from specgym.training.models.toy import toy_models, toy_tokenizer

    tok = toy_tokenizer()
    draft, target = toy_models(len(tok), seed=0)
    return tok, draft, target


def test_live_drafter_choice_is_greedy_exact_and_records_the_ngram_drafter(toy):
    from specgym.baselines.drafter_fixed import FixedDrafter
    from specgym.baselines.lookup_rule import LookupRule
    from specgym.envs.core.cost import CostProfile
    from specgym.envs.core.drafter_choice import drive_drafters
    from specgym.envs.engines.live.engine import LiveEngine

    tok, draft, target = toy
    profile = CostProfile("toy", draft_ms=1.0, verify_ms=tuple(10.0 + 0.5 * i for i in range(17)),
                          round_overhead_ms=0.5, source="synthetic")
    eng = LiveEngine(draft, target, k_max=8, timing=profile)
    for p in ("the cat sat on the mat. the cat sat on the mat. the cat", "abcabcabcabc"):
        ids = tok(p)["input_ids"]
        plain = eng.run_plain(ids, 40).tokens
        for ctrl in (LookupRule(1, k_model=4), FixedDrafter("ngram", 6), FixedDrafter("draft", 3)):
            req = eng.start(ids, 40)
            tot = drive_drafters(ctrl, req, eng.drafter_names)
            assert req.result.tokens == plain, ctrl.name
            assert tot.tokens == 40
        req = eng.start(ids, 40)
        drive_drafters(FixedDrafter("ngram", 8), req, eng.drafter_names)
        ngram_rounds = [r for r in req.result.rounds if r.drafted]
        assert all(r.drafter == "ngram" for r in ngram_rounds)
        runs = ngram_runs(ids, plain, 8)  # replay of the recorded runs: the same accepted counts
        for r in req.result.rounds:
            assert r.accepted == min(int(runs[r.position]), r.planned_k) or r.drafted == 0
            want = profile.verify(r.drafted + 1) + (profile.round_overhead_ms if r.drafted else 0.0)
            assert r.time_ms == pytest.approx(want)  # no draft phase: the verify and the round's overhead
    sampled = eng.start(ids, 12, temperature=0.7)  # sampled requests draft by prompt lookup too (q one-hot)
    while not sampled.done:
        sampled.play(3, drafter="ngram")
    assert len(sampled.result.tokens) == 12
    assert any(r.drafter == "ngram" and r.drafted for r in sampled.result.rounds)


def test_a_default_drafter_round_without_a_name_counts_as_the_default():
    """A live model round reports drafter None (the engine's default): the features read it as the default drafter,
    as they read replay's named rounds."""
    from specgym.envs.core.drafter_features import DrafterFeatureTracker
    from specgym.envs.core.rounds import RoundOutcome, RoundStart

    named, unnamed = DrafterFeatureTracker(8), DrafterFeatureTracker(8)
    for tr, drafter in ((named, "draft"), (unnamed, None)):
        tr.reset(None, ("draft", "ngram"))
        tr.update(RoundOutcome(0, 4, 4, 4, 5, 1.0, drafter=drafter))
    start = RoundStart(5, 20, 0)
    np.testing.assert_array_equal(named.observation(start), unnamed.observation(start))
    assert unnamed.observation(start)[8] == 0.0  # not the "first round / plain step" code

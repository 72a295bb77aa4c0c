"""specgym's vLLM custom proposer (``specgym.agents.vllm_proposer``): prompt lookup with each request's K chosen by a
specgym controller, driven here through vLLM's ``propose`` call the way vLLM's model runner makes it (rows that move
as requests finish, no request ids). The end-to-end run in real vLLM is in ``tests/test_vllm.py`` (one vLLM engine at a
time: that file's tests run on one worker)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specgym.agents.vllm_proposer import ENV_PROFILE, SpecgymProposer
from specgym.envs.core.ngram_proposer import ngram_propose
from specgym.errors import SpecgymError

ROOT = Path(__file__).resolve().parent.parent
K = 4


def _config(k: int = K, max_len: int = 400) -> SimpleNamespace:
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k, prompt_lookup_min=1,
                                                              prompt_lookup_max=4),
                           model_config=SimpleNamespace(max_model_len=max_len))


def _answers(n: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """``n`` (prompt, the target's greedy answer) pairs; answers repeat stretches of their prompt, as code and
    extraction do, so prompt lookup has something to find."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(5, 60, size=int(rng.integers(12, 30))).tolist()
        answer: list[int] = []
        while len(answer) < 60:
            if rng.random() < 0.5:
                s = int(rng.integers(0, len(prompt) - 6))
                answer += prompt[s:s + int(rng.integers(3, 7))]
            else:
                answer += rng.integers(60, 90, size=2).tolist()
        out.append((prompt, answer[:60]))
    return out


def _serve(proposer: SpecgymProposer, answers, seed: int = 0) -> dict:
    """Serve every request through ``propose`` as vLLM does: each step, every running request's row (in a shuffled
    order: rows move when requests finish) with the tokens the step sampled (the accepted drafts and the target's
    token); returns what was proposed and accepted, and which tracked request each true request mapped to."""
    rng = np.random.default_rng(seed)
    seqs = [list(p) + [a[0]] for p, a in answers]  # prefill sampled the first token
    done = [1] * len(answers)
    last_sampled = [[a[0]] for _, a in answers]
    drafts_of: list[list[int]] = [[] for _ in answers]
    tracked: dict[int, set[int]] = {i: set() for i in range(len(answers))}
    proposed = accepted = 0
    while True:
        running = [i for i in range(len(answers)) if done[i] < len(answers[i][1])]
        if not running:
            break
        rng.shuffle(running)
        buf = np.zeros((len(running), 400), np.int32)
        for row, i in enumerate(running):
            buf[row, :len(seqs[i])] = seqs[i]
        out = proposer.propose([last_sampled[i] for i in running], np.array([len(seqs[i]) for i in running]), buf)
        for row, i in enumerate(running):
            draft, truth = out[row], answers[i][1][done[i]:]
            ctx = np.array(seqs[i])
            assert draft == ngram_propose(ctx, len(draft)), (i, draft)  # prompt lookup's own proposal, at some K
            assert len(draft) <= K
            n_acc = next((j for j, (d, t) in enumerate(zip(draft, truth)) if d != t), min(len(draft), len(truth)))
            new = truth[:n_acc + 1]
            seqs[i] += new
            done[i] += len(new)
            last_sampled[i] = new
            drafts_of[i].append(len(draft))
            proposed += len(draft)
            accepted += n_acc
        for i in running:  # the tracked request each true request is now (its fingerprint and length)
            n = len(seqs[i]) - len(last_sampled[i])
            tracked[i] |= {id(r) for r in proposer.tracked(np.asarray(seqs[i])) if r.length == n}
    return {"proposed": proposed, "accepted": accepted, "drafts": drafts_of, "tracked": tracked}


def test_each_request_keeps_its_controller_while_rows_move():
    answers = _answers(6)
    res = _serve(SpecgymProposer(_config(), profile="cpu-smollm2"), answers)
    assert all(len(ids) == 1 for ids in res["tracked"].values()), res["tracked"]  # one state per request throughout
    assert len(set().union(*res["tracked"].values())) == len(answers)
    assert res["proposed"] > 0 and 0 < res["accepted"] <= res["proposed"]


def test_fixed_k_is_vllms_ngram_and_k0_turns_speculation_off():
    answers = _answers(3, seed=1)
    fixed = _serve(SpecgymProposer(_config(), controller="fixed:3@ngram", profile="cpu-smollm2"), answers)
    assert max(max(d) for d in fixed["drafts"]) == 3
    off = _serve(SpecgymProposer(_config(), controller="fixed:0@ngram", profile="cpu-smollm2"), answers)
    assert off["proposed"] == 0


def test_the_controller_adapts_k_to_each_request():
    """``marginal@ngram``: a request whose lookups keep being accepted drafts more than one whose are not."""
    rng = np.random.default_rng(3)
    prompt = rng.integers(5, 60, size=20).tolist()
    copying = (prompt, (prompt * 4)[:60])  # the answer repeats the prompt: every lookup is right
    noise = (prompt, [int(x) for x in rng.integers(60, 90, size=60)] + [])  # never in the context, but its own
    res = _serve(SpecgymProposer(_config(), profile="cpu-smollm2"), [copying, noise])
    assert np.mean(res["drafts"][0]) > np.mean(res["drafts"][1]) + 1, res["drafts"]


def test_a_short_request_keeps_its_state_while_it_grows():
    """A request shorter than the fingerprint is known by the tokens it had when first seen (a prefix it keeps), so
    its controller sees every step, not a new request each step."""
    proposer = SpecgymProposer(_config(), profile="cpu-smollm2")
    tokens = [3, 4, 5, 6, 7]
    first = proposer.propose([[7]], np.array([5]), np.array([tokens + [0] * 10]))[0]
    (req,) = proposer.tracked(np.array(tokens))
    assert req.start == 5 and req.drafted == len(first)
    grown = tokens + [3, 4]  # the step accepted one draft and added the target's token
    proposer.propose([[3, 4]], np.array([7]), np.array([grown + [0] * 8]))
    assert proposer.tracked(np.array(grown)) == [req]  # the same request, continued
    assert req.length == 7 and req.start == 5
    assert proposer.specgym_configure()["rows"] == 2


def test_two_requests_with_one_prompt_are_two_requests():
    prompt, answer = _answers(1, seed=2)[0]
    res = _serve(SpecgymProposer(_config(), profile="cpu-smollm2"), [(prompt, answer), (prompt, answer)])
    assert len(set().union(*res["tracked"].values())) == 2


def test_configuration_errors_are_one_line(monkeypatch):
    monkeypatch.delenv(ENV_PROFILE, raising=False)
    with pytest.raises(SpecgymError, match="SPECGYM_PROPOSER_PROFILE is not set"):
        SpecgymProposer(_config())
    with pytest.raises(SpecgymError, match="bad controller spec"):
        SpecgymProposer(_config(), controller="bogus", profile="cpu-smollm2")
    monkeypatch.setenv(ENV_PROFILE, "cpu-smollm2")
    assert SpecgymProposer(_config()).spec == "marginal@ngram"


# --- the draft model for requests without a lookup match (agents/vllm_draft.py) ---


def _greedy(folder: Path, tokens: list[int], k: int) -> list[int]:
    """The draft's greedy continuation, recomputed from scratch (no cache)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    ids = list(tokens)
    with torch.inference_mode():
        for _ in range(k):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(tokens):]


def _draft_config(folder: Path, k: int = K) -> SimpleNamespace:
    cfg = _config(k)
    cfg.model_config.model = str(folder)  # the target vLLM serves (a borrowing draft would be completed from it)
    return cfg


def test_the_draft_model_continues_each_request_from_its_own_cache(tiny_target):
    from specgym.agents.vllm_draft import DraftModel

    model = DraftModel(tiny_target)
    tokens = np.arange(20, 45)
    state = model.new_cache()
    first = model.propose(state, tokens, 3)
    assert first.tokens == _greedy(tiny_target, tokens.tolist(), 3)
    assert all(0 < c <= 1 for c in first.conf) and all(e >= 0 for e in first.entropy)
    assert model.take_stats()["model_tokens_fed"] == 25 + 2  # the prefill, then one token per further draft
    # the target accepted the first draft and produced its own token: the cache keeps the accepted one, drops the rest
    bonus = (first.tokens[1] + 1) % 100
    after = np.array([*tokens, first.tokens[0], bonus])
    second = model.propose(state, after, 3)
    assert second.tokens == _greedy(tiny_target, after.tolist(), 3)
    assert model.take_stats()["model_tokens_fed"] == 1 + 2  # only the target's token, then the drafts


def test_lookup_rule_drafts_with_the_model_where_the_lookup_finds_nothing(tiny_target):
    proposer = SpecgymProposer(_draft_config(tiny_target), controller="lookup-rule:1", profile="cpu-smollm2",
                               draft=str(tiny_target))
    assert proposer.drafters == ("draft", "ngram")
    repeating = [5, 6, 7, 8, 9, 5, 6, 7]  # its last token occurred earlier: prompt lookup
    fresh = list(range(30, 42))  # no token repeats: the draft model
    buf = np.zeros((2, 64), np.int32)
    buf[0, :len(repeating)], buf[1, :len(fresh)] = repeating, fresh
    out = proposer.propose([[7], [41]], np.array([len(repeating), len(fresh)]), buf)
    assert out[0] == ngram_propose(np.array(repeating), K)
    assert out[1] == _greedy(tiny_target, fresh, K)
    # next step, rows swapped (a request finished before them): the model request keeps its cache
    grown = [*fresh, out[1][0], 99]  # one draft accepted, then the target's own token
    buf = np.zeros((2, 64), np.int32)
    buf[0, :len(grown)], buf[1, :len(repeating) + 1] = grown, [*repeating, 8]
    out2 = proposer.propose([[out[1][0], 99], [8]], np.array([len(grown), len(repeating) + 1]), buf)
    assert out2[0] == _greedy(tiny_target, grown, K)
    stats = proposer.specgym_configure()
    assert stats["model_rows"] == 2 and stats["model_tokens"] == 2 * K and stats["rows"] == 4
    assert stats["model_tokens_fed"] == len(fresh) + (K - 1) + 1 + (K - 1) and stats["model_ms"] > 0


def test_a_controller_needing_a_drafter_the_proposer_lacks_is_one_line(tiny_target):
    with pytest.raises(SpecgymError, match="does not hold"):
        SpecgymProposer(_config(), controller="fixed:2@draft", profile="cpu-smollm2")  # no draft model given
    with pytest.raises(SpecgymError, match="has no run predictor"):
        SpecgymProposer(_draft_config(tiny_target), controller="drafter-marginal", profile="cpu-smollm2",
                        draft=str(tiny_target))
    proposer = SpecgymProposer(_config(), profile="cpu-smollm2")
    with pytest.raises(SpecgymError, match="does not hold"):
        proposer.specgym_configure({"controller": "fixed:2@draft"})
    assert proposer.spec == "marginal@ngram"  # unchanged after the refusal

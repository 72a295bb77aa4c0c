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
from specgym.baselines.batch_lookup import BatchLookupK, RequestCounts
from specgym.envs.core.batch_cost import BatchCostProfile, save_batch_profile
from specgym.envs.core.ngram_proposer import ngram_propose
from specgym.envs.engines.serving.vllm_profile import step_profile
from specgym.envs.profiles import load_batch_profile
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


# --- batch-marginal: every row's K priced with the engine's step costs at the step's batch size (SYNTHETIC costs) ---


def _costs(per_token: dict[int, float], base: dict[int, float] | None = None, k_max: int = 4) -> BatchCostProfile:
    """SYNTHETIC step costs (not measured): ``S(b, K) = base[b] + per_token[b] * b * K`` ms, as a batched profile."""
    base = base or {b: 50.0 + 5.0 * b for b in per_token}
    zeros = tuple(0.0 for _ in per_token)
    return BatchCostProfile("synthetic-steps", tuple(per_token), zeros,
                            tuple(tuple(base[b] + per_token[b] * b * k for k in range(k_max + 1)) for b in per_token),
                            zeros, source="synthetic")


def _ms(costs: BatchCostProfile, batch: int, drafts: int) -> float:
    """The step time of ``batch`` sequences verifying ``drafts`` drafts in all."""
    return float(costs.budget_step_ms(batch, 0, np.array([float(drafts)]), np.array([float(drafts > 0)]))[0])


def _counts(rule: BatchLookupK, accepted: int, tried: int) -> RequestCounts:
    req = rule.new_request()
    for _ in range(tried):
        rule.observe(req, 2, rule.k_max, rule.k_max if accepted else 0)
    return req


def test_step_costs_interpolate_in_k_and_batch_and_read_back(tmp_path):
    """The batch rule prices a step with a batched cost profile (the one form specgym tune reads too)."""
    costs = _costs({1: 1.0, 4: 10.0})  # SYNTHETIC
    rule = BatchLookupK(costs, k_max=4)
    assert rule.step_ms(1, 3).tolist() == pytest.approx([55.0, 56.0, 57.0, 58.0])
    assert _ms(costs, 4, 4) == pytest.approx(70.0 + 40.0)  # 4 drafts over 4 sequences: K = 1 each
    assert _ms(costs, 4, 2) == pytest.approx(70.0 + 20.0)  # half a draft each: between K 0 and 1
    assert _ms(costs, 7, 0) == pytest.approx(70.0 + 3 * 5.0)  # beyond the grid: the last two sizes' slope
    noisy = BatchLookupK(BatchCostProfile("n", (1,), (0.0,), ((50.0, 49.0, 53.0),), (0.0,), source="synthetic"), 2)
    assert noisy.step_ms(1, 2).tolist() == [50.0, 50.0, 53.0]  # non-decreasing in the drafts verified
    assert load_batch_profile(save_batch_profile(costs, tmp_path / "c.json")) == costs
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SpecgymError, match="not a batched cost profile"):
        load_batch_profile(tmp_path / "bad.json")
    with pytest.raises(SpecgymError, match="k_max"):
        BatchLookupK(costs, k_max=8)  # the profile prices K up to 4
    # medians with noise (SYNTHETIC): a least-squares line per batch size, slope >= 0, the medians kept
    cells = {(1, 0): 61.0, (1, 1): 84.0, (1, 2): 64.0, (1, 4): 45.0, (4, 0): 54.0, (4, 1): 78.0, (4, 2): 100.0,
             (4, 4): 150.0}
    fit = step_profile("s", cells, 4, "synthetic", {})
    assert fit.verify_ms[0] == pytest.approx([63.5] * 5)  # a falling line: flat at the mean
    slope = 209.5 / 8.75  # sum((K - mean K) * (ms - mean ms)) / sum((K - mean K) ** 2)
    assert np.diff(fit.verify_ms[1]) == pytest.approx([slope] * 4)
    assert fit.hardware["measured_step_ms"] == [[61.0, 84.0, 64.0, 45.0], [54.0, 78.0, 100.0, 150.0]]
    assert step_profile("s", cells, 4, "synthetic", {}, line=False).verify_ms[1] == (54.0, 78.0, 100.0, 125.0, 150.0)
    with pytest.raises(SpecgymError, match="missing"):
        step_profile("s", {(1, 0): 1.0, (1, 4): 2.0, (2, 0): 1.0}, 4, "synthetic", {})


def test_the_batch_rule_maximises_the_steps_tokens_per_ms():
    """Against brute force over every K vector of a three-row step (SYNTHETIC costs and acceptance counts)."""
    import itertools

    rule = BatchLookupK(_costs({1: 2.0, 4: 6.0}, k_max=3), k_max=3)
    rows = [(_counts(rule, 1, 6), 2, 3), (_counts(rule, 0, 2), 1, 3), (rule.new_request(), 4, 2)]
    surv = [rule.survival(req, n, length) for req, n, length in rows]
    for batch in (1, 3, 4):
        ks = rule.choose(rows, batch)

        def rate(kv):
            return (batch + sum(s[:k].sum() for s, k in zip(surv, kv))) / rule.step_ms(batch, 9)[sum(kv)]

        best = max(rate(kv) for kv in itertools.product(*(range(length + 1) for _, _, length in rows)))
        assert rate(ks) == pytest.approx(best), (batch, ks)


def test_the_batch_rule_turns_lookup_off_where_a_draft_costs_the_whole_batch():
    """SYNTHETIC: at batch 1 a draft token costs 0.2% of a step, at batch 16 two thirds of what a sequence's token
    does; the same requests draft at 1 and are refused at 16, and a request whose lookups keep being accepted still
    drafts."""
    rule = BatchLookupK(_costs({1: 0.1, 16: 4.0}, {1: 50.0, 16: 100.0}), k_max=4)
    fresh = [(rule.new_request(), 1, 4) for _ in range(16)]  # one-token matches: no counts yet (the prior)
    assert rule.choose(fresh[:1], 1).tolist() == [4]
    assert rule.choose(fresh, 16).tolist() == [0] * 16
    good = _counts(rule, 1, 30)  # two-token matches, all accepted (pooled over n = 2 and its own)
    assert rule.choose([(good, 2, 4)] + fresh[1:], 16).tolist() == [4] + [0] * 15
    assert rule.choose([], 4).tolist() == [] and rule.choose([(good, 2, 0)], 1).tolist() == [0]  # no match: K = 0


def test_the_batch_rule_learns_acceptance_per_match_length():
    rule = BatchLookupK(_costs({1: 1.0}), k_max=4)
    req = rule.new_request()
    before = rule.survival(req, 3, 4)
    rule.observe(req, 3, drafted=4, accepted=1)  # judged: position 1 accepted, position 2 rejected
    assert rule.tried[3].tolist() == [1, 1, 0, 0] and rule.accepted[3].tolist() == [1, 0, 0, 0]
    after = rule.survival(req, 3, 4)
    assert after[0] > before[0] and after[1] < after[0]
    assert rule.survival(rule.new_request(), 1, 4).tolist() == pytest.approx(before.tolist())  # other n: prior


def test_the_proposer_under_batch_marginal(tmp_path):
    """Through ``propose`` as vLLM calls it: lookup's own proposals cut to the rule's K; K = 0 where a draft token
    costs the whole step (SYNTHETIC costs) although the lookup found drafts; ``fill:K`` drafts exactly K per row."""
    answers = _answers(4, seed=5)
    cheap = save_batch_profile(_costs({1: 0.1, 4: 0.1}, {1: 50.0, 4: 50.0}, k_max=K), tmp_path / "cheap.json")
    dear = save_batch_profile(_costs({1: 30.0, 4: 30.0}, {1: 50.0, 4: 50.0}, k_max=K), tmp_path / "dear.json")
    on = SpecgymProposer(_config(), controller=f"batch-marginal:{cheap}", profile="cpu-smollm2")
    res = _serve(on, answers)
    stats = on.specgym_configure()
    assert res["proposed"] > 0 and res["accepted"] > 0 and stats["declined"] == 0
    assert stats["k_chosen"][K] > 0 and sum(stats["k_chosen"]) == stats["rows"]
    off = SpecgymProposer(_config(), controller=f"batch-marginal:{dear}", profile="cpu-smollm2")
    assert _serve(off, answers)["proposed"] == 0
    stats = off.specgym_configure()
    assert stats["declined"] > 0 and stats["k_chosen"][0] == stats["rows"]
    fill = SpecgymProposer(_config(), controller="fill:3", profile="cpu-smollm2")
    buf = np.zeros((2, 64), np.int32)
    buf[0, :5], buf[1, :6] = [1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]
    assert fill.propose([[5], [12]], np.array([5, 6]), buf) == [[5, 5, 5], [12, 12, 12]]
    with pytest.raises(SpecgymError, match="fill:K needs K in 0..4"):
        fill.specgym_configure({"controller": "fill:9"})
    with pytest.raises(SpecgymError, match="SPECGYM_PROPOSER_STEPS"):
        SpecgymProposer(_config(), controller="batch-marginal", profile="cpu-smollm2")


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

"""The draft head (an EAGLE-style drafter on the target's hidden state): its recorded runs are what the live engine
accepts, decoding with it is greedy-exact, its cost is fitted, its folder loads or fails in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym.envs.core.cost import CostProfile  # noqa: E402
from specgym.envs.core.kinds import HEAD_DRAFTER  # noqa: E402
from specgym.envs.engines.live.draft_head import (  # noqa: E402
    HEAD_CONFIG,
    build_head,
    head_runs,
    load_head,
    recorded_head_runs,
    target_features,
)
from specgym.errors import SpecgymError  # noqa: E402

TEXTS = ("the cat sat on the mat. the cat sat on the mat. the cat", "abcabcabcabc abcabc abc",
         "one two three, one two three, one two")


@pytest.fixture(scope="module")
def toy():
    """A toy pair and a head trained for a few hundred steps on the target's own greedy continuations (so it
    proposes tokens the target accepts, and also ones it rejects)."""
    from specgym.training.models.toy import toy_models, toy_tokenizer

    torch.manual_seed(0)
    tok = toy_tokenizer()
    draft, target = toy_models(len(tok), seed=0)
    emb = target.get_input_embeddings().weight
    head = build_head(int(emb.shape[1]), 64, emb, list(range(len(tok))))
    seqs = []
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        with torch.inference_mode():
            out = target.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, pad_token_id=0)
        seqs.append(out[0].tolist())
    opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(300):
        loss = torch.zeros(())
        for ids in seqs:
            h = target_features(target, ids).detach().clone()
            t = torch.tensor(ids)
            f, n = h[:-4], len(ids)
            for j in range(3):  # unrolled on its own features, as it drafts
                f = head.step(f, t[1 + j:n - 3 + j])
                loss = loss + torch.nn.functional.cross_entropy(head.scores(f), t[2 + j:n - 2 + j])
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval().requires_grad_(False)
    return tok, draft, target, head


def test_runs_are_the_leading_matches_of_each_start_proposal(toy):
    tok, _, target, head = toy
    ids = tok(TEXTS[0])["input_ids"]
    with torch.inference_mode():
        seq = target.generate(torch.tensor([ids]), max_new_tokens=30, do_sample=False, pad_token_id=0)[0].tolist()
    feats = target_features(target, seq)
    runs = head_runs(head, feats, seq, len(ids), 6)
    assert runs.dtype == np.int16 and len(runs) == len(seq) - len(ids)
    for g in range(len(runs)):
        s = len(ids) + g
        prop = head.propose(feats[s - 2], seq[s - 1], 6)
        comp = seq[s:]
        want = next((j for j, (a, b) in enumerate(zip(prop, comp)) if a != b), min(6, len(comp)))
        assert runs[g] == want, g
    assert runs.max() >= 2 and runs.min() < 6  # the trained head is right for a few tokens, then wrong


def test_live_head_rounds_are_greedy_exact_and_replay_their_recorded_runs(toy):
    from specgym.baselines.drafter_fixed import FixedDrafter
    from specgym.envs.core.drafter_choice import drive_drafters
    from specgym.envs.engines.live.engine import LiveEngine

    tok, draft, target, head = toy
    profile = CostProfile("toy", draft_ms=1.0, verify_ms=tuple(10.0 + 0.5 * i for i in range(17)),
                          round_overhead_ms=0.5, source="synthetic")
    eng = LiveEngine(draft, target, k_max=8, timing=profile, head=head)
    assert eng.drafter_names == ("draft", "ngram", HEAD_DRAFTER)
    assert LiveEngine(draft, target, k_max=8).drafter_names == ("draft", "ngram")
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        plain = eng.run_plain(ids, 40).tokens
        for k in (1, 3, 8):
            req = eng.start(ids, 40)
            drive_drafters(FixedDrafter(HEAD_DRAFTER, k), req, eng.drafter_names)
            assert req.result.tokens == plain, (text, k)
            rounds = req.result.rounds
            assert all(r.drafter == HEAD_DRAFTER and r.drafted == r.planned_k for r in rounds if r.drafted)
            runs = recorded_head_runs(target, head, ids, plain, 16)  # what a recording stores
            for r in rounds:
                assert r.accepted == min(int(runs[r.position]), r.planned_k)
        mixed = eng.start(ids, 40)  # the draft model, prompt lookup and the head, alternating: still exact
        names = ("draft", HEAD_DRAFTER, "ngram")
        while not mixed.done:
            mixed.play(2, drafter=names[len(mixed.result.rounds) % 3])
        assert mixed.result.tokens == plain
    with pytest.raises(SpecgymError, match="serves drafters draft, ngram, not 'head'"):
        LiveEngine(draft, target, k_max=8).start(tok("abc")["input_ids"], 5).play(3, drafter=HEAD_DRAFTER)


def test_calibration_fits_the_head_cost_beside_the_draft_model(toy):
    from specgym.envs.engines.live.calibration import calibrate, with_drafters
    from specgym.envs.engines.live.engine import LiveEngine

    tok, draft, target, head = toy
    eng = LiveEngine(draft, target, k_max=4, timing="wall", head=head)
    prompts = [tok(t)["input_ids"] for t in TEXTS[:2]]
    fit = calibrate(eng, prompts, [30, 30], k_max=4, name="toy-fit")
    prof = fit.profile
    assert prof.drafter_names == ("draft", "ngram", HEAD_DRAFTER)
    head_cost = prof.draft_cost(HEAD_DRAFTER)
    assert head_cost.kind == "model" and head_cost.per_token_ms > 0
    assert prof.draft_cost("ngram").kind == "lookup" and prof.draft_cost().per_token_ms == prof.draft_ms
    again = CostProfile.from_dict(prof.to_dict())
    assert again.draft_cost(HEAD_DRAFTER) == head_cost
    plain = CostProfile("p", draft_ms=2.0, verify_ms=(10.0, 11.0, 12.0, 13.0, 14.0), source="synthetic")
    kept = with_drafters(plain, prof.drafters[1:])  # a refit keeps the drafters it did not time
    assert kept.drafter_names == prof.drafter_names and kept.draft_cost().per_token_ms == 2.0


def test_the_head_cost_fits_its_drafting_phases_at_any_temperature(toy):
    """A linear law is recovered from its phases (spikes dropped); sampled head rounds time the head's own draws."""
    from specgym.envs.engines.live.calibration import RoundSample, cycled_rounds, fit_head_cost
    from specgym.envs.engines.live.engine import LiveEngine

    law = [RoundSample(k, 10, 0.75 + 0.5 * k, 20.0) for k in range(1, 9) for _ in range(20)]
    spike = [RoundSample(3, 10, 40.0, 60.0)]
    cost = fit_head_cost(law + spike)
    assert cost.fixed_ms == pytest.approx(0.75, abs=1e-3) and cost.per_token_ms == pytest.approx(0.5, abs=1e-3)
    with pytest.raises(SpecgymError, match="too few rounds"):
        fit_head_cost([RoundSample(2, 10, 1.0, 5.0)] * 5)
    tok, draft, target, head = toy
    eng = LiveEngine(draft, target, k_max=4, timing="wall", head=head)
    rounds = cycled_rounds(eng, tok(TEXTS[0])["input_ids"], 12, [3], temperature=0.7, seed=1, drafter=HEAD_DRAFTER)
    assert rounds and all(r.drafted <= 3 for r in rounds)
    assert all(r.draft_phase_ms > 0 for r in rounds if r.drafted)


def test_a_head_folder_round_trips_and_bad_ones_fail_in_one_line(toy, tmp_path):
    from safetensors.torch import save_file

    tok, _, target, head = toy
    folder = tmp_path / "head"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(folder / "head.safetensors"))
    (folder / "vocab.json").write_text(json.dumps(list(range(len(tok)))))
    cfg = {"width": head.width, "mlp": head.mlp, "vocab_file": "vocab.json", "target": "toy"}
    (folder / HEAD_CONFIG).write_text(json.dumps(cfg))
    loaded = load_head(folder, target)
    f = torch.randn(3, head.width)
    last = torch.tensor([3, 4, 5])
    assert torch.equal(loaded.propose_batch(f, last, 5), head.propose_batch(f, last, 5))
    (folder / HEAD_CONFIG).write_text(json.dumps({**cfg, "width": head.width + 1}))
    with pytest.raises(SpecgymError, match=r"config.json: the head's width .* is not the target's hidden size"):
        load_head(folder, target)
    (folder / HEAD_CONFIG).write_text(json.dumps({**cfg, "vocab_file": "missing.json"}))
    with pytest.raises(SpecgymError, match=r"config.json: cannot read the draft head"):
        load_head(folder, target)


def test_train_head_builds_a_folder_that_loads_and_drafts(tmp_path):
    """``specgym train-head`` end to end on a toy target: features, a short training, export with held-out runs and
    a card; the folder loads as the pair's head; without train-draft's answers it refuses in one line."""
    from specgym.cli import main
    from specgym.envs.engines.live.draft_head import pair_head_folder
    from specgym.envs.engines.live.model_loading import load_model, load_tokenizer
    from specgym.envs.workloads.prompts import PromptSpec
    from specgym.training.models.distill import AnswerPlan, sample_answers
    from specgym.training.models.toy import save_toy_pair

    draft_dir, target_dir = save_toy_pair(tmp_path / "pair")
    target, tok = load_model(str(target_dir), "target"), load_tokenizer(str(target_dir), "target")
    work = tmp_path / "work"
    prompts = [PromptSpec(f"p{i}", text) for i, text in enumerate(TEXTS)]
    plan = AnswerPlan(temperatures=(0.0, 1.0), samples=2, max_new_tokens=24, top_k=8, batch=3)
    sample_answers(target, tok, prompts, work / "answers", plan)
    sample_answers(target, tok, prompts[:1], work / "answers_val", AnswerPlan(temperatures=(0.0,), max_new_tokens=24))
    out = tmp_path / "pair" / "head"
    args = ["train-head", "--target", str(target_dir), "--work-dir", str(work), "--mlp", "32", "--steps", "30",
            "--out", str(out)]
    assert main(args) == 0
    meta = json.loads((out / "training_state.json").read_text())
    assert meta["training"]["step"] == 30 and meta["heldout"]["starts"] > 0
    assert len(meta["heldout"]["accept_ge"]) == 8 and "draft head" in (out / "README.md").read_text()
    assert pair_head_folder(draft_dir) == out
    head = load_head(out, target)
    assert head.mlp == 32 and len(head.propose(torch.zeros(head.width), 3, 4)) == 4
    assert main(args) != 0  # the folder exists: never overwritten silently
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train-head", "--target", str(target_dir), "--work-dir", str(empty), "--stages", "features"]) == 2


def test_train_head_learns_from_extra_answers_and_never_mixes_plans_or_recipes(tmp_path):
    """More answers with another seed (``--extra-answers``) add sequences; an answers folder resumes only its own
    plan and a checkpoint only its own recipe, each refusing in one line; the card's rebuild commands name both."""
    from specgym.cli import main
    from specgym.envs.engines.live.model_loading import load_model, load_tokenizer
    from specgym.envs.workloads.prompts import PromptSpec
    from specgym.training.models.distill import AnswerPlan, sample_answers
    from specgym.training.models.toy import save_toy_pair

    _, target_dir = save_toy_pair(tmp_path / "pair")
    target, tok = load_model(str(target_dir), "target"), load_tokenizer(str(target_dir), "target")
    prompts = [PromptSpec(f"p{i}", text) for i, text in enumerate(TEXTS)]
    work, extra = tmp_path / "work", tmp_path / "extra"
    sample_answers(target, tok, prompts, work / "answers", AnswerPlan((0.0,), max_new_tokens=16, top_k=8, batch=3))
    sample_answers(target, tok, prompts[:1], work / "answers_val", AnswerPlan((0.0,), max_new_tokens=16))
    sampled = AnswerPlan((1.0,), samples=1, max_new_tokens=16, top_k=8, batch=3, seed=7)
    sample_answers(target, tok, prompts, extra / "answers", sampled)
    with pytest.raises(SpecgymError, match=r"plan.json: these answers follow another plan \(seed 7 there, 8 now\)"):
        sample_answers(target, tok, prompts, extra / "answers", AnswerPlan((1.0,), 1, 16, 8, 3, seed=8))
    base = ["train-head", "--target", str(target_dir), "--work-dir", str(work), "--mlp", "16", "--steps", "5"]
    assert main([*base, "--out", str(tmp_path / "h1")]) == 0
    both = [*base, "--extra-answers", str(extra), "--out", str(tmp_path / "h2")]
    assert main(both) == 2  # the checkpoint holds a head trained on fewer answers: not resumed into this one
    assert not (tmp_path / "h2").exists()
    (work / "head" / "ckpt.pt").unlink()
    assert main(both) == 0
    meta = json.loads((tmp_path / "h2" / "training_state.json").read_text())
    assert meta["training"]["recipe"]["sequences"] == 2 * len(prompts)
    assert meta["trained_on"]["plans"][str(extra)]["seed"] == 7
    card = (tmp_path / "h2" / "README.md").read_text()
    assert f"--work-dir {extra} --stages answers --temperatures 1 --seed 7" in card
    assert f"--extra-answers {extra} " in card and f"{2 * len(prompts)} answers" in card


def test_the_measured_kernel_drafts_what_the_default_drafts(toy):
    """pack_head swaps the head's layers for the measured kernel: same proposals as the unpacked head."""
    import copy

    from specgym.envs.engines.live.draft_head import pack_head

    *_, head = toy
    packed = copy.deepcopy(head)
    kernel = pack_head(packed, repeats=3)
    assert kernel in ("gemm", "packed", "default")
    f, last = torch.randn(5, head.width), torch.tensor([3, 4, 5, 6, 7])
    with torch.inference_mode():
        assert torch.equal(packed.propose_batch(f, last, 6), head.propose_batch(f, last, 6))

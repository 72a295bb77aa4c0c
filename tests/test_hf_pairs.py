"""Any Hugging Face pair (issue 30): tiny RANDOMLY-INITIALISED pairs of six architectures built in the tests
(tests/hf_pairs.py): unsupported families, BOS handling, a user's pair's profile, the live bench's pair, the test
matrix (record, replay, live greedy equality, live tree equality, ``generate()`` equality).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_pairs  # noqa: E402

from specgym.cli import main  # noqa: E402
from specgym.envs.engines.live import model_loading  # noqa: E402
from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.paths import default_pair_name  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def other_families(tmp_path_factory):
    """A tiny T5 (encoder-decoder) and a tiny Mamba (state-space) with the toy tokenizer."""
    from transformers import MambaConfig, MambaForCausalLM, T5Config, T5ForConditionalGeneration

    root = tmp_path_factory.mktemp("families")
    tok = hf_pairs.tokenizer(False)
    torch.manual_seed(0)
    models = {"t5": T5ForConditionalGeneration(T5Config(vocab_size=len(tok), d_model=32, d_ff=64, num_layers=1,
                                                          num_heads=2, d_kv=16, decoder_start_token_id=0)),
              "mamba": MambaForCausalLM(MambaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                                                    state_size=4))}
    for name, model in models.items():
        model.save_pretrained(str(root / name))
        tok.save_pretrained(str(root / name))
    return root


def test_unsupported_families_are_one_line_errors(other_families, tmp_path_factory, capsys, one_line_error):
    d, _ = hf_pairs.cached_pair("gpt2", tmp_path_factory)
    t5 = other_families / "t5"
    capsys.readouterr()  # the fixtures' progress bars
    assert main(["generate", "--draft", str(d), "--target", str(t5), "--prompt", "def f", "--max-new-tokens", "4"]) \
        != 0
    one_line_error(capsys, "model family 't5'", "encoder-decoder", "not supported", "decoder-only causal LMs")
    with pytest.raises(SpecgymError, match=r"model family 'mamba' \(state-space.*specgym runs decoder-only"):
        load_pair(str(d), str(other_families / "mamba"))


def test_a_family_without_a_croppable_cache_is_caught_at_load(other_families, tmp_path_factory, monkeypatch):
    """Not in the known list: the cached-decode probe at load refuses it (Mamba used to fail at the first step)."""
    monkeypatch.setattr(model_loading, "_RECURRENT", ())
    d, _ = hf_pairs.cached_pair("gpt2", tmp_path_factory)
    with pytest.raises(SpecgymError, match=r"--target .*model family 'mamba' \(its cache cannot be cropped"):
        load_pair(str(d), str(other_families / "mamba"))


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2"])
def test_prompts_are_encoded_as_the_tokenizer_does(arch, tmp_path_factory):
    d, t = hf_pairs.cached_pair(arch, tmp_path_factory)
    pair = load_pair(str(d), str(t), fast_kernels=False)
    ids = encode_prompt(pair.tokenizer, "def f(x):")
    plain = pair.tokenizer("def f(x):", add_special_tokens=False)["input_ids"]
    if arch in hf_pairs.BOS_ARCHS:  # Llama/Mistral-style: BOS first, as their tokenizers do by default
        assert ids == [pair.tokenizer.bos_token_id] + plain
    else:
        assert ids == plain


def test_the_recorder_and_the_live_env_encode_with_bos(tmp_path_factory, tmp_path):
    from specgym.envs.core.cost import CostProfile
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.gym.live_env import SpecDecodeLiveEnv
    from specgym.envs.workloads.prompts import PromptSpec

    d, t = hf_pairs.cached_pair("llama", tmp_path_factory)
    pair = load_pair(str(d), str(t))
    prof = CostProfile(name="flat", draft_ms=1.0, verify_ms=(10.0,) * 17, source="synthetic")
    prompts = [PromptSpec("p0", "def f(x):", "code")]
    wl, _ = record_workload(pair, prompts, tmp_path / "w.parquet", RecordingSpec(8, 0.0, prof, name="w"))
    assert wl.prompt_len[0] == len(pair.tokenizer("def f(x):", add_special_tokens=False)["input_ids"]) + 1
    env = SpecDecodeLiveEnv(draft=str(d), target=str(t), prompts=["def f(x):"], max_new_tokens=4, profile=prof)
    env.reset(seed=0)
    assert env.req is not None and env.req.prompt[0] == pair.tokenizer.bos_token_id


def test_the_live_env_prices_a_users_pair_with_its_own_costs(tmp_path_factory):
    """No ``profile``: a user's pair is measured when the env is made (a warning says so), never priced with the
    shipped pair's profile; the shipped pair keeps its measured one."""
    from specgym.envs.gym.live_env import SpecDecodeLiveEnv

    assert SpecDecodeLiveEnv.default_config()["profile"] is None
    d, t = hf_pairs.cached_pair("llama", tmp_path_factory)
    with pytest.warns(UserWarning, match="its costs were measured on this machine now"):
        env = SpecDecodeLiveEnv(draft=str(d), target=str(t), prompts=["def f(x):"], max_new_tokens=4)
    assert env.profile.name == "measured-now" and env.t_ar == env.profile.t_ar_ms
    shipped = SpecDecodeLiveEnv(prompts=["def f(x):"], max_new_tokens=4)
    assert shipped.profile.name == f"cpu-{default_pair_name()}"


def test_generate_on_a_users_pair_measures_its_profile(tmp_path_factory, capsys):
    d, t = hf_pairs.cached_pair("qwen2", tmp_path_factory)
    capsys.readouterr()
    assert main(["generate", "--draft", str(d), "--target", str(t), "--prompt", "def f(x):", "--max-new-tokens",
                 "12", "--controller", "marginal", "--json"]) == 0
    out = capsys.readouterr()
    assert "costs were measured on this machine now" in out.err and "placeholder" not in out.err
    res = json.loads(out.out)
    assert res["greedy_identical"] is True and res["tokens"] == 12


TEXTS = ["def f(x):\n", "the cat sat ", "for i in range(", "x = y + ", "print(a, b)", "import os\n"]


def record(arch: str, tmp_path_factory, temperature: float = 0.0, hidden_sketch: int = 0, k: int = 2):
    """A small recorded trace of ``arch``'s pair (6 prompts, 24 tokens each; splits 0.5/0/0.5), cached per session."""
    from specgym.envs.core.cost import CostProfile
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.workloads.prompts import PromptSpec

    key = (arch, temperature, hidden_sketch, k)
    if key not in _TRACES:
        d, t = hf_pairs.cached_pair(arch, tmp_path_factory)
        pair = load_pair(str(d), str(t))
        prof = CostProfile(name="flat", draft_ms=1.0, verify_ms=tuple(10.0 + 0.2 * n for n in range(17)),
                           source="synthetic")
        prompts = [PromptSpec(f"p{i}", text, ("code", "prose")[i % 2]) for i, text in enumerate(TEXTS)]
        out = tmp_path_factory.mktemp(f"trace-{arch}") / "w.parquet"
        wl, _ = record_workload(pair, prompts, out, RecordingSpec(
            24, temperature, prof, name=f"{arch}-w", seed=1, gen_k=k, split_fractions=(0.5, 0.0, 0.5),
            hidden_sketch=hidden_sketch))
        _TRACES[key] = (pair, wl, out)
    return _TRACES[key]


_TRACES: dict[tuple, tuple] = {}


def test_live_bench_decodes_with_the_pair_the_trace_was_recorded_from(tmp_path_factory, tmp_path):
    from rich.console import Console

    from specgym.eval.bench.live import run_live_bench

    pair, wl, path = record("llama", tmp_path_factory)
    kw = dict(per_category=1, repeats=1, specs=["fixed:2"], profile="cpu-tinypair", resamples=50, max_new_tokens=8,
              hf_generate=False, micro_repeats=2)
    r = run_live_bench(Console(file=open(tmp_path / "out.txt", "w"), width=200), workload=str(path), **kw)
    assert r["target"] == pair.target_name and r["draft"] == pair.draft_name  # was: the shipped midpair
    assert all(row["greedy_identical"] for row in r["rows"])
    moved = tmp_path / "elsewhere"
    Path(pair.target_name).parent.rename(moved)
    try:
        with pytest.raises(SpecgymError, match="was recorded from .* --draft and --target"):
            run_live_bench(Console(file=open(tmp_path / "out2.txt", "w")), workload=str(path), **kw)
        r = run_live_bench(Console(file=open(tmp_path / "out3.txt", "w"), width=200), workload=str(path),
                           draft=str(moved / "draft"), target=str(moved / "target"), **kw)
        assert r["target"] == str(moved / "target")
    finally:
        moved.rename(Path(pair.target_name).parent)


def test_a_predictor_refuses_another_architecture_behind_a_shipped_looking_name(tmp_path, capsys, one_line_error):
    """A Llama pair in folders named like the shipped midpair's (``.../models/midpair/{draft,target}``): the names
    match, the configs do not; the midpair predictor refuses its trace and its live engine (was: fed unchecked)."""
    from specgym.catalogue import resolve
    from specgym.envs.core.acceptance_predictor import SignalSource, load_predictor, model_signature
    from specgym.envs.core.cost import CostProfile
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.workloads.prompts import PromptSpec
    from specgym.paths import MODEL_ROOTS

    d, t = hf_pairs.build_pair("llama", tmp_path / "models" / "midpair")
    pair = load_pair(str(d), str(t))
    prof = CostProfile(name="flat", draft_ms=1.0, verify_ms=(10.0,) * 17, source="synthetic")
    prompts = [PromptSpec(f"p{i}", text) for i, text in enumerate(TEXTS)]
    record_workload(pair, prompts, tmp_path / "w.parquet", RecordingSpec(
        12, 0.0, prof, name="w", gen_k=2, hidden_sketch=16, split_fractions=(0.5, 0.0, 0.5)))
    capsys.readouterr()
    assert main(["eval", "--workload", str(tmp_path / "w.parquet"), "--controllers", "predicted:midpair",
                 "--out", str(tmp_path / "ev")]) != 0
    one_line_error(capsys, "predictor 'midpair'", "gpt2", "llama", "another model's")
    pred = load_predictor(resolve("predictor", "midpair"))
    live = SignalSource.of_engine("the live engine", str(d), str(t), True, None,
                                  signatures=(model_signature(pair.draft.config), model_signature(pair.target.config)),
                                  model_roots=MODEL_ROOTS)  # where the shipped models resolve (the caller's)
    with pytest.raises(SpecgymError, match="llama"):
        pred.for_source(live)


def test_tree_predicted_falls_back_where_predicted_does():
    """A midpair trace without the hidden sketch and the lookup agreement: no model of the predictor's chain fits;
    predicted: estimates from calibrated confidence, and tree-predicted now does too (was: refused)."""
    import dataclasses

    from specgym.agents.specs import make
    from specgym.envs.core.acceptance_predictor import SignalSource
    from specgym.envs.engines.replay.tree_engine import TreeEngine
    from specgym.envs.profiles import load_profile
    from specgym.envs.workloads.trace_format import cached_workload
    from specgym.eval.tree_runner import run_tree_controller

    wl = cached_workload("midpair-greedy").subset(list(range(0, 1200, 15)))
    meta = {k: v for k, v in wl.signal_meta.items() if k != "hidden_sketch"}
    wl = dataclasses.replace(wl, hidden_sketch=None, lookup_agree=None, signal_meta=meta)
    prof = load_profile("cpu-midpair")
    chain = make("predicted:midpair", 8)
    assert "calibrated confidence" in (chain.bind_signals(SignalSource.of_workload(wl)) or "")
    tree = make("tree-predicted:midpair", 8, kinds=("tree",))
    tree.prepare(wl, prof)
    assert tree.active is None and "calibrated confidence" in tree.signal_note
    assert np.all((tree._accept >= 0) & (tree._accept <= 1)) and tree._accept.std() > 0
    res = run_tree_controller(TreeEngine(wl, prof), wl.split_indices("test"), tree)
    assert res is not None


def test_a_padded_target_vocabulary_runs_in_generate(tmp_path_factory):
    """Same tokenizer, the target with 14 more embedding rows: the engine and transformers' generate() (was:
    refused as 'different tokenizers') give plain greedy decoding's tokens; sampling runs too."""
    from specgym import make_controller
    from specgym.agents.hf_generate import generate_with_controller

    d, t = hf_pairs.cached_pair("llama", tmp_path_factory, target_vocab=len(hf_pairs.tokenizer(True)) + 14)
    pair = load_pair(str(d), str(t))
    pair.draft.generation_config.eos_token_id = None
    ids = torch.tensor([encode_prompt(pair.tokenizer, "def f(x):\n")])
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, eos_token_id=None,
              pad_token_id=1)
    ref = pair.target.generate(ids, **kw)
    out = generate_with_controller(pair.target, pair.draft, ids, make_controller("fixed:3", 8), **kw)
    assert torch.equal(out, ref)
    assert pair.draft.config.vocab_size == len(hf_pairs.tokenizer(True))  # restored after the call
    assert LiveEngine.from_pair(pair).run_request(ids[0].tolist(), 3, 24).tokens == ref[0, ids.shape[1]:].tolist()
    torch.manual_seed(0)
    sampled = generate_with_controller(pair.target, pair.draft, ids, make_controller("fixed:3", 8),
                                       **{**kw, "do_sample": True, "temperature": 0.8})
    assert sampled.shape[1] == ids.shape[1] + 24


# ------------------------------------------------------------------------------------------------ the test matrix
# Per architecture: record (greedy with the hidden sketch, T=0.8), replay of the greedy trace equal to live round by
# round, live greedy output equal to plain decoding (Mistral past its sliding window), live tree verification equal
# to plain decoding where the lean forward runs the family, transformers' generate() equal to plain generate().
N_LIVE = 40  # > hf_pairs.SLIDING_WINDOW with the prompt: Mistral decodes past its window


@pytest.mark.parametrize("arch", hf_pairs.ARCHS)
def test_matrix_record_and_replay(arch, tmp_path_factory):
    from specgym.envs.core.cost import CostProfile
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.envs.workloads.trace_format import load_workload

    pair, wl, path = record(arch, tmp_path_factory, hidden_sketch=8)
    back = load_workload(path)
    assert back.n_requests == len(TEXTS) and back.hidden_sketch is not None and back.hidden_sketch.shape[1] == 8
    assert np.array_equal(back.p_accept == 1, back.draft_token == back.token_id)
    assert 0.0 < float(back.p_accept.mean()) < 1.0  # drafts are accepted and rejected
    assert back.source["draft_signature"]["model_type"] == pair.draft.config.model_type
    prof = CostProfile(name="flat", draft_ms=1.0, verify_ms=tuple(10.0 + 0.2 * n for n in range(17)),
                       source="synthetic")
    live = LiveEngine.from_pair(pair, k_max=8, timing=prof)
    replay = TraceEngine(back, prof, k_max=8, seed=0)
    rounds = 0
    for r in range(back.n_requests):
        ids = encode_prompt(pair.tokenizer, back.prompt_text[r])
        assert len(ids) == int(back.prompt_len[r])
        assert live.run_request(ids, 2, int(back.lengths[r])).tokens == back.token_id[back.span(r)].tolist()
        for k in (1, 4):
            res = live.run_request(ids, k, int(back.lengths[r]))
            rr = replay.start(r)
            for out in res.rounds:
                assert rr.position == out.position
                assert rr.verify(out.planned_k, out.drafted).accepted == out.accepted, (arch, r, k, out)
                rounds += 1
    assert rounds > 20
    _, sampled, _ = record(arch, tmp_path_factory, temperature=0.8)
    assert np.all((sampled.p_accept >= 0) & (sampled.p_accept <= 1)) and sampled.n_positions == back.n_positions


@pytest.mark.parametrize("arch", hf_pairs.ARCHS)
def test_matrix_live_greedy_and_tree_equal_plain(arch, tmp_path_factory):
    from specgym import make_controller
    from specgym.envs.core.tree import TreeShape
    from specgym.envs.engines.live.tree import LiveTreeRequest

    d, t = hf_pairs.cached_pair(arch, tmp_path_factory)
    pair = load_pair(str(d), str(t))
    eng = LiveEngine.from_pair(pair, k_max=8)
    for text in TEXTS[:2]:
        ids = encode_prompt(pair.tokenizer, text)
        plain = eng.run_plain(ids, N_LIVE).tokens
        for c in (1, 5, make_controller("marginal", 8)):
            assert eng.run_request(ids, c, N_LIVE).tokens == plain, (arch, text, c)
        if eng.lean:
            for widths in ((2, 2, 1), (3, 1)):
                req = LiveTreeRequest(eng, ids, N_LIVE)
                while not req.done:
                    req.play_tree(TreeShape.from_widths(widths))
                assert req.tree_result.tokens == plain, (arch, widths)
    assert eng.lean == (arch in ("gpt2",) + LEAN_ARCHS)


#: Families the lean forward runs besides GPT-2 (live tree verification needs it).
LEAN_ARCHS: tuple[str, ...] = ("llama", "qwen2", "mistral")


@pytest.mark.parametrize("arch", hf_pairs.ARCHS)
def test_matrix_generate_equals_plain_generate(arch, tmp_path_factory):
    from specgym import make_controller
    from specgym.agents.hf_generate import generate_with_controller

    d, t = hf_pairs.cached_pair(arch, tmp_path_factory)
    pair = load_pair(str(d), str(t), fast_kernels=False)
    pair.draft.generation_config.eos_token_id = None  # the live engine never stops at EOS either
    for text in TEXTS[:2]:
        ids = torch.tensor([encode_prompt(pair.tokenizer, text)])
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=N_LIVE, do_sample=False, eos_token_id=None,
                  pad_token_id=1)
        ref = pair.target.generate(ids, **kw)
        rounds: list = []
        out = generate_with_controller(pair.target, pair.draft, ids, make_controller("fixed:3", 8), rounds=rounds,
                                       **kw)
        assert torch.equal(out, ref), arch
        assert sum(r.produced for r in rounds) == N_LIVE
        live = LiveEngine.from_pair(pair).run_request(ids[0].tolist(), 3, N_LIVE).tokens
        assert live == ref[0, ids.shape[1]:].tolist()


def test_docs_state_exactness_in_float32_and_no_gpu_run():
    """Fix 7: the docs qualify token exactness with float32 and state bfloat16's behaviour; the GPU check's
    status is said as it is."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    text = (docs / "reference" / "round.md").read_text() + (docs / "guides" / "own-pair.md").read_text()
    assert "tested token for token in float32" in text and "Exactness is a float32 property" in text
    assert "bfloat16" in text.split("Exactness is a float32 property")[1][:400]
    assert "It has not been run on a GPU" in text


def test_a_broken_model_folder_is_one_line(tmp_path_factory, tmp_path):
    """A config transformers reads but weights it cannot build into the model: a one-line error, no traceback."""
    import shutil

    d, t = hf_pairs.cached_pair("qwen2", tmp_path_factory)
    broken = tmp_path / "target"
    shutil.copytree(t, broken)
    cfg = json.loads((broken / "config.json").read_text())
    cfg["hidden_size"] = 48  # the stored weights are 32 wide
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecgymError, match=r"--target .*: cannot load model|--target .*model family"):
        load_pair(str(d), str(broken))

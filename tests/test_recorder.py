"""Recorder, profiler and the live CLI commands on a tiny RANDOMLY-INITIALISED pair (specgym.training.models.toy)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym.commands.args import parse_length  # noqa: E402
from specgym.envs.core.cost import CostProfile  # noqa: E402
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair  # noqa: E402
from specgym.envs.engines.live.profiler import measure_profile  # noqa: E402
from specgym.envs.engines.live.recorder import RecordingSpec, record_workload  # noqa: E402
from specgym.envs.profiles import load_profile  # noqa: E402
from specgym.envs.workloads.loops import is_looped  # noqa: E402
from specgym.envs.workloads.prompts import PromptSpec, read_prompts  # noqa: E402
from specgym.envs.workloads.trace_format import load_workload  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.models.toy import save_toy_pair, toy_models  # noqa: E402

torch.set_num_threads(1)
PROFILE = CostProfile(name="toy", draft_ms=0.5, verify_ms=tuple(5.0 + 0.1 * n for n in range(17)), source="synthetic")
TEXTS = ["def f(x):\n    return x", "the cat sat on the mat.", "12 + 7 = 19", "import os\nimport sys\n",
         "class a:\n  pass\n"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d, t = save_toy_pair(tmp_path_factory.mktemp("toy") / "pair", seed=0)
    return load_pair(str(d), str(t))


def _specs():
    return [PromptSpec(f"q{i}", t, ["code", "prose", "math"][i % 3]) for i, t in enumerate(TEXTS)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_round_trip(pair, tmp_path, temperature):
    out = tmp_path / "w.parquet"
    wl, stats = record_workload(pair, _specs(), out, RecordingSpec((20, 40), temperature, PROFILE, seed=3))
    back = load_workload(out)
    assert back.n_requests == 5 and back.source["kind"] == "recorded"
    assert back.source["target_model"] == pair.target_name and back.source["temperature"] == temperature
    assert np.all((back.lengths >= 20) & (back.lengths <= 40))
    for col in ("p_accept", "draft_conf", "draft_entropy", "target_entropy"):
        np.testing.assert_array_equal(getattr(back, col), getattr(wl, col))
    assert list(back.category) == ["code", "prose", "math", "code", "prose"]
    assert back.prompt_text[0] == TEXTS[0]
    assert back.profile == PROFILE
    if temperature == 0:
        assert set(np.unique(back.p_accept)) <= {0.0, 1.0}
    else:
        assert 0 < back.p_accept.min() and back.p_accept.max() <= 1.0
    assert not (out.parent / (out.name + ".partial.jsonl")).exists()
    assert stats["positions"] == back.n_positions
    assert back.ranks_head is None and "head_ranks" not in back.signal_meta  # a pair without a head: no head ranks
    _check_signal_columns(pair, back, temperature)
    if temperature == 0:  # a greedy recording holds the prompt-lookup drafter's per-start runs, from its token ids
        from specgym.envs.core.ngram_proposer import ngram_runs

        assert back.drafter_names == ["draft", "ngram"] and back.drafter_info("ngram")["runs"] == "per-start"
        for r in range(back.n_requests):
            prompt = pair.tokenizer(back.prompt_text[r], add_special_tokens=False)["input_ids"]
            np.testing.assert_array_equal(back.runs["ngram"][back.span(r)],
                                          ngram_runs(prompt, back.token_id[back.span(r)].tolist(), 16))
    else:  # one draw of speculative sampling per start (tests/test_sampled_runs.py checks the draws)
        assert back.drafter_names == ["draft", "ngram"] and "sampling" in back.drafter_info("ngram")["source"]
        assert np.all((back.runs["ngram"] >= 0) & (back.runs["ngram"] <= 16))


def _check_signal_columns(pair, wl, temperature):
    """The v2 signal columns follow their definitions (trace_format's docstring) on a recorded workload."""
    from specgym.envs.core.lookup import lookup_columns

    assert {"token_id", "draft_token", "target_rank", "draft_topk", "lookup_len", "lookup_token",
            "lookup_agree"} <= set(wl.signal_names)
    assert wl.signal_meta["topk"] == 8 and wl.signal_meta["vocab_size"] == len(pair.tokenizer)
    assert np.all(np.diff(wl.draft_topk, axis=1) <= 0) and np.all(wl.draft_topk.sum(1) <= 1 + 1e-3)
    if temperature == 0:
        np.testing.assert_array_equal(wl.p_accept == 1, wl.target_rank == 0)
        np.testing.assert_array_equal(wl.p_accept == 1, wl.draft_token == wl.token_id)
        np.testing.assert_allclose(wl.draft_topk[:, 0], wl.draft_conf, rtol=1e-5)
    for r in range(wl.n_requests):
        sl = wl.span(r)
        prompt = encode_prompt(pair.tokenizer, wl.prompt_text[r])
        lens, toks, agree = lookup_columns(prompt, wl.token_id[sl].tolist(), wl.draft_token[sl])
        np.testing.assert_array_equal(wl.lookup_len[sl], lens)
        np.testing.assert_array_equal(wl.lookup_token[sl], toks)
        np.testing.assert_array_equal(wl.lookup_agree[sl], agree)


def test_hidden_sketch_and_ranks_from_the_draft(pair, tmp_path):
    """--hidden-sketch D: the column is the draft's last hidden state times the stored projection; target_rank is
    the rank of the target's token in the draft's teacher-forced logits."""
    spec = RecordingSpec(12, 0.0, PROFILE, hidden_sketch=6)
    wl, _ = record_workload(pair, _specs()[:2], tmp_path / "s.parquet", spec)
    back = load_workload(tmp_path / "s.parquet")
    proj = back.sketch_projection()
    assert proj.shape == (pair.draft.config.n_embd, 6) and back.hidden_sketch.shape == (back.n_positions, 6)
    prompt = encode_prompt(pair.tokenizer, TEXTS[0])
    comp = back.token_id[back.span(0)].tolist()
    with torch.no_grad():
        out = pair.draft(torch.tensor([prompt + comp[:-1]]), output_hidden_states=True)
    rows = slice(len(prompt) - 1, len(prompt) - 1 + len(comp))
    np.testing.assert_allclose(back.hidden_sketch[back.span(0)], out.hidden_states[-1][0, rows].numpy() @ proj,
                               rtol=1e-4, atol=1e-4)
    logits = out.logits[0, rows]
    ranks = [int((logits[i] > logits[i, t]).sum()) for i, t in enumerate(comp)]
    np.testing.assert_array_equal(back.target_rank[back.span(0)], ranks)


def test_resume_after_interrupt(pair, tmp_path):
    out = tmp_path / "r.parquet"
    calls = []

    def boom(i, n):
        calls.append(i)
        if i == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        record_workload(pair, _specs(), out, RecordingSpec(30, 0.0, PROFILE), progress=boom)
    assert not out.exists() and (tmp_path / "r.parquet.partial.jsonl").exists()
    wl, stats = record_workload(pair, _specs(), out, RecordingSpec(30, 0.0, PROFILE))
    assert stats["resumed"] == 2
    ref, _ = record_workload(pair, _specs(), tmp_path / "ref.parquet", RecordingSpec(30, 0.0, PROFILE))
    np.testing.assert_array_equal(wl.p_accept, ref.p_accept)
    # different settings with a stale partial file: a clear error
    with pytest.raises(KeyboardInterrupt):
        record_workload(pair, _specs(), tmp_path / "s.parquet", RecordingSpec(30, 0.0, PROFILE), progress=boom)
    with pytest.raises(SpecgymError, match="different settings"):
        record_workload(pair, _specs(), tmp_path / "s.parquet", RecordingSpec(30, 0.5, PROFILE))


def test_prompt_file_errors(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "abc", "category": "code"}\n\n{"prompt": "def", "id": "x"}\n')
    specs = read_prompts(good)
    assert [s.request_id for s in specs] == ["p00000", "x"] and specs[0].category == "code"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "abc"}\n{"prompt": "ok"}\n{"prompt": "broken"\n')
    with pytest.raises(SpecgymError, match=r"bad\.jsonl:3: not valid JSON"):
        read_prompts(bad)
    bad.write_text('{"text": "abc"}\n')
    with pytest.raises(SpecgymError, match=r":1: field 'prompt'"):
        read_prompts(bad)
    bad.write_text('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n')
    with pytest.raises(SpecgymError, match=r":2: duplicate id"):
        read_prompts(bad)
    for rid in ("null", "true", "{}", '""'):  # was read as the id 'None' (a duplicate on the second such line)
        bad.write_text(f'{{"prompt": "a", "id": {rid}}}\n')
        with pytest.raises(SpecgymError, match=r":1: field 'id' must be a non-empty string or an integer, got "):
            read_prompts(bad)
    bad.write_text('{"prompt": "a", "max_new_tokens": 0}\n')
    with pytest.raises(SpecgymError, match="max_new_tokens"):
        read_prompts(bad)
    with pytest.raises(SpecgymError, match="not found"):
        read_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(SpecgymError, match="LO-HI"):
        parse_length("12-x")
    assert parse_length("128-256") == (128, 256)


def test_context_overflow_is_clear(pair, tmp_path):
    with pytest.raises(SpecgymError, match="context"):
        record_workload(pair, [PromptSpec("a", "x" * 100)], tmp_path / "c.parquet", RecordingSpec(200, 0.0, PROFILE))


def test_loop_detector():
    assert is_looped([1, 2, 3] * 30)
    assert not is_looped(list(range(100)))


def test_profiler(pair):
    prof = measure_profile(pair, k_max=4, context=32, repeats=5, warmup=2)
    assert prof.source == "measured" and len(prof.verify_ms) == 5
    assert prof.draft_ms > 0 and all(v > 0 for v in prof.verify_ms) and prof.round_overhead_ms >= 0
    assert "cpu" in prof.hardware
    with pytest.raises(SpecgymError, match="context"):
        measure_profile(pair, k_max=16, context=250)


def test_cli_record_profile_generate(pair, tmp_path, capsys):
    from specgym.cli import main

    prof_path = tmp_path / "prof.json"
    PROFILE_JSON = json.dumps(PROFILE.to_dict())
    prof_path.write_text(PROFILE_JSON)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t, "category": "code"}) + "\n" for t in TEXTS[:3]))
    out = tmp_path / "cli.parquet"
    common = ["--draft", pair.draft_name, "--target", pair.target_name]
    assert main(["record", *common, "--prompts", str(prompts), "--max-new-tokens", "16", "--temperature", "0",
                 "--out", str(out), "--profile", str(prof_path), "--quiet", "--hidden-sketch", "4"]) == 0
    assert load_workload(out).n_requests == 3 and load_workload(out).hidden_sketch.shape == (48, 4)
    assert capsys.readouterr().err == ""  # --quiet: no progress bar
    assert main(["record", *common, "--prompts", str(prompts), "--max-new-tokens", "8", "--temperature", "0",
                 "--out", str(tmp_path / "bar.parquet"), "--profile", str(prof_path)]) == 0
    bar = capsys.readouterr().err  # not a terminal: the bar's last state, once, on stderr (stdout keeps the summary)
    assert "recording 3 requests" in bar and "100%" in bar and "left" in bar, bar
    assert main(["record", *common, "--prompts", str(prompts), "--max-new-tokens", "16", "--out", str(out),
                 "--profile", str(prof_path), "--quiet"]) == 2  # exists, no --force
    prompts.write_text('{"prompt": "a"}\nnot json\n')
    assert main(["record", *common, "--prompts", str(prompts), "--out", str(tmp_path / "x.parquet"),
                 "--profile", str(prof_path)]) == 2
    assert "p.jsonl:2" in capsys.readouterr().err
    assert main(["profile", *common, "--out", str(tmp_path / "m.json"), "--k-max", "4", "--context", "32",
                 "--repeats", "3"]) == 0
    assert load_profile(tmp_path / "m.json").source == "measured"
    assert main(["generate", *common, "--prompt", "def f(x):", "--k", "3", "--max-new-tokens", "20", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["greedy_identical"] and res["tokens"] == 20
    assert main(["generate", "--draft", str(tmp_path / "missing"), "--target", pair.target_name,
                 "--prompt", "x"]) == 2
    assert "model path not found" in capsys.readouterr().err


def test_toy_models_are_labelled_random():
    d, t = toy_models(50)
    assert d.config.n_layer == 1 and t.config.n_layer == 2


from specgym.paths import PROFILES_DIR, WORKLOADS_DIR  # noqa: E402


@pytest.mark.parametrize("name,temperature,requests,lengths", [
    ("midpair-greedy", 0.0, 1000, (64, 128)), ("midpair-t08", 0.8, 1000, (64, 128)),
    ("tinypair-greedy", 0.0, 600, (128, 256)), ("tinypair-t08", 0.8, 600, (128, 256))])
def test_shipped_recorded_workloads(name, temperature, requests, lengths):
    path = WORKLOADS_DIR / f"{name}.parquet"
    if not path.exists():
        pytest.skip(f"{path} not recorded yet")
    wl = load_workload(path)
    assert wl.source["kind"] == "recorded" and not wl.is_synthetic
    assert wl.n_requests >= requests
    if requests >= 1000:
        assert len(wl.split_indices("test")) >= 200
    assert wl.lengths.min() >= lengths[0] and wl.lengths.max() <= lengths[1]
    assert set(wl.categories()) == {"code", "prose", "math"}
    assert np.all(wl.temperature == np.float32(temperature))
    assert wl.profile.source == "measured"
    assert "loop_share" in wl.extra


def test_shipped_profiles():
    for pair in ("tinypair", "midpair"):
        cpu = PROFILES_DIR / f"cpu-{pair}.json"
        if cpu.exists():
            prof = load_profile(cpu)
            assert prof.source == "measured" and len(prof.verify_ms) >= 9 and prof.hardware
    gpu = load_profile(PROFILES_DIR / "gpu-like-published.json")
    assert gpu.source == "published" and "ILLUSTRATIVE" in gpu.description and 0.05 <= gpu.cost_ratio <= 0.1


def test_batched_extraction_equals_one_request_at_a_time(pair):
    """Right-padded batches give every request the columns it gets alone (greedy exactly, sampled to rounding)."""
    from specgym.envs.engines.live.recorder import trace_columns, trace_columns_batch

    tok = pair.tokenizer
    items = [(tok(t)["input_ids"], [(7 * i + j) % 40 + 3 for j in range(n)], temp, 11 + i)
             for i, (t, n, temp) in enumerate([("ab", 9, 0.0), ("hello world", 14, 0.0), ("x", 5, 0.7),
                                               ("def f(x):", 20, 0.7)])]
    batched = trace_columns_batch(pair.draft, pair.target, items)
    for item, cols in zip(items, batched):
        alone = trace_columns(pair.draft, pair.target, *item)
        assert cols["p_accept"].shape == (len(item[1]),)
        for key in ("p_accept", "draft_conf", "draft_entropy", "target_entropy", "draft_topk"):
            np.testing.assert_allclose(cols[key], alone[key], rtol=1e-4, atol=1e-5)
        if item[2] == 0:
            for key in ("token_id", "draft_token", "target_rank", "lookup_len", "lookup_token", "lookup_agree"):
                np.testing.assert_array_equal(cols[key], alone[key])


def test_recording_spec_checks_itself_and_names_lengths_as_the_cli_does():
    """A recording's settings are one record (issue 27): a bad one fails when built, before any model runs, and the
    length range is stored as ``--max-new-tokens`` writes it (so resume headers and trace sources are unchanged)."""
    assert RecordingSpec((20, 40), 0.0, PROFILE).length_text == "20-40"
    assert RecordingSpec(30, 0.0, PROFILE).lengths == (30, 30) and RecordingSpec(30, 0.0, PROFILE).length_text == "30"
    assert RecordingSpec(parse_length("7"), 0.0, PROFILE).length_text == "7"
    for bad, fragment in ((dict(max_new_tokens=0), "need 1 <= LO <= HI"), (dict(max_new_tokens=(9, 3)), "'9-3'"),
                          (dict(temperature=-0.5), "--temperature must be >= 0"),
                          (dict(temperature=float("nan")), "--temperature"), (dict(batch=0), "batch must be >= 1")):
        with pytest.raises(SpecgymError, match=fragment):
            RecordingSpec(**{"max_new_tokens": 8, "temperature": 0.0, "profile": PROFILE, **bad})


def test_prompt_splits_are_kept_and_eos_ends_a_completion(pair, tmp_path):
    """A prompts file that names each prompt's split fixes the recording's splits (seed-independent); with
    ``stop_at_eos`` a completion ends at the target's EOS token, which the recording keeps as its last token."""
    splits = ["train", "val", "test", "train", "train"]
    specs = [PromptSpec(f"q{i}", t, "c", split=s) for i, (t, s) in enumerate(zip(TEXTS, splits))]
    eos = pair.tokenizer.eos_token_id
    for seed in (1, 2):
        wl, _ = record_workload(pair, specs, tmp_path / f"s{seed}.parquet", RecordingSpec(24, 0.0, PROFILE, seed=seed))
        assert list(wl.split) == splits and wl.source["splits"] == "the prompts file's"
    wl, _ = record_workload(pair, specs, tmp_path / "forced.parquet",
                            RecordingSpec(24, 0.0, PROFILE, split_fractions=(1.0, 0.0, 0.0)))
    assert set(wl.split) == {"train"}  # --splits given: honoured over the file's
    # the toy target's greedy continuation, with its EOS id moved onto a token it emits: the stop is exercised
    first = record_workload(pair, specs[:1], tmp_path / "plain.parquet", RecordingSpec(24, 0.0, PROFILE))[0]
    emitted = [int(t) for t in first.token_id[first.span(0)]]
    stop = emitted[5]
    pair.tokenizer.eos_token_id = stop
    try:
        from specgym.envs.engines.live.recorder import Recorder

        rec = Recorder(pair, gen_k=3, stop_at_eos=True)
        out = rec.generate(specs[0], 24, 0.0, 0)["completion"]
    finally:
        pair.tokenizer.eos_token_id = eos
    assert out == emitted[: emitted.index(stop) + 1]


def test_a_prompts_file_with_some_splits_is_refused(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "split": "train"}\n{"prompt": "b"}\n')
    with pytest.raises(SpecgymError, match="lacks a 'split' while others name one"):
        read_prompts(f)


@pytest.mark.parametrize("name,temperature", [("smollm2-greedy", 0.0), ("smollm2-t07", 0.7)])
def test_shipped_real_pair_recordings(name, temperature):
    """The real pair's recordings: every chat prompt, its file's splits, answers ending at EOS, every signal."""
    path = WORKLOADS_DIR / f"{name}.parquet"
    if not path.exists():
        pytest.skip(f"{path} not recorded yet")
    wl = load_workload(path)
    prompts = {p.request_id: p for p in read_prompts(WORKLOADS_DIR / "smollm2-prompts.jsonl")}
    assert wl.source["kind"] == "recorded" and wl.source.get("stop_at_eos") is True
    assert wl.source["prompts"] == "workloads/smollm2-prompts.jsonl" and wl.source["splits"] == "the prompts file's"
    assert wl.source["target_model"] == "smollm2" and wl.profile.name == "cpu-smollm2"
    assert wl.n_requests == len(prompts) and len(set(wl.categories())) == 8
    assert [prompts[r].split for r in wl.request_id] == list(wl.split)
    assert wl.lengths.max() <= 128 and np.all(wl.temperature == np.float32(temperature))
    assert wl.signal_columns() is not None and wl.extra.get("loop_share") is not None
    ended = sum(int(wl.token_id[wl.span(r)][-1]) == 2 for r in range(wl.n_requests))  # <|im_end|> is id 2
    assert ended >= 0.4 * wl.n_requests  # the rest reach the 128-token cap

"""``specgym data generate``: Magpie prompts, filters, de-duplication, splits by source, resumable sharded answers.

The generation tests run a tiny random Llama with the tinypair tokenizer and a chat template (its outputs are
meaningless; an end-of-text bias in its generation config makes turns end, so that some prompts survive the filters).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgym.errors import SpecgymError
from specgym.training.models.magpie import (
    CATEGORIES,
    PASSAGE_CATEGORIES,
    Seed,
    assign_passages,
    check_categories,
    compose,
    end_of_turn_ids,
    plan_seeds,
    pre_query,
)
from specgym.training.models.passages import STDLIB_LICENSE, passage_pool, stdlib_passages, trim_passage
from specgym.training.models.prompt_filter import (
    Candidate,
    dedup,
    jaccard,
    quality_reason,
    shingles,
    source_groups,
    split_of,
)

ROOT = Path(__file__).resolve().parents[1]
CHAT = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory):
    """A random 2-layer Llama whose tokenizer has a chat template; EOS biased by +4 so that turns end."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tinychat") / "target"
    tok = transformers.AutoTokenizer.from_pretrained(str(ROOT / "data" / "models" / "tinypair" / "target"))
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                                   max_position_embeddings=1024, eos_token_id=tok.eos_token_id,
                                   bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.generation_config.sequence_bias = [[[tok.eos_token_id], 4.0]]
    model.save_pretrained(str(folder))
    tok.chat_template = CHAT
    tok.save_pretrained(str(folder))
    return folder


def _cfg(target, **kw):
    from specgym.training.models.data_gen import DataConfig

    base = dict(target=str(target), prompts=12, oversample=4.0, max_new_tokens=12, prompt_max_tokens=24,
                passage_max_tokens=48, stdlib_subdir="json", shard_size=8, batch=4, min_words=2,
                splits=(0.5, 0.25, 0.25), target_passages=0.0)
    base.update(kw)
    return DataConfig(**base)


# --- filters, de-duplication, splits (no model) ---------------------------------------------------------------------
def test_quality_filters_name_their_reason():
    steer = "You are a helpful AI assistant. The user asks you to write a short poem about the sea."
    ok = "Could you write me a short poem about autumn leaves falling in the park?"
    cases = {"": "empty", "Poem?": "too_short", "I'm sorry, but I cannot help with that request today.": "refusal",
             "asks you to write a short poem about the sea please": "echo",
             "The user asks for a poem about the sea and the sky": "echo",
             "<|im_start|>user what is the capital of France?": "template_token",
             "12345 67890 !!!! ???? 1234 5678 90": "non_text", "what is \ufffd this thing here": "non_text",
             "tell me more\ntell me more\ntell me more\nplease": "repetitive"}
    for text, reason in cases.items():
        assert quality_reason(Candidate("x", text, text, steer), min_words=3) == reason, text
    assert quality_reason(Candidate("x", ok, ok, steer)) is None
    assert quality_reason(Candidate("x", ok, ok, steer, terminated=False)) == "unterminated"


def test_dedup_drops_exact_and_near_duplicates_but_not_other_tasks_over_one_passage():
    base = "please explain how the water cycle moves water between the oceans the air and the land in simple words"
    cands = [Candidate("a", base, base),
             Candidate("b", base.upper() + "!", base.upper() + "!"),  # exact after normalisation
             Candidate("c", base.replace("simple", "plain"), base.replace("simple", "plain")),  # near (0.8)
             Candidate("d", "write a python function that reverses a linked list", "write a python function that "
                       "reverses a linked list"),
             Candidate("e", "Summarise it.\n\nText:\nP1", "summarise it in three short sentences please", "",
                       "stdlib:p1"),
             Candidate("f", "List.\n\nText:\nP1", "list every name and date that it mentions", "", "stdlib:p1"),
             Candidate("g", "Summarise.\n\nText:\nP2", "summarise it in three short sentences please", "",
                       "stdlib:p2")]
    assert jaccard(shingles(cands[0].request), shingles(cands[2].request)) >= 0.7
    dropped = dedup(cands, threshold=0.7)
    assert dropped == {1: "duplicate of a", 2: "near-duplicate of a"}


def test_splits_follow_sources_passages_and_near_duplicates_never_straddle():
    import numpy as np

    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(400)]
    cands = []
    for i in range(300):
        words = " ".join(rng.choice(vocab, 14))
        passage = f"stdlib:p{i % 40}" if i % 3 == 0 else None
        cands.append(Candidate(f"q{i}", words, words, passage=passage))
    twin = cands[1].text.split()
    twin[5] = "changed"  # a deliberately near-duplicated pair (Jaccard 0.6, above the grouping threshold)
    cands.append(Candidate("twin", " ".join(twin), " ".join(twin)))
    sources = source_groups(cands, threshold=0.5)
    splits = [split_of(s, (0.6, 0.2, 0.2)) for s in sources]
    assert sources[-1] == sources[1] == "prompt:q1" and splits[-1] == splits[1]
    by_passage: dict[str, set[str]] = {}
    for c, sp in zip(cands, splits):
        if c.passage:
            by_passage.setdefault(c.passage, set()).add(sp)
    assert by_passage and all(len(v) == 1 for v in by_passage.values())
    sets = [shingles(c.text) for c in cands]
    for i in range(len(cands)):  # exhaustive: no pair at or above the threshold in two splits
        for j in range(i + 1, len(cands)):
            if jaccard(sets[i], sets[j]) >= 0.5:
                assert splits[i] == splits[j]
    counts = {s: splits.count(s) for s in ("train", "val", "test")}
    assert all(counts.values()) and counts["train"] > counts["val"]
    assert split_of("stdlib:p1", (1, 0, 0)) == "train" and split_of("stdlib:p1", (0, 0, 1)) == "test"
    with pytest.raises(SpecgymError, match="--splits"):
        split_of("x", (0.5, 0.5, 0.5))


def test_selection_shares_prompts_evenly_over_categories():
    from specgym.training.models.data_gen import balanced

    cats = ["a"] * 6 + ["b"] * 1 + ["c"] * 5
    chosen = balanced(cats, 6, ("a", "b", "c"))
    assert sorted(chosen) == [0, 1, 2, 6, 7, 8]  # two each where possible; b's missing one from the earliest left
    assert len(balanced(cats, 100, ("a", "b", "c"))) == len(cats)


# --- steering, templates, passages -------------------------------------------------------------------------------
def test_seed_plan_covers_categories_is_prefix_stable_and_assigns_passages():
    cats = tuple(CATEGORIES)
    seeds = plan_seeds(56, cats, seed=3)
    assert [s.category for s in seeds[:14]] == list(cats) and len({s.task for s in seeds}) > 30
    assert all("{" not in s.task for s in seeds)
    assert [s.task for s in plan_seeds(20, cats, seed=3)] == [s.task for s in seeds[:20]]
    assign_passages(seeds, [f"p{i}" for i in range(6)], per_passage=2)
    quoted = [s.passage for s in seeds if s.category in PASSAGE_CATEGORIES]
    assert quoted == [f"p{i // 2}" for i in range(12)]
    with pytest.raises(SpecgymError, match="too few"):
        assign_passages(plan_seeds(56, cats), ["p0"], per_passage=2)
    with pytest.raises(SpecgymError, match="unknown category poetry"):
        check_categories(["chat", "poetry"])
    rag = Seed("m1", "rag", "asks a question that the text answers", passage="p")
    assert compose(rag, " What? ", "TEXT") == "Context:\nTEXT\n\nQuestion: What?"


def test_pre_query_template_opens_a_user_turn(tiny_chat):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_chat))
    pre = pre_query(tok, "STEER")
    assert pre == "<|endoftext|>system\nSTEER<|endoftext|>\n<|endoftext|>user\n"
    assert end_of_turn_ids(tok) == [tok.eos_token_id]
    tok.chat_template = None
    with pytest.raises(SpecgymError, match="no chat template"):
        pre_query(tok, "x")


def test_stdlib_passages_and_pool():
    found = stdlib_passages("json")
    assert found and all(p.id.startswith("stdlib:json") and p.license == STDLIB_LICENSE for p in found)
    assert all(400 <= len(p.text) <= 2000 for p in found)
    pool = passage_pool(6, found * 3, target_fraction=0.5, seed=0)
    assert len(pool) == 6 and sum(p.startswith("target:") for p in pool) == 3
    with pytest.raises(SpecgymError, match="standard library"):
        stdlib_passages("../../etc")
    assert trim_passage("word " * 50 + "end. cut mid") == ("word " * 50 + "end.").strip()


# --- generation end to end on the tiny model ----------------------------------------------------------------------
def _answers(out: Path) -> dict[str, str]:
    return {f.name: f.read_text() for f in sorted((out / "answers").glob("*.jsonl"))}


def test_generate_end_to_end_then_resume_after_an_interrupted_shard(tiny_chat, tmp_path, monkeypatch):
    from specgym.envs.workloads.prompts import read_prompts
    from specgym.training.models import data_gen

    cfg = _cfg(tiny_chat, shard_size=4)
    real, calls = data_gen.run_job, []

    def killed(model, tok, c, job, on_batch):
        calls.append((job.stage, job.index))
        if job.stage == "answers" and job.index == 1:
            raise KeyboardInterrupt  # the run is killed while shard 1 is being written
        return real(model, tok, c, job, on_batch)

    monkeypatch.setattr(data_gen, "run_job", killed)
    with pytest.raises(KeyboardInterrupt):
        data_gen.generate(cfg, tmp_path / "d", workers=1, quiet=True)
    first = _answers(tmp_path / "d")
    assert list(first) == ["00000.jsonl"]
    monkeypatch.setattr(data_gen, "run_job", real)
    with pytest.raises(SpecgymError, match="already exists"):
        data_gen.generate(cfg, tmp_path / "d", workers=1, quiet=True)
    summary = data_gen.generate(cfg, tmp_path / "d", workers=1, resume=True, quiet=True)
    out = tmp_path / "d"
    done = _answers(out)
    assert done["00000.jsonl"] == first["00000.jsonl"] and len(done) > 1  # shard 0 kept, the rest made
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["shard"] for r in log if r["stage"] == "answers"] == list(range(len(done)))
    prompts = read_prompts(out / "prompts.jsonl")
    assert summary["prompts"] == len(prompts) > 0 and all(p.split for p in prompts)
    rows = [json.loads(line) for text in done.values() for line in text.splitlines()]
    assert len(rows) == 2 * len(prompts) and {r["mode"] for r in rows} == {"greedy", "sampled"}
    assert all(r["answer_ids"] == r["answer_ids"][:cfg.max_new_tokens] and isinstance(r["text"], str) for r in rows)
    assert summary["answer_tokens"]["total"] == sum(len(r["answer_ids"]) for r in rows)
    assert sum(v["prompts"] for v in summary["per_split"].values()) == len(prompts)
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert rejected and all(r["reason"] for r in rejected)
    with pytest.raises(SpecgymError, match="another configuration"):
        data_gen.generate(_cfg(tiny_chat, shard_size=4, seed=1), out, workers=1, resume=True, quiet=True)


def test_answer_prompts_answers_a_prefix_of_whole_shards_and_a_resume_extends_it(tiny_chat, tmp_path):
    """--answer-prompts N answers the shards of the first N prompts; the drafters' commands wait for exactly those;
    a resume with a larger N keeps every finished shard and answers more (the one option a resume may change)."""
    from specgym.training.models import data_gen
    from specgym.training.models.data_answers import check_data_folder

    out = tmp_path / "d"
    every = data_gen.generate(_cfg(tiny_chat, shard_size=4), tmp_path / "every", workers=1, quiet=True)
    part = data_gen.generate(_cfg(tiny_chat, shard_size=4, answer_prompts=5), out, workers=1, quiet=True)
    assert every["prompts"] == part["prompts"] > 8  # more than the two shards answered
    assert list(_answers(out)) == ["00000.jsonl", "00001.jsonl"] and part["answered_prompts"] == 8
    assert _answers(out) == {k: v for k, v in _answers(tmp_path / "every").items() if k in _answers(out)}
    check_data_folder(out, _cfg(tiny_chat).target)  # finished: both planned shards are there
    (out / "answers" / "00001.jsonl").unlink()
    with pytest.raises(SpecgymError, match=r"answers stage is not finished \(1 of 2 shards\)"):
        check_data_folder(out, _cfg(tiny_chat).target)
    first = _answers(out)["00000.jsonl"]
    more = data_gen.generate(_cfg(tiny_chat, shard_size=4, answer_prompts=9), out, workers=1, resume=True, quiet=True)
    assert _answers(out)["00000.jsonl"] == first and len(_answers(out)) == 3
    assert more["answered_prompts"] == min(12, every["prompts"])
    assert json.loads((out / "config.json").read_text())["answer_prompts"] == 9
    with pytest.raises(SpecgymError, match="another configuration"):  # any other option still fixes the folder
        data_gen.generate(_cfg(tiny_chat, shard_size=4, answer_prompts=9, seed=1), out, workers=1, resume=True,
                          quiet=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaps counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_worker_ends_with_the_run_that_started_it():
    """A killed `data generate` (SIGTERM skips its pool's close) left its workers generating a shard for minutes."""
    import signal
    import subprocess
    import sys
    import time

    worker = ("import os, time; from specgym.training.models.data_gen import _exit_with_parent; "
              "_exit_with_parent(os.getppid(), 0.05); print(os.getpid(), flush=True); time.sleep(60)")
    run = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, "
                            f"'-c', {worker!r}]); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    pid = int(run.stdout.readline())
    assert _alive(pid)
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_two_workers_write_the_same_shards_as_one(tiny_chat, tmp_path):
    from specgym.training.models.data_gen import generate

    cfg = _cfg(tiny_chat, prompts=8, oversample=3.0, samples=1)
    one = generate(cfg, tmp_path / "one", workers=1, quiet=True)
    two = generate(cfg, tmp_path / "two", workers=2, quiet=True)
    assert one["prompts"] == two["prompts"] > 0
    assert (tmp_path / "one" / "prompts.jsonl").read_text() == (tmp_path / "two" / "prompts.jsonl").read_text()
    assert _answers(tmp_path / "one") == _answers(tmp_path / "two")
    log = [json.loads(line) for line in (tmp_path / "two" / "log.jsonl").read_text().splitlines()]
    assert {r["workers"] for r in log} == {2}


# --- the command's one-line errors ---------------------------------------------------------------------------------
@pytest.fixture
def cli(monkeypatch):
    import specgym.cli as cli_module

    if "specgym.commands.data" not in cli_module.SUBCOMMAND_MODULES:  # until specgym/cli.py registers it
        monkeypatch.setattr(cli_module, "COMMAND_GROUPS", (*cli_module.COMMAND_GROUPS,
                                                           ("data", ("specgym.commands.data",))))
    return cli_module.main


@pytest.mark.parametrize("argv, fragment", [
    (["--splits", "0.5,0.5,0.5"], "--splits"),
    (["--splits", "0.8,0.2"], "--splits"),
    (["--categories", "chat,poetry"], "unknown category poetry"),
    (["--resume", "--force"], "choose one"),
])
def test_bad_input_is_one_line(cli, capsys, one_line_error, tmp_path, argv, fragment):
    assert cli(["data", "generate", "--out", str(tmp_path / "d"), *argv]) == 2
    one_line_error(capsys, fragment)
    assert not (tmp_path / "d").exists()


def test_existing_output_needs_resume_or_force(cli, capsys, one_line_error, tmp_path):
    (tmp_path / "d").mkdir()
    assert cli(["data", "generate", "--out", str(tmp_path / "d")]) == 2
    one_line_error(capsys, "already exists", "--resume", "--force")
    assert cli(["data", "generate", "--out", str(tmp_path / "d"), "--force"]) == 2
    one_line_error(capsys, "not a folder specgym data generate wrote")

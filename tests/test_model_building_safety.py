"""``train-draft`` and ``train-head`` on bad input and faults: answers stay keyed to their prompts file, every stage
output and checkpoint appears complete or not at all, a stage without its input names the stage to run first, flags
are checked before any model loads, Ctrl-C keeps the progress, and a head's card never misreports its recipe.

The models are tiny (a 4-layer Llama for the draft, the toy GPT-2 pair for the head), so each test runs in seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specgym.cli import main  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.models import checkpoint, distill, draft_build, head_build  # noqa: E402
from specgym.training.models.distill import AnswerPlan, load_answers, sample_answers  # noqa: E402
from specgym.training.models.schedule import one_cycle  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HEAD_TEXTS = ("the cat sat on the mat. the cat sat on the mat. the cat", "abcabcabcabc abcabc abc",
              "one two three, one two three, one two")


def _last_line(capsys) -> str:
    """The last stderr line (progress bars of the stages that ran come before it)."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    return err.splitlines()[-1]


def _write_prompts(path: Path, word: str, splits: tuple[str, ...] = ("train", "train", "val")) -> Path:
    path.write_text("".join(json.dumps({"id": f"{word}{i}", "prompt": f"Tell me about {word} {i}.", "split": s}) + "\n"
                            for i, s in enumerate(splits)))
    return path


@pytest.fixture(scope="module")
def answered(tmp_path_factory, tiny_target) -> tuple[Path, Path]:
    """``(prompts file, work folder)`` after ``train-draft --stages answers,init --temperatures 0`` (copy the work
    folder before changing it)."""
    root = tmp_path_factory.mktemp("answered")
    prompts = _write_prompts(root / "tiny.jsonl", "hello")
    work = root / "work"
    assert main(["train-draft", "--target", str(tiny_target), "--prompts", str(prompts), "--work-dir", str(work),
                 "--stages", "answers,init", "--temperatures", "0"]) == 0
    return prompts, work


def _draft(tiny_target: Path, prompts: Path, work: Path, *argv: str) -> list[str]:
    return ["train-draft", "--target", str(tiny_target), "--prompts", str(prompts), "--work-dir", str(work), *argv]


def _no_model_loads(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(draft_build, "load_model", refuse)
    monkeypatch.setattr(draft_build, "load_tokenizer", refuse)
    monkeypatch.setattr(head_build, "load_model", refuse)


# --- F2: answers are keyed by the prompts file they answer --------------------------------------------------------


def test_answers_to_another_prompts_file_are_refused_in_one_line(tmp_path, tiny_target, answered, capsys,
                                                                 monkeypatch, one_line_error):
    """The report's two runs into one work folder: the second prompts file is refused (answers, train and export
    alike), before any model loads; the same bytes under another name are the same prompts."""
    prompts, src = answered
    work = tmp_path / "mix"
    shutil.copytree(src, work)
    plan = json.loads((work / "answers" / "plan.json").read_text())
    assert plan["prompts"]["file"] == str(prompts) and len(plan["prompts"]["sha256"]) == 64
    other = _write_prompts(tmp_path / "tiny2.jsonl", "other")
    _no_model_loads(monkeypatch)
    for stages in (["--stages", "answers"], ["--stages", "train"],
                   ["--stages", "export", "--out", str(tmp_path / "d")]):
        capsys.readouterr()
        assert main(_draft(tiny_target, other, work, "--temperatures", "0", *stages)) == 2
        one_line_error(capsys, "plan.json: these answers are to another prompts file", str(prompts),
                       f"--prompts {other}", "use another --work-dir")
    monkeypatch.undo()
    same = tmp_path / "renamed.jsonl"
    shutil.copy(prompts, same)
    assert main(_draft(tiny_target, same, work, "--stages", "answers", "--temperatures", "0")) == 0


def test_an_old_plan_without_a_prompts_file_adopts_the_one_given_with_a_note(tmp_path, tiny_target, answered,
                                                                              capsys):
    """A ``plan.json`` written before specgym kept the prompts file: the answers stage takes the answers to be to
    the file it is given, says so, and records it; from then on another file is refused."""
    prompts, src = answered
    work = tmp_path / "old"
    shutil.copytree(src, work)
    for name in ("answers", "answers_val"):
        path = work / name / "plan.json"
        doc = json.loads(path.read_text())
        del doc["prompts"]
        path.write_text(json.dumps(doc))
    assert main(_draft(tiny_target, prompts, work, "--stages", "answers", "--temperatures", "0")) == 0
    err = capsys.readouterr().err
    assert "records no prompts file" in err and f"taken to be to {prompts}, recorded now" in err
    assert json.loads((work / "answers" / "plan.json").read_text())["prompts"]["file"] == str(prompts)
    other = _write_prompts(tmp_path / "tiny2.jsonl", "other")
    assert main(_draft(tiny_target, other, work, "--stages", "answers", "--temperatures", "0")) == 2


# --- F3: draft_init and every checkpoint are saved atomically ----------------------------------------------------


def test_a_failed_init_save_leaves_no_draft_init_and_the_rerun_builds_it(tmp_path, tiny_target, answered,
                                                                         monkeypatch):
    """The init stage writes into a temporary folder renamed when complete: a save that dies half-way leaves no
    ``draft_init`` (so the stage is not done), and the rerun builds it and removes the temporary."""
    prompts, src = answered
    work = tmp_path / "w"
    shutil.copytree(src, work)
    shutil.rmtree(work / "draft_init")
    real = draft_build.load_tokenizer

    class DiesOnSave:
        def __init__(self, tok):
            self.tok = tok

        def __getattr__(self, name):
            return getattr(self.tok, name)

        def save_pretrained(self, folder):
            raise KeyboardInterrupt  # killed after the model's files, before the tokenizer's

    monkeypatch.setattr(draft_build, "load_tokenizer", lambda *a: DiesOnSave(real(*a)))
    with pytest.raises(KeyboardInterrupt):
        draft_build.run(draft_build.DraftBuild(str(tiny_target), str(prompts), work), ("init",))
    assert not (work / "draft_init").exists()
    assert (work / ".specgym-tmp-draft_init" / "config.json").is_file()  # what a SIGKILL would leave
    monkeypatch.undo()
    assert main(_draft(tiny_target, prompts, work, "--stages", "init,train", "--budget-min", "0.01")) == 0
    assert (work / "draft_init" / "specgym-init.json").is_file() and (work / "draft_ckpt" / "state.json").is_file()
    assert not list(work.glob(".specgym-tmp-*"))


def test_a_partial_draft_init_from_a_killed_run_names_the_stage_and_init_rebuilds_it(tmp_path, tiny_target,
                                                                                      answered, capsys,
                                                                                      one_line_error):
    """The report's work folder: ``draft_init`` holding only ``config.json`` and a big temporary (older specgym
    saved it in place). Training says to run init; ``--stages init,train`` replaces it."""
    prompts, src = answered
    work = tmp_path / "res2"
    shutil.copytree(src, work)
    init = work / "draft_init"
    for f in init.iterdir():
        if f.name not in ("config.json", "generation_config.json"):
            f.unlink()
    (init / ".tmpnh1R8c").write_bytes(b"\0" * 1000)
    assert main(_draft(tiny_target, prompts, work, "--stages", "train", "--budget-min", "0.01")) == 2
    one_line_error(capsys, f"--stages train: {init} is incomplete", "run --stages init first")
    assert main(_draft(tiny_target, prompts, work, "--stages", "init,train", "--budget-min", "0.01")) == 0
    assert not (init / ".tmpnh1R8c").exists() and (init / "model.safetensors").is_file()


def test_a_checkpoint_swap_killed_between_its_renames_is_recovered(tmp_path):
    """``draft_ckpt`` is replaced by renaming: killed between the two renames, the next run finds the new
    checkpoint (or else the old one) and removes the leftovers."""
    work = tmp_path / "w"
    new, old = work / ".specgym-tmp-draft_ckpt", work / ".specgym-tmp-draft_ckpt.old"
    for folder, step in ((new, 7), (old, 3)):
        folder.mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"step": step}))
    checkpoint.recover_folder(work / "draft_ckpt", "state.json")
    assert json.loads((work / "draft_ckpt" / "state.json").read_text())["step"] == 7
    assert not new.exists() and not old.exists()
    half = work / ".specgym-tmp-draft_ckpt"  # a save killed mid-write: no state.json, never used
    half.mkdir()
    checkpoint.recover_folder(work / "draft_ckpt", "state.json")
    assert not half.exists()


# --- F5 / F11: flags checked before any model loads --------------------------------------------------------------


@pytest.mark.parametrize("layers, fragment", [
    ("-1", "--layers -1: layer -1 is not a target layer; layers are 0 or above"),
    ("0,99", "--layers 0,99: layer 99 is not a target layer; layers are 0..3 (the target has 4 layers)"),
    ("0,0,0", "--layers 0,0,0: layer 0 is named twice"),
])
def test_bad_layers_are_one_line_before_the_target_loads(tmp_path, tiny_target, capsys, monkeypatch, layers,
                                                         fragment, one_line_error):
    prompts = _write_prompts(tmp_path / "p.jsonl", "hello")
    _no_model_loads(monkeypatch)
    work = tmp_path / "w"
    assert main(_draft(tiny_target, prompts, work, "--stages", "init", "--layers", layers)) == 2
    one_line_error(capsys, fragment)
    assert not work.exists()


def test_the_target_depth_comes_from_a_gguf_header_without_loading_it(tmp_path, tiny_target):
    """``--layers`` is checked against a GGUF target's ``<arch>.block_count``, read from the file's head."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(7)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert draft_build.target_depth(str(path)) == 7
    assert draft_build.target_depth(str(tiny_target)) == 4
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    assert draft_build.target_depth(str(tmp_path / "junk.gguf")) is None  # the load that follows says why
    with pytest.raises(SpecgymError, match="layers are 0..6"):
        distill.check_layers([0, 7], draft_build.target_depth(str(path)))


@pytest.mark.parametrize("temps", ["nan", "inf", "0,-inf", "0,0", "1,1.0"])
def test_temperatures_must_be_finite_non_negative_and_distinct(tmp_path, temps, capsys, one_line_error):
    work = tmp_path / "w"
    assert main(["train-draft", "--work-dir", str(work), "--stages", "answers", "--temperatures", temps]) == 2
    one_line_error(capsys, f"--temperatures {temps!r}")
    assert not work.exists()


def test_a_leftover_temporary_npz_is_never_read_as_answers(tmp_path, tiny_target, answered):
    """A truncated ``.specgym-tmp-0004.npz`` (a SIGKILL inside ``np.savez``) and a complete one are not batches:
    training reads the finished batches only, each once."""
    prompts, src = answered
    work = tmp_path / "w"
    shutil.copytree(src, work)
    answers = work / "answers"
    n = len(load_answers(answers))
    (answers / ".specgym-tmp-0004.npz").write_bytes(b"PK\x03\x04 truncated")
    shutil.copy(answers / "0000.npz", answers / ".specgym-tmp-0001.npz")
    assert len(load_answers(answers)) == n
    assert main(_draft(tiny_target, prompts, work, "--stages", "train", "--budget-min", "0.01")) == 0


# --- F11 / F12: a stage without its input names the stage to run first ------------------------------------------


def test_a_stage_without_its_input_names_the_stage_to_run_first(tmp_path, tiny_target, answered, capsys,
                                                                 monkeypatch, one_line_error):
    prompts, src = answered
    work = tmp_path / "f3"
    shutil.copytree(src, work)
    shutil.rmtree(work / "draft_init")
    _no_model_loads(monkeypatch)
    assert main(_draft(tiny_target, prompts, work, "--stages", "train")) == 2
    one_line_error(capsys, f"--stages train: {work / 'draft_init'} does not exist yet; run --stages init first")
    shutil.copytree(src / "draft_init", work / "draft_init")
    assert main(_draft(tiny_target, prompts, work, "--stages", "export", "--out", str(tmp_path / "d"))) == 2
    one_line_error(capsys, f"--stages export: {work / 'draft_ckpt'} does not exist yet", "run --stages train first")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert main(_draft(tiny_target, prompts, fresh, "--stages", "train")) == 2
    one_line_error(capsys, "holds no answers; run --stages answers first")
    plan = work / "answers" / "plan.json"  # an answers stage stopped after the first of its 3 batches
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "temperatures": [0.0, 0.7]}))
    assert main(_draft(tiny_target, prompts, work, "--stages", "train")) == 2
    one_line_error(capsys, f"--stages train: {work / 'answers'} holds 1 of 3 batches of answers",
                   "run --stages answers first")


def test_stages_run_in_their_fixed_order_whatever_order_they_are_given(tmp_path, tiny_target, answered):
    prompts, src = answered
    work = tmp_path / "w"
    shutil.copytree(src, work)
    assert main(_draft(tiny_target, prompts, work, "--stages", "train,answers", "--temperatures", "0",
                       "--budget-min", "0.01")) == 0
    assert (work / "draft_ckpt" / "state.json").is_file()


def test_a_draft_init_built_from_other_layers_is_not_relabelled(tmp_path, tiny_target, answered, capsys,
                                                               one_line_error):
    """``--layers`` other than the ones ``draft_init`` was built from: init would keep it and export would name the
    wrong layers, so both refuse."""
    prompts, src = answered
    work = tmp_path / "w"
    shutil.copytree(src, work)
    assert main(_draft(tiny_target, prompts, work, "--stages", "init", "--layers", "0,3")) == 2
    one_line_error(capsys, "--layers 0,3:", "was built from target layers 0,1,2,3", "give --layers 0,1,2,3")


# --- F13: a refused run creates no work folder -------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "not json\n", '{"id": "a", "prompt": "x"}\n',
                                     '{"id": "a", "prompt": "x", "split": "train"}\n'])
def test_a_run_refused_for_its_prompts_leaves_no_work_dir(tmp_path, content, capsys):
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text(content)
    work = tmp_path / "work" / "new"
    assert main(["train-draft", "--prompts", str(prompts), "--work-dir", str(work), "--stages", "answers"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


# --- F7: Ctrl-C during training keeps the progress --------------------------------------------------------------


def _interrupt_call(monkeypatch, module, name: str, n: int) -> None:
    """Ctrl-C (``KeyboardInterrupt``) at the ``n``-th call of ``module.name`` (a training step)."""
    real, calls = getattr(module, name), []

    def interrupted(*a):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(module, name, interrupted)


def test_ctrl_c_during_draft_training_saves_and_the_same_command_continues(tmp_path, tiny_target, answered, capsys,
                                                                          monkeypatch):
    prompts, src = answered
    work = tmp_path / "w"
    shutil.copytree(src, work)
    _interrupt_call(monkeypatch, distill, "_draft_step", 4)
    argv = _draft(tiny_target, prompts, work, "--stages", "init,train", "--budget-min", "0.05")
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "specgym train-draft: interrupted"
    assert err[-2].startswith("interrupted at step 3 (") and err[-2].endswith(
        f"checkpoint saved to {work / 'draft_ckpt'}; the same specgym train-draft command continues from it")
    state = json.loads((work / "draft_ckpt" / "state.json").read_text())
    assert state["step"] == 3 and not list(work.glob(".specgym-tmp-*"))
    monkeypatch.undo()
    assert main(argv) == 0
    assert json.loads((work / "draft_ckpt" / "state.json").read_text())["step"] > 3


# --- train-head: any --steps, Ctrl-C, doubled answers, the card's recipe ----------------------------------------


@pytest.fixture(scope="module")
def head_pair(tmp_path_factory) -> tuple[Path, Path]:
    """``(toy target folder, work folder with answers)`` for ``train-head`` (copy the work folder to change it)."""
    from specgym.envs.engines.live.model_loading import load_model, load_tokenizer
    from specgym.envs.workloads.prompts import PromptSpec
    from specgym.training.models.toy import save_toy_pair

    root = tmp_path_factory.mktemp("head")
    _, target_dir = save_toy_pair(root / "pair")
    target, tok = load_model(str(target_dir), "target"), load_tokenizer(str(target_dir), "target")
    prompts = [PromptSpec(f"p{i}", text) for i, text in enumerate(HEAD_TEXTS)]
    work = root / "work"
    sample_answers(target, tok, prompts, work / "answers", AnswerPlan((0.0,), max_new_tokens=16, top_k=8, batch=3))
    sample_answers(target, tok, prompts[:1], work / "answers_val", AnswerPlan((0.0,), max_new_tokens=16))
    return target_dir, work


def _head(target_dir: Path, work: Path, *argv: str) -> list[str]:
    return ["train-head", "--target", str(target_dir), "--work-dir", str(work), "--mlp", "16", *argv]


def test_one_cycle_schedule_works_for_any_number_of_steps():
    for steps in range(1, 62):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=1e-3)
        sched = one_cycle(opt, 1e-3, steps)
        for _ in range(steps):
            opt.step()
            sched.step()
            assert 0 < opt.param_groups[0]["lr"] <= 1e-3


def test_train_head_trains_20_steps(tmp_path, head_pair):
    """The report's ``train-head --steps 20`` (torch's one-cycle schedule divided by zero there)."""
    target_dir, src = head_pair
    work = tmp_path / "w"
    shutil.copytree(src, work)
    assert main(_head(target_dir, work, "--steps", "20", "--stages", "features,train")) == 0
    assert torch.load(work / "head" / "ckpt.pt", weights_only=False)["state"]["step"] == 20


def test_ctrl_c_during_head_training_saves_and_the_same_command_continues(tmp_path, head_pair, capsys,
                                                                         monkeypatch):
    target_dir, src = head_pair
    work = tmp_path / "w"
    shutil.copytree(src, work)
    _interrupt_call(monkeypatch, head_build, "_head_loss", 6)
    argv = _head(target_dir, work, "--steps", "12", "--stages", "features,train")
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "specgym train-head: interrupted"
    assert err[-2] == (f"interrupted at step 5 of 12: checkpoint saved to {work / 'head' / 'ckpt.pt'}; the same "
                       f"specgym train-head command continues from it")
    ckpt = work / "head" / "ckpt.pt"
    assert torch.load(ckpt, weights_only=False)["state"]["step"] == 5
    assert main(_head(target_dir, work, "--steps", "12", "--stages", "export", "--out", str(tmp_path / "h"))) == 2
    assert "trained 5 steps of --steps 12 (stopped before the end)" in _last_line(capsys)
    monkeypatch.undo()
    assert main(argv) == 0
    assert torch.load(ckpt, weights_only=False)["state"]["step"] == 12


def test_extra_answers_naming_the_work_dir_or_twice_are_refused(tmp_path, head_pair, capsys, monkeypatch,
                                                                 one_line_error):
    """``--extra-answers`` of the work folder itself (or of one folder twice, or through a link) would learn the
    same answers twice: one line, before the target loads."""
    target_dir, src = head_pair
    work, extra = tmp_path / "res", tmp_path / "extra"
    shutil.copytree(src, work)
    shutil.copytree(src, extra)
    (tmp_path / "link").symlink_to(extra)
    _no_model_loads(monkeypatch)
    assert main(_head(target_dir, work, "--stages", "features,train", "--extra-answers", str(work))) == 2
    one_line_error(capsys, f"--extra-answers {work}: the same folder as --work-dir {work}", "drop it")
    assert main(_head(target_dir, work, "--stages", "features,train", "--extra-answers", str(extra),
                      "--extra-answers", str(tmp_path / "link"))) == 2
    one_line_error(capsys, f"the same folder as --extra-answers {extra}")


def test_export_refuses_a_recipe_other_than_the_checkpoints(tmp_path, head_pair, capsys):
    """``--stages export --steps 20`` over a head trained for 10 steps would write a card whose rebuild command
    says 20: refused; exported with its own recipe, the card says 10."""
    target_dir, src = head_pair
    work = tmp_path / "res"
    shutil.copytree(src, work)
    assert main(_head(target_dir, work, "--steps", "10", "--stages", "features,train")) == 0
    capsys.readouterr()
    out = tmp_path / "h"
    assert main(_head(target_dir, work, "--steps", "20", "--stages", "export", "--out", str(out))) == 2
    line = _last_line(capsys)
    assert "a head trained another way (steps 10 there, 20 now)" in line and "export with the options" in line
    assert not out.exists()
    assert main(_head(target_dir, work, "--steps", "10", "--stages", "export", "--out", str(out))) == 0
    card = (out / "README.md").read_text()
    assert "--steps 10 " in card and "10 steps of 256 starts" in card


def test_a_head_stage_without_its_input_names_the_stage_to_run_first(tmp_path, head_pair, capsys, monkeypatch,
                                                                      one_line_error):
    target_dir, src = head_pair
    work = tmp_path / "w"
    shutil.copytree(src, work)
    _no_model_loads(monkeypatch)
    assert main(_head(target_dir, work, "--stages", "train")) == 2
    one_line_error(capsys, f"--stages train: {work / 'head' / 'features_train.npz'} does not exist yet",
                   "run --stages features first")
    (work / "head").mkdir()
    for name in ("features_train.npz", "features_val.npz"):
        (work / "head" / name).write_bytes(b"")
    assert main(_head(target_dir, work, "--stages", "export", "--out", str(tmp_path / "h"))) == 2
    one_line_error(capsys, f"--stages export: {work / 'head' / 'ckpt.pt'} does not exist yet",
                   "run --stages train first")


# --- progress: the long stages show a bar with the time left -----------------------------------------------------


def test_the_long_train_draft_stages_report_progress_once_when_piped(tmp_path, tiny_target, answered, capsys):
    """The answers and train stages each have a progress bar (done, time spent, time left); piped, as here, each
    prints its final state once, no animation."""
    prompts, src = answered
    work = tmp_path / "w"
    shutil.copytree(src, work)
    shutil.rmtree(work / "answers")
    capsys.readouterr()
    assert main(_draft(tiny_target, prompts, work, "--stages", "answers,train", "--temperatures", "0",
                       "--budget-min", "0.01")) == 0
    err = capsys.readouterr().err.splitlines()
    for stage in ("target answers (val)", "target answers (train)", "draft distillation"):
        lines = [ln for ln in err if ln.startswith(stage)]
        assert len(lines) == 1 and "100%" in lines[0] and "left" in lines[0], err

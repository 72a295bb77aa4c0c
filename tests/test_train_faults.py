"""Training runs under faults and second thoughts (issues 29 item 5, 31): truncated run files are one line, a full
disk leaves a run folder complete or absent, ``--resume`` refuses what would change the run instead of ignoring it,
and an error names where its bad value came from."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("tensorboard")

import specgym.training.callbacks as callbacks  # noqa: E402
from specgym.cli import main  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.ppo import TrainRequest, train  # noqa: E402

TINY = {"n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "eval_freq": 0}
TINY_ARGS = [f"{k}={v}" for k, v in TINY.items()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished tiny run (copied by every test that changes it)."""
    run = tmp_path_factory.mktemp("runs") / "done"
    train(TrainRequest(workload="assc-regimes", mode="k", out=run, timesteps=256, overrides=dict(TINY), quiet=True))
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


def _err(capsys) -> str:
    """The error line (a run that started printed its banner on stderr before it)."""
    err = capsys.readouterr().err.strip()
    assert err and "Traceback" not in err, err
    line = err.splitlines()[-1]
    assert line.startswith("specgym "), err
    return line


def test_truncated_model_is_one_line(run, tmp_path, capsys):
    for name in ("model.zip", "best_model.zip"):
        if (run / name).exists():
            data = (run / name).read_bytes()
            (run / name).write_bytes(data[: len(data) // 3])
    assert main(["export", str(run), "--which", "final", "--out", str(tmp_path / "p")]) == 2
    assert "model.zip: not a readable model (truncated or damaged" in _err(capsys)
    assert not (tmp_path / "p").exists()


def test_truncated_state_is_one_line(run, capsys):
    (run / "state.json").write_text('{"status": "runn')
    assert main(["train", "--out", str(run), "--resume", "--timesteps", "384"]) == 2
    assert "state.json: damaged run state (not valid JSON" in _err(capsys)


def test_resume_refuses_what_would_change_the_run(run, capsys):
    for extra, words in ((["--workload", "speclane-mix"], "--workload speclane-mix: the run in"),
                         (["--mode", "token"], "--mode token: the run in"),
                         (["--seed", "3"], "--seed 3: the run in"),
                         (["--hyperparams", "learning_rate=1e-3"], "--hyperparams: not with --resume"),
                         (["--config", "x.yaml"], "--config: not with --resume")):
        assert main(["train", "--out", str(run), "--resume", *extra]) == 2
        assert words in _err(capsys)
    # the run's own values are fine; an edited config.yaml is refused, not ignored
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("learning_rate: 0.0003", "learning_rate: 0.1"))
    assert main(["train", "--out", str(run), "--resume", "--workload", "assc-regimes", "--mode", "k"]) == 2
    assert "config.yaml: edited since the run started" in _err(capsys)


def test_full_disk_before_the_first_model_leaves_no_folder(tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise SpecgymError(f"{tmp_path / 'r' / 'resume.pkl'}: cannot write (No space left on device)")

    monkeypatch.setattr(callbacks, "save_snapshot", full)
    assert main(["train", "--workload", "assc-regimes", "--timesteps", "256", "--out", str(tmp_path / "r"),
                 "--hyperparams", *TINY_ARGS]) == 2
    err = _err(capsys)
    assert "No space left on device" in err and "nothing was trained to keep" in err
    assert list(tmp_path.iterdir()) == []  # no config.yaml, tb/ or 'running' state.json without a model


def test_full_disk_after_a_checkpoint_keeps_a_resumable_folder(tmp_path, monkeypatch, capsys):
    real = callbacks.atomic_write_bytes
    calls = {"n": 0}

    def fills_up(path, data, overwrite=False):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, overwrite=overwrite)

    monkeypatch.setattr(callbacks, "atomic_write_bytes", fills_up)
    out = tmp_path / "r"
    assert main(["train", "--workload", "assc-regimes", "--timesteps", "512", "--out", str(out),
                 "--hyperparams", *TINY_ARGS]) == 2
    err = _err(capsys)
    assert "No space left on device" in err and "keeps its last checkpoint" in err and "--resume" in err
    assert json.loads((out / "state.json").read_text())["status"] == "failed"
    monkeypatch.setattr(callbacks, "atomic_write_bytes", real)
    assert main(["train", "--out", str(out), "--resume"]) == 0  # space freed: the run continues from it


def test_existing_folder_without_a_model_is_not_told_to_resume(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / ".specgym").write_text('{"files": ["config.yaml"]}')
    (out / "config.yaml").write_text("x: 1\n")
    assert main(["train", "--workload", "assc-regimes", "--out", str(out)]) == 2
    err = _err(capsys)
    assert "it holds no model to resume" in err and "--resume to continue" not in err


def test_hyperparams_errors_name_hyperparams(tmp_path, capsys):
    for bad, key in (("n_envs=-1", "n_envs"), ("n_envs=3", "n_envs"), ("predictor=nope", "predictor")):
        assert main(["train", "--workload", "assc-regimes", "--out", str(tmp_path / "r"), "--hyperparams", bad]) == 2
        err = _err(capsys)
        assert err.startswith(f"specgym train: error: --hyperparams: {key}") and "k.yaml" not in err


# ------------------------------------------------------------------ resume targets (new-user run 5, F2 and F6)
def _state(run: Path) -> dict:
    return json.loads((run / "state.json").read_text())


@pytest.mark.parametrize("extra", [[], ["--timesteps", "64"], ["--timesteps", "256"]])
def test_resume_of_a_complete_run_says_so_and_trains_nothing(run, capsys, extra):
    model, state = (run / "model.zip").read_bytes(), (run / "state.json").read_text()
    assert main(["train", "--out", str(run), "--resume", *extra]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "complete at 256 timesteps" in err and "nothing to resume" in err, err
    assert (run / "model.zip").read_bytes() == model and (run / "state.json").read_text() == state


def test_resume_below_the_checkpoint_is_refused_and_leaves_the_state(run, capsys):
    doc = _state(run)
    doc["status"] = "interrupted"  # a run stopped at its checkpoint (128), asked for less
    (run / "state.json").write_text(json.dumps(doc))
    before = (run / "state.json").read_text()
    assert main(["train", "--out", str(run), "--resume", "--timesteps", "64"]) == 2
    assert "--timesteps 64 is below the checkpoint at 128 timesteps" in _err(capsys)
    assert (run / "state.json").read_text() == before  # never left "running"


def test_plain_resume_after_an_extension_continues_to_the_extended_target(run, capsys):
    assert main(["train", "--out", str(run), "--resume", "--timesteps", "384"]) == 0
    assert _state(run)["status"] == "complete" and _state(run)["timesteps_done"] == 384
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume"]) == 0  # the config says 256: below the model's 384
    assert "complete at 384 timesteps" in capsys.readouterr().err
    assert _state(run)["status"] == "complete"


def test_damaged_snapshot_advice_does_not_loop(run, capsys):
    data = (run / "resume.pkl").read_bytes()
    (run / "resume.pkl").write_bytes(data[: len(data) // 2])
    assert main(["train", "--out", str(run), "--resume", "--timesteps", "384"]) == 2
    err = _err(capsys)
    assert "not a usable resume snapshot" in err and "move it away" in err and "continues from model.zip alone" in err
    assert "keeps its last checkpoint" not in err
    (run / "resume.pkl").rename(run / "resume.pkl.damaged")  # what the line says to do
    assert main(["train", "--out", str(run), "--resume", "--timesteps", "384"]) == 0
    assert _state(run)["status"] == "complete"

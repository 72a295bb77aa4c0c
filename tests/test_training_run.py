"""The training run object (issue 27 item 4): a run loads its acceptance predictor once, and its state is typed.

The predictor's file reads are counted with the process-wide cache of
:func:`specgym.envs.core.acceptance_predictor.load_predictor` switched off, so every fetch of the run's predictor
by name reads the file again and is seen (before :class:`~specgym.training.run.TrainingRun`, a token run with a
predictor read it 6 times: the run's start, the env factory, the validation callback, the summary's two models).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("tensorboard")

import specgym.envs.core.acceptance_predictor as acceptance_predictor  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.export import export_run  # noqa: E402
from specgym.training.ppo import TrainRequest, train  # noqa: E402
from specgym.training.run import RunState, read_run_state  # noqa: E402
from specgym.training.run_folder import RunFiles  # noqa: E402

TINY = {"n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "eval_freq": 128, "eval_max_requests": 3,
        "predictor": "midpair"}


class _NoCache(dict):
    """A ``_LOADED`` that keeps nothing: every ``load_predictor`` reads its file."""

    def __setitem__(self, key, value) -> None:
        pass


@pytest.fixture
def predictor_reads(monkeypatch) -> collections.Counter[str]:
    """Counts reads of shipped predictor files (by file name), with the per-process cache off."""
    reads: collections.Counter[str] = collections.Counter()
    real_read_text = Path.read_text

    def read_text(self, *a, **k):
        if self.suffix == ".json" and "predictors" in self.parts:
            reads[self.name] += 1
        return real_read_text(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(acceptance_predictor, "_LOADED", _NoCache())
    return reads


def test_a_training_run_reads_its_predictor_once_new_resumed_and_exported(tmp_path, predictor_reads):
    """A token run with a predictor (validations, the summary's final and best models): one read; resuming it: one
    read; exporting it: one read. The resumed run continues from the snapshot's step."""
    out = tmp_path / "run"
    train(TrainRequest(workload="midpair-greedy", mode="token", out=out, timesteps=256, overrides=dict(TINY),
                       quiet=True))
    assert predictor_reads == {"midpair.json": 1}, predictor_reads
    first = read_run_state(RunFiles(out))
    assert first.status == "complete" and first.timesteps_done == 256 and first.best is not None
    assert first.bc_init is not None and first.bc_init["spec"]  # the token config clones its teacher first
    assert [h["timesteps"] for h in first.val_history] == [0, 128, 256]  # the clone, then every eval_freq

    predictor_reads.clear()
    train(TrainRequest(workload="midpair-greedy", mode="token", out=out, timesteps=384, resume=True, quiet=True))
    assert predictor_reads == {"midpair.json": 1}, predictor_reads
    resumed = read_run_state(RunFiles(out))
    assert resumed.status == "complete" and resumed.timesteps_done == 384 and resumed.wall_s > first.wall_s
    assert [h["timesteps"] for h in resumed.val_history] == [0, 128, 256, 384]
    assert resumed.config_sha256 == first.config_sha256

    predictor_reads.clear()
    art = export_run(out, tmp_path / "policy", force=True)  # a tiny run, maybe below the best fixed K
    assert predictor_reads == {"midpair.json": 1}, predictor_reads
    assert json.loads((art / "policy.json").read_text())["predictor"]["sha256"]


def test_run_state_round_trips_and_keeps_unknown_keys():
    data = {"status": "running", "timesteps_done": 1024, "checkpoint_timesteps": 1024, "config_sha256": "ab",
            "best": {"timesteps": 512, "speedup_vs_best_fixed": 1.02}, "val_history": [{"timesteps": 512}],
            "last_eval_step": 512, "wall_s": 3.5, "from_a_newer_specgym": [1, 2]}
    state = RunState.from_dict(data)
    assert state.timesteps_done == 1024 and state.best == {"timesteps": 512, "speedup_vs_best_fixed": 1.02}
    assert state.extra == {"from_a_newer_specgym": [1, 2]}
    assert state.to_dict() == data  # nothing invented (no null fields), nothing dropped
    assert RunState.from_dict({}).to_dict() == {"status": "running", "timesteps_done": 0, "val_history": [],
                                                "wall_s": 0.0}


@pytest.mark.parametrize(("data", "message"), [
    ({"timesteps_done": "many"}, "field 'timesteps_done' has a bad value 'many'"),
    ({"best": [1]}, "field 'best' has a bad value"),
    ({"timesteps_done": True}, "field 'timesteps_done' has a bad value True"),
    ({"status": "sleeping"}, "field 'status' must be one of"),
])
def test_a_bad_state_field_is_one_line_naming_the_file(tmp_path, data, message):
    files = RunFiles(tmp_path)
    files.state.write_text(json.dumps(data))
    with pytest.raises(SpecgymError, match=message) as err:
        read_run_state(files)
    assert str(err.value).startswith(str(files.state)) and "\n" not in str(err.value)

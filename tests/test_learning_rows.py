"""A PPO run never chooses its best model on the requests it learned from.

Where a recording fits on val (its drafters learned its train prompts: ``Workload.fit_split`` is ``val``), a run
learns from val's fit rows and validates on val's choice rows (:meth:`Workload.learning_requests`), as the
predictors and fitted rules do; a workload fitting on train learns from train and chooses on val, as before.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specgym.envs.workloads.trace_format import cached_workload, save_workload
from specgym.training.run import TrainingRun

pytest.importorskip("stable_baselines3")


@pytest.fixture(scope="module")
def small():
    """Two train, ten val and two test requests of the shipped real-pair recording (it fits on val)."""
    wl = cached_workload("smollm2-greedy")
    out = wl.subset(np.concatenate([wl.split_indices(s)[:n] for s, n in (("train", 2), ("val", 10), ("test", 2))]))
    assert out.fit_split == "val"
    return out


def test_the_learning_and_choosing_rows_are_val_split_in_two(small):
    run = TrainingRun(None, None, small)  # type: ignore[arg-type]
    fit, choose = run.fit_workload, run.select_workload
    fit_ids, choose_ids = set(fit.request_id.tolist()), set(choose.request_id.tolist())
    val_ids = set(small.request_id[small.split_indices("val")].tolist())
    assert fit_ids and choose_ids and not fit_ids & choose_ids and fit_ids | choose_ids == val_ids
    assert (fit.split == "val").all() and (choose.split == "val").all()
    on_train = dataclasses.replace(small, extra={**small.extra, "fit_split": "train"})
    run = TrainingRun(None, None, on_train)  # type: ignore[arg-type]
    assert run.fit_workload is on_train and run.select_workload is on_train


def test_a_run_learns_on_the_fit_rows_and_validates_on_the_others(small, tmp_path, monkeypatch):
    from specgym.training import ppo
    from specgym.training.config import RunConfig
    from specgym.training.env_factory import make_env_fn
    from specgym.training.run_folder import RunFiles

    path = save_workload(small, tmp_path / "w.parquet")
    chosen: list[set[str]] = []
    real = ppo.make_validator

    def spy(cfg, workload):
        chosen.append(set(workload.request_id.tolist()))
        return real(cfg, workload)

    monkeypatch.setattr(ppo, "make_validator", spy)
    tiny = {"n_envs": 2, "n_steps": 32, "batch_size": 64, "n_epochs": 1, "eval_freq": 10_000}
    ppo.train(ppo.TrainRequest(workload=str(path), mode="k", out=tmp_path / "run", timesteps=64, seed=0,
                               overrides=tiny, quiet=True))
    run = TrainingRun(RunFiles(tmp_path / "run"), RunConfig.from_file(tmp_path / "run" / "config.yaml"), small)
    assert chosen == [set(run.select_workload.request_id.tolist())]
    env = make_env_fn(run)()
    seen = set()
    for seed in range(40):
        env.reset(seed=seed)
        seen.add(str(env.unwrapped.workload.request_id[env.unwrapped.request_index]))
    assert seen <= set(run.fit_workload.request_id.tolist()) and len(seen) > 1
    assert not seen & chosen[0]

"""A token-mode policy that reads an acceptance predictor (feature version 4): the env and the exported controller
compute the same observations, the predictor travels inside the artifact under its checksum, and version-3
policies still run.

The workload and predictor here are SYNTHETIC (tests/synthetic_v2.py), except where a shipped policy is loaded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from synthetic_v2 import v2_workload

import specgym.catalogue as catalogue
from specgym.agents.artifact import load_policy, random_artifact, write_artifact
from specgym.agents.policy_controller import PolicyController
from specgym.envs.core.features import feature_names
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.gym.spec_env import SpecDecodeEnv, SpecDecodeTokenEnv
from specgym.errors import SpecgymError
from specgym.eval.runner import run_controller
from specgym.training.predictor import select_predictor

FLAG = feature_names("token").index("tok_predicted")
EST = feature_names("token").index("tok_accept_est")


@pytest.fixture(scope="module")
def wl():
    return v2_workload()


@pytest.fixture(scope="module")
def pred(wl):
    return select_predictor(wl, ("conf", "shape", "position", "lookup"), name="synthetic-v2",
                            kinds=("logistic",))[0]


def test_token_env_shows_the_predictors_probability(wl, pred):
    env = SpecDecodeTokenEnv(workload=wl, predictor=pred)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0, options={"request": 1})
    assert obs[FLAG] == 0.0  # nothing drafted yet
    obs, *_ = env.step(1)
    step_pos = env.unwrapped.req.position
    plain = SpecDecodeTokenEnv(workload=wl)
    pobs, _ = plain.reset(seed=0, options={"request": 1})
    pobs, *_ = plain.step(1)
    assert obs[FLAG] == 1.0 and pobs[FLAG] == 0.0
    assert step_pos == plain.req.position
    assert obs[EST] != pytest.approx(pobs[EST])  # the predictor's estimate, not calibrated confidence
    assert np.array_equal(np.delete(obs, [EST, EST + 1, EST + 2, FLAG]), np.delete(pobs, [EST, EST + 1, EST + 2, FLAG]))
    with pytest.raises(SpecgymError, match="only the token-mode env"):
        SpecDecodeEnv(workload=wl, predictor=pred)
    with pytest.raises(SpecgymError, match="predictor"):
        SpecDecodeTokenEnv(workload=wl, predictor=3)


def test_exported_controller_replays_exactly_like_the_env(wl, pred, tmp_path):
    art = random_artifact("token", seed=3)
    art.predictor = pred.to_dict()
    ctrl = PolicyController(load_policy(write_artifact(art, tmp_path / "pol")))
    reqs = wl.split_indices("val")
    res = run_controller(TraceEngine(wl, k_max=8, seed=0), reqs, ctrl, trace=reqs)
    env = SpecDecodeTokenEnv(workload=wl, split="val", predictor=pred)
    flags = 0
    for r in reqs.tolist():
        obs, _ = env.reset(options={"request": r})
        done, info, rounds = False, {}, []
        while not done:
            pos = env.req.position
            flags += obs[FLAG] == 1.0
            obs, _, done, _, info = env.step(ctrl.network.act(obs))
            if "drafted" in info:
                rounds.append((pos, info["drafted"], info["accepted"]))
        tail = info["length"] - ctrl.k_max - 1  # see test_export: the env knows the clipped cap at the tail
        assert [(p, d, a) for p, _, d, a in res.traces[r] if p < tail] == [x for x in rounds if x[0] < tail]
    assert flags > 0


def test_the_embedded_predictor_is_under_the_checksum(pred, tmp_path):
    art = random_artifact("token", seed=0)
    art.predictor = pred.to_dict()
    out = write_artifact(art, tmp_path / "pol")
    meta = json.loads((out / "policy.json").read_text())
    meta["predictor"]["threshold"] = 0.9
    (out / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(SpecgymError, match="function_sha256|checksum"):
        load_policy(out)
    k_art = random_artifact("k", seed=0)
    k_art.predictor = pred.to_dict()
    with pytest.raises(SpecgymError, match="only token-mode policies"):
        k_art.validate()


def test_version_3_policies_still_run():
    art = load_policy(catalogue.resolve("policy", "generalist-token"))  # shipped with feature version 3
    assert art.feature_version == 3 and art.predictor is None
    assert art.features == feature_names("token", 3)
    ctrl = PolicyController(art)
    from specgym.envs.workloads.trace_format import cached_workload

    midpair = cached_workload("midpair-greedy")
    res = run_controller(TraceEngine(midpair, seed=0), midpair.split_indices("test")[:5], ctrl)
    assert res.drafted.sum() > 0
    assert len(ctrl.decisions.observation()) == len(feature_names("token", 3))


@pytest.mark.slow
def test_training_with_a_predictor_exports_and_summarises_with_it(tmp_path):
    """A short run on the SYNTHETIC-free shipped midpair: the kept policy's summary, its export and its validation
    all read the run's predictor (a summary without it would price another policy)."""
    from specgym.cli import main

    run = tmp_path / "run"
    assert main(["train", "--workload", "midpair-greedy", "--mode", "token", "--timesteps", "2048", "--out", str(run),
                 "--hyperparams", "predictor=midpair", "bc_init=planned:midpair", "n_envs=2", "n_steps=256",
                 "batch_size=256", "eval_freq=0", "bc_warmup=0"]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "pol"), "--force"]) == 0  # a tiny run, maybe below
    art = load_policy(tmp_path / "pol")
    assert art.predictor is not None and art.predictor["name"] == "midpair"
    summary = json.loads((run / "summary.json").read_text())
    from specgym.envs.workloads.trace_format import cached_workload
    from specgym.training.validation import validate_policy

    midpair = cached_workload("midpair-greedy")
    assert validate_policy(art, midpair).throughput_tok_s == pytest.approx(summary["val"]["throughput_tok_s"])

"""Gymnasium environments: check_env clean, determinism, pickling, rewards and the SB3 wrapper."""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import specgym  # noqa: F401
from specgym.envs.core.features import feature_names
from specgym.envs.gym.spec_env import SpecDecodeEnv, SpecDecodeTokenEnv
from specgym.envs.gym.wrappers import SB3ActionWrapper
from specgym.errors import SpecgymError

IDS = ["specgym/SpecDecode-v1", "specgym/SpecDecodeToken-v1"]


@pytest.mark.parametrize("env_id", IDS)
def test_check_env_without_warnings(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)


@pytest.mark.parametrize("env_id", IDS)
def test_determinism_under_seed(env_id):
    def rollout(seed):
        env = gym.make(env_id, workload="assc-regimes", outcome_seed=None)
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        trace = [obs]
        for _ in range(300):
            obs, r, term, trunc, info = env.step(env.action_space.sample())
            trace.append(np.append(obs, r))
            if term:
                obs, _ = env.reset()
        return np.concatenate(trace)

    np.testing.assert_array_equal(rollout(3), rollout(3))
    assert not np.array_equal(rollout(3), rollout(4))


@pytest.mark.parametrize("env_cls", [SpecDecodeEnv, SpecDecodeTokenEnv])
def test_pickle_round_trip(env_cls):
    env = env_cls(workload="speclane-mix", split="val")
    env.reset(seed=0)
    env.step(1)
    clone = pickle.loads(pickle.dumps(env))
    a = clone.step(1)
    b = env.step(1)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == b[1]


def test_episode_return_equals_n_minus_time(make_trace, flat_profile):
    wl = make_trace([[1, 1, 0, 1, 1, 1, 1, 0, 1, 1] * 5], flat_profile)
    env = SpecDecodeEnv(workload=wl, split="all")
    env.reset(options={"request": "r0"})
    total, t, done = 0.0, 0.0, False
    while not done:
        obs, r, done, trunc, info = env.step(3)
        assert env.observation_space.contains(obs)
        assert set(info["rewards"]) == {"tokens", "time"}
        total += r
        t += info["time_ms"]
    assert total == pytest.approx(50 - t / 10.0)


def test_token_env_matches_k_env_when_drafting_k(flat_profile, regime_workload):
    """Token mode with 'continue until k drafted' plays the same rounds as K mode with action k."""
    for k in (0, 1, 3, 8):
        kenv = SpecDecodeEnv(workload=regime_workload, split="all")
        tenv = SpecDecodeTokenEnv(workload=regime_workload, split="all")
        kenv.reset(options={"request": 7})
        tenv.reset(options={"request": 7})
        kret = tret = 0.0
        done = False
        while not done:
            _, r, done, _, _ = kenv.step(k)
            kret += r
        done = False
        while not done:
            drafted = tenv.decisions.drafted
            _, r, done, _, _ = tenv.step(1 if drafted < k else 0)
            tret += r
        assert kret == pytest.approx(tret)
        assert kenv.episode_time_ms == pytest.approx(tenv.episode_time_ms)


def test_token_env_stop_at_zero_is_autoregressive(mix_workload):
    env = SpecDecodeTokenEnv(workload=mix_workload, split="all")
    env.reset(options={"request": 0})
    _, r, _, _, info = env.step(0)
    assert info["verified"] and info["drafted"] == 0 and info["produced"] == 1
    assert r == pytest.approx(1 - 1.0)


def test_observation_uses_only_past(make_trace, mix_workload):
    """Two requests that agree on the verified prefix give identical observations (no look-ahead)."""
    p1 = [1, 1, 1, 0] + [1] * 20
    p2 = [1, 1, 1, 0] + [0] * 20
    from specgym.envs.profiles import load_profile

    wl = make_trace([p1, p2], load_profile("speclane-table"))
    env = SpecDecodeEnv(workload=wl, split="all")
    o1, _ = env.reset(options={"request": 0})
    o1b = env.step(4)[0]
    o2, _ = env.reset(options={"request": 1})
    o2b = env.step(4)[0]
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(o1b, o2b)


def test_config_errors_and_request_selection(mix_workload):
    with pytest.raises(SpecgymError, match="unknown env config key"):
        SpecDecodeEnv(colour="red")
    with pytest.raises(SpecgymError, match="k_max must be"):
        SpecDecodeEnv(k_max=0)
    with pytest.raises(SpecgymError, match="unknown cost profile"):
        SpecDecodeEnv(profile="h100")
    env = SpecDecodeEnv(workload=mix_workload)
    _, info = env.reset(options={"request": mix_workload.request_id[5]})
    assert info["request"] == mix_workload.request_id[5]
    with pytest.raises(SpecgymError, match="unknown request id"):
        env.reset(options={"request": "nope"})


def test_k_min_and_sb3_wrapper():
    env = gym.make("specgym/SpecDecode-v1", k_min=2, k_max=6)
    assert env.action_space == gym.spaces.Discrete(5, start=2)
    wrapped = SB3ActionWrapper(env)
    assert wrapped.action_space == gym.spaces.Discrete(5)
    wrapped.reset(seed=0)
    _, _, _, _, info = wrapped.step(0)
    assert info["planned_k"] == 2  # agent action 0 -> K = k_min = 2 (first round, no clipping)
    _, _, _, _, info = wrapped.step(4)
    assert info["planned_k"] == 6


def test_token_env_stop_before_drafting_reports_k_zero(mix_workload):
    """A stop at j = 0 is recorded as the K = 0 round a deployed controller would report."""
    env = SpecDecodeTokenEnv(workload=mix_workload, split="all")
    env.reset(options={"request": 1})
    _, _, _, _, info = env.step(0)
    assert info["planned_k"] == 0 and info["drafted"] == 0
    assert dict(zip(feature_names("token"), env.decisions.observation()))["last_k"] == 0.0


@pytest.mark.parametrize("env_id", IDS)
def test_one_token_request_is_one_terminal_step(env_id):
    """A request with no room to draft (one token): reset() gives a live episode; one step ends it, the next raises."""
    from specgym.envs.profiles import load_profile
    from specgym.envs.workloads.trace_format import workload_from_requests

    reqs = [dict(request_id=f"r{n}", category="c", temperature=0.0, prompt_len=3, split="train",
                 p_accept=np.full(n, 0.7), draft_conf=np.full(n, 0.6), draft_entropy=np.full(n, 1.0)) for n in (1, 5)]
    wl = workload_from_requests("one-token", {"kind": "synthetic"}, load_profile("assc-illustrative"), reqs)
    env = gym.make(env_id, workload=wl, split="all").unwrapped
    obs, info = env.reset(seed=0, options={"request": "r1"})
    assert env.observation_space.contains(obs) and info["length"] == 1
    obs, reward, term, trunc, info = env.step(0)
    assert term and not trunc and info["produced"] == 1 and info["position"] == 1
    assert reward == pytest.approx(1 - info["time_ms"] / info["t_ar_ms"])
    with pytest.raises(SpecgymError, match="reset"):
        env.step(0)
    env.reset(seed=0, options={"request": "r5"})  # and the env is reusable
    assert env.step(env.action_space.start)[4]["position"] >= 1

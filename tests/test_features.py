"""Feature tracker: bounds, names, meaning of a few features, and the token-mode extension."""

from __future__ import annotations

import numpy as np
import pytest

from specgym.envs.core.cost import CostProfile
from specgym.envs.core.features import (
    PREDICTOR_FEATURES,
    ROUND_FEATURES,
    TOKEN_FEATURES,
    FeatureTracker,
    feature_bounds,
    feature_names,
)
from specgym.envs.core.rounds import RequestContext, RoundOutcome


def _ctx(temp=0.0):
    return RequestContext("r", "c", temp, 10, 8, CostProfile("t", 2.0, (20.0,) * 9))


def _o(drafted, accepted, conf=0.9, ent=0.3, k=None):
    return RoundOutcome(0, k if k is not None else drafted, drafted, accepted, accepted + 1, 10.0,
                        np.full(drafted, conf, np.float32), np.full(drafted, ent, np.float32))


def test_names_and_bounds_align():
    assert len(feature_names("k")) == len(ROUND_FEATURES)
    assert len(feature_names("token")) == len(ROUND_FEATURES) + len(TOKEN_FEATURES) + len(PREDICTOR_FEATURES)
    assert feature_names("token", 3) == feature_names("token")[:-len(PREDICTOR_FEATURES)]
    low, high = feature_bounds("token")
    assert (low < high).all() and np.isfinite(high).all()


def test_observations_stay_in_bounds_under_extremes():
    t = FeatureTracker(8)
    t.reset(_ctx(temp=5.0))
    low, high = feature_bounds("k")
    for o in [_o(8, 8, 1.0, 0.0)] * 50 + [_o(8, 0, 0.0, 50.0)] * 50 + [_o(0, 0)] * 5:
        t.update(o)
        obs = t.observation()
        assert obs.dtype == np.float32 and (obs >= low).all() and (obs <= high).all()
    tlow, thigh = feature_bounds("token")
    from specgym.envs.core.features import TokenDecisionState
    from specgym.envs.core.rounds import DraftStep

    dec = TokenDecisionState(t)
    for j, (conf, ent) in enumerate([(0.2, 20.0), (1e-6, 0.0), (1.0, 50.0)], start=1):
        dec.add(DraftStep(j, 8, j - 1, conf, ent))
        tok = dec.observation()
        assert (tok >= tlow).all() and (tok <= thigh).all()


def test_feature_meanings():
    t = FeatureTracker(8)
    t.reset(_ctx(temp=0.8))
    names = feature_names("k")
    obs = dict(zip(names, t.observation()))
    assert obs["no_history"] == 1.0 and obs["temperature"] == pytest.approx(0.8)
    assert obs["cost_ratio"] == pytest.approx(0.1) and obs["verify_slope"] == 0.0
    t.update(_o(4, 4, conf=0.8))
    t.update(_o(4, 4, conf=0.8))
    obs = dict(zip(names, t.observation()))
    assert obs["no_history"] == 0.0 and obs["full_streak"] == pytest.approx(2 / 8)
    assert obs["last_accepted"] == pytest.approx(0.5) and obs["last_conf_mean"] == pytest.approx(0.8)
    assert obs["acc_rate_ema_fast"] > obs["acc_rate_ema_mid"] > obs["acc_rate_ema_slow"] > 0.5
    t.update(_o(4, 0))
    obs = dict(zip(names, t.observation()))
    assert obs["full_streak"] == 0 and obs["zero_streak"] == pytest.approx(1 / 8)


def test_reset_clears_history():
    t = FeatureTracker(8)
    t.reset(_ctx())
    fresh = t.observation()
    t.update(_o(5, 2))
    assert not np.array_equal(t.observation(), fresh)
    t.reset(_ctx())
    np.testing.assert_array_equal(t.observation(), fresh)


def test_tokens_after_the_first_rejection_are_not_observed():
    """Confidences of tokens drafted after the first rejection never reach the features (no look-ahead).

    In replay those values come from the correct-prefix trace, i.e. they are the next round's draft features.
    """
    def obs_after(tail_conf: float) -> np.ndarray:
        t = FeatureTracker(8)
        t.reset(_ctx())
        conf = np.array([0.9, 0.8, 0.3, tail_conf, tail_conf], np.float32)  # accepted 2, token 3 rejected
        t.update(RoundOutcome(0, 5, 5, 2, 3, 10.0, conf, 1.0 - conf))
        return t.observation()

    np.testing.assert_array_equal(obs_after(0.05), obs_after(0.99))
    names = feature_names("k")
    obs = dict(zip(names, obs_after(0.5)))
    assert obs["last_conf_min"] == pytest.approx(0.3) and obs["last_conf_last"] == pytest.approx(0.3)
    assert obs["last_conf_mean"] == pytest.approx((0.9 + 0.8 + 0.3) / 3)


def test_token_env_and_exported_controller_decide_alike_through_the_shared_state(regime_workload):
    """The token env and the deployed controller see the same observation at every decision, so the same policy
    makes the same decisions in training and in deployment (TokenDecisionState + FeatureTracker are shared)."""
    from specgym.agents.artifact import random_artifact
    from specgym.agents.policy_controller import PolicyController
    from specgym.envs.core.request import drive
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.envs.gym.spec_env import SpecDecodeTokenEnv

    art = random_artifact("token", seed=3)
    art.weights[-1][1] += 0.3  # a policy that drafts a fair amount
    for r in range(6):
        env_log, ctl_log = [], []
        policy = PolicyController(art)
        env = SpecDecodeTokenEnv(workload=regime_workload, split="all")
        obs, _ = env.reset(options={"request": r})
        done = False
        while not done:
            a = policy.act(obs)
            env_log.append((obs.tobytes(), a))
            obs, _, done, _, _ = env.step(a)

        class Logged(PolicyController):
            def act(self, o):
                a = super().act(o)
                ctl_log.append((o.tobytes(), a))
                return a

            def observe(self, outcome):
                if outcome.forced:  # the env plays forced rounds without asking: drop their j = 0 decision
                    ctl_log.pop()
                super().observe(outcome)

        drive(Logged(art), TraceEngine(regime_workload, k_max=8, seed=0).start(r))
        assert len(env_log) > 20
        assert env_log == ctl_log



def test_calibration_and_cost_features():
    """An over-confident draft shows a negative calibration gap and a calibrated acceptance below its confidence;
    the model-optimal K falls when verifying more tokens costs more; the marginal ratio says stop when the next
    draft is unlikely to be accepted."""
    from specgym.envs.core.cost import CostProfile
    from specgym.envs.core.features import TokenDecisionState
    from specgym.envs.core.rounds import DraftStep

    names = feature_names("k")
    flat, steep = (RequestContext("r", "c", 0.0, 10, 8, CostProfile(n, 2.0, tuple(20.0 * (1 + s * i) for i in
                                                                                    range(9))))
                   for n, s in (("flat", 0.0), ("steep", 0.3)))
    t = FeatureTracker(8)
    t.reset(steep)
    for _ in range(30):  # confidence 0.9, but only one token in three is accepted
        t.update(_o(3, 1, conf=0.9))
    obs = dict(zip(names, t.observation()))
    assert obs["calib_gap"] < -0.3
    assert t.calibration.accept_prob(0.9) < 0.6
    dec = TokenDecisionState(t)
    dec.add(DraftStep(1, 8, 0, 0.9, 0.3))
    assert dec.marginal_ratio() < 1.0  # verifying one more token costs 30% of a step: the next draft does not pay
    t.reset(flat)
    for _ in range(30):
        t.update(_o(3, 1, conf=0.9))
    dec = TokenDecisionState(t)
    dec.add(DraftStep(1, 8, 0, 0.9, 0.3))
    assert dec.marginal_ratio() > 1.0  # with a flat verify and a cheap draft it still does
    ks = []
    for ctx in (flat, steep):
        t.reset(ctx)
        for _ in range(20):
            t.update(_o(4, 3, conf=0.8))
        ks.append(dict(zip(names, t.observation()))["k_model"])
    assert ks[0] > ks[1] > 0

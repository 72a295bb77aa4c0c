"""The drafter policy's online features (drafter feature version 3, issue 54): version 2's vector unchanged as its
prefix, per-slot features read off the rounds' free counterfactual outcomes (moving where prompt lookup is judged
while another drafter plays, neutral at T > 0), one feature code for the env and the exported controller, and the
shipped version-2 policy deciding exactly as before.

The shipped workloads are real recordings of the smollm2 pair (`smollm2-greedy`, `smollm2-t07`); the other rounds
are hand-made."""

from __future__ import annotations

import hashlib
import warnings

import numpy as np
import pytest

from specgym.agents.artifact import PolicyArtifact, load_policy, random_artifact
from specgym.agents.drafter_policy import DrafterPolicyController
from specgym.catalogue import resolve
from specgym.envs.core.drafter_choice import NO_DRAFTER, DrafterController, DrafterDecision, drive_drafters
from specgym.envs.core.drafter_features import (
    DRAFTER_FEATURE_NAMES,
    DRAFTER_FEATURE_VERSION,
    ONLINE_FEATURE_NAMES,
    DrafterFeatureTracker,
    drafter_feature_names,
    feature_bounds,
)
from specgym.envs.core.rounds import RoundOutcome, RoundStart
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError

K_MAX = 8
V2 = len(drafter_feature_names(2))
#: Recorded with the version-2 code before the online features existed (issue 54): the shipped `smollm2-drafter`
#: policy on `smollm2-greedy` request 8 under `cpu-smollm2` (k_max 8): its decisions, the SHA-256 of its
#: observations (float32, one row per round) and the request's time.
SHIPPED_REQUEST = 8
SHIPPED_DECISIONS = (
    "head3,head3,head3,head3,head3,head3,head3,head3,head3,head3,head3,ngram5,head3,head3,head3,head3,head3,head3,"
    "head3,ngram5,head3,ngram3,ngram6,ngram6,ngram6,head3,head3,head3,head3,ngram6,ngram6,head3,head3,head3,head3,"
    "head3,ngram5,head3,head3,head3,head3,head3,head3,ngram5,ngram5,head3,head3,head3,ngram6,ngram6,ngram6,head5,"
    "head3,ngram3")
SHIPPED_OBS_SHA256 = "b829aae0791fd9d02cf8d29d93f986682b1a0e438c74f510b9e6ae4dc7bb04b1"
SHIPPED_TIME_MS = 1549.379599999999


@pytest.fixture(scope="module")
def greedy():
    return cached_workload("smollm2-greedy"), load_profile("cpu-smollm2")


class Recorder(DrafterPolicyController):
    """The exported controller, recording the observation and the decision of every round."""

    def reset(self, ctx, drafters):
        super().reset(ctx, drafters)
        self.obs: list[np.ndarray] = []
        self.decisions: list[DrafterDecision] = []

    def propose(self, start):
        self.obs.append(self.tracker.observation(start))
        self.decisions.append(super().propose(start))
        return self.decisions[-1]


class Twin(DrafterController):
    """Plays a fixed cycle of decisions and feeds every round to a version-2 and a version-3 tracker."""

    name = "twin"

    def __init__(self, cycle: list[tuple[str, int]]):
        self.cycle, self.v2, self.v3 = cycle, DrafterFeatureTracker(K_MAX, 2), DrafterFeatureTracker(K_MAX)
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []

    def reset(self, ctx, drafters):
        super().reset(ctx, drafters)
        self.v2.reset(ctx, drafters)
        self.v3.reset(ctx, drafters)

    def propose(self, start):
        self.rows.append((self.v2.observation(start), self.v3.observation(start)))
        d, k = self.cycle[len(self.rows) % len(self.cycle)]
        return DrafterDecision(d, k)

    def observe(self, outcome):
        self.v2.update(outcome)
        self.v3.update(outcome)


def online(obs: np.ndarray, what: str, slot: int) -> float:
    return float(obs[DRAFTER_FEATURE_NAMES.index(f"{what}_{slot}")])


def test_the_names_bounds_and_version_table():
    """Version 3 is version 2's names in order, then three online features per slot, all in [0, 1]; an unknown
    version is one line."""
    assert DRAFTER_FEATURE_VERSION == 3 and drafter_feature_names(3) == list(DRAFTER_FEATURE_NAMES)
    assert drafter_feature_names(3)[:V2] == drafter_feature_names(2) and V2 == 27
    assert list(DRAFTER_FEATURE_NAMES[V2:]) == list(ONLINE_FEATURE_NAMES) and len(ONLINE_FEATURE_NAMES) == 9
    low, high = feature_bounds(2)
    assert low.shape == (V2,) and (high == 1).all() and feature_bounds()[0].shape == (36,)
    with pytest.raises(SpecgymError, match="drafter feature version 1 .*versions 2, 3"):
        DrafterFeatureTracker(K_MAX, 1)


def test_the_v2_prefix_is_the_old_vector_on_a_replayed_request(greedy):
    """Over a replayed smollm2-greedy request, every drafter in turn, the version-3 vector's first 27 entries are
    byte for byte the version-2 vector, and that vector is the one the version-2 code computed (the shipped policy's
    observations, recorded before the change, below)."""
    wl, prof = greedy
    twin = Twin([("head", 3), ("ngram", 5), ("draft", 2), (NO_DRAFTER, 0), ("head", 1)])
    drive_drafters(twin, TraceEngine(wl, prof, K_MAX).start(SHIPPED_REQUEST), wl.drafter_names)
    assert len(twin.rows) > 20
    for v2, v3 in twin.rows:
        assert v2.shape == (V2,) and v3.shape == (len(DRAFTER_FEATURE_NAMES),)
        assert v3[:V2].tobytes() == v2.tobytes()
    assert any(v3[V2:].any() for _, v3 in twin.rows)  # the appended part is not a constant


def test_the_shipped_v2_policy_decides_as_before(greedy):
    """`smollm2-drafter` (feature version 2) loads, observes the 27-feature vector, and on a replayed request makes
    the decisions, from the observations, at the time recorded with the version-2 code."""
    wl, prof = greedy
    art = load_policy(resolve("policy", "smollm2-drafter"))
    assert art.feature_version == 2 and art.features == drafter_feature_names(2)
    ctrl = Recorder(art, "smollm2-drafter")
    ctrl.prepare(wl, prof)
    tot = drive_drafters(ctrl, TraceEngine(wl, prof, art.k_max).start(SHIPPED_REQUEST), wl.drafter_names)
    got = ",".join("-" if d.plain else f"{d.drafter}{d.k}" for d in ctrl.decisions)
    assert got == SHIPPED_DECISIONS
    assert hashlib.sha256(np.stack(ctrl.obs).astype(np.float32).tobytes()).hexdigest() == SHIPPED_OBS_SHA256
    assert tot.time_ms == pytest.approx(SHIPPED_TIME_MS, rel=1e-12)
    assert ctrl.guard_stats()["handed"] == 0


def test_a_v2_artifact_runs_on_the_v2_vector_and_a_mismatched_one_is_refused():
    """A version-2 artifact validates with version 2's names and its controller computes 27 features; version 3's
    names under version 2, or an unknown version, are refused."""
    v3 = random_artifact("drafter", k_max=K_MAX)
    assert v3.feature_version == 3 and v3.features == list(DRAFTER_FEATURE_NAMES)
    names = drafter_feature_names(2)
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=(4, V2)).astype(np.float32), rng.normal(size=(v3.n_actions, 4)).astype(np.float32)]
    v2 = PolicyArtifact(mode="drafter", k_min=0, k_max=K_MAX, weights=weights,
                        biases=[np.zeros(4, np.float32), np.zeros(v3.n_actions, np.float32)], feature_version=2,
                        features=names, obs_low=np.zeros(V2), obs_high=np.ones(V2), teacher="drafter-marginal")
    ctrl = DrafterPolicyController(v2, "v2")
    assert ctrl.tracker.version == 2 and ctrl.tracker.observation(RoundStart(0, 10, 0)).shape == (V2,)
    assert ctrl.guard is not None and ctrl.guard.lo.shape == (V2,)
    with pytest.raises(SpecgymError, match="feature list"):
        PolicyArtifact(**{**v2.__dict__, "features": list(DRAFTER_FEATURE_NAMES)}).validate()
    with pytest.raises(SpecgymError, match="feature version 1"):
        PolicyArtifact(**{**v2.__dict__, "feature_version": 1}).validate()


def test_online_features_follow_the_counterfactuals():
    """Prompt lookup judged for free while the head plays: its run, its at-least rate and its seen share rise; a
    round without its counterfactual leaves the run and the at-least rate as they were (the share decays); a run
    censored below the round's tokens lowers the at-least rate; the other slots and the played drafter's own
    counterfactual (never reported, ignored) stay neutral."""
    tr = DrafterFeatureTracker(K_MAX)
    tr.reset(None, ("draft", "ngram", "head"))
    start = RoundStart(10, 40, 3)
    assert not tr.observation(start)[V2:].any()  # neutral: 0 before any round
    for _ in range(5):  # the head accepts 1 of 3; prompt lookup would have had all 2 verified tokens (at least)
        tr.update(RoundOutcome(10, 3, 3, 1, 2, 1.0, drafter="head", counterfactual=(("ngram", 2), ("head", 7))))
    obs = tr.observation(start)
    run, atleast, seen = (online(obs, w, 1) for w in ("cf_run", "cf_atleast", "cf_seen"))
    assert run == pytest.approx((1 - 0.7 ** 5) * 2 / K_MAX) and atleast == pytest.approx(1 - 0.7 ** 5)
    assert seen == pytest.approx(atleast)
    assert not obs[V2:][[0, 1, 2, 6, 7, 8]].any()  # the draft model's and the head's slots
    tr.update(RoundOutcome(13, 3, 3, 3, 4, 1.0, drafter="head"))  # nothing to propose here: no counterfactual
    after = tr.observation(start)
    assert (online(after, "cf_run", 1), online(after, "cf_atleast", 1)) == pytest.approx((run, atleast))
    assert online(after, "cf_seen", 1) == pytest.approx(0.7 * seen)
    tr.update(RoundOutcome(17, 3, 3, 3, 4, 1.0, drafter="head", counterfactual=(("ngram", 1),)))  # 1 of >= 4
    low = tr.observation(start)
    assert online(low, "cf_atleast", 1) == pytest.approx(0.7 * atleast)
    assert online(low, "cf_run", 1) == pytest.approx(0.7 * run + 0.3 / K_MAX)
    tr.update(RoundOutcome(18, 8, 8, 8, 9, 1.0, drafter="head", counterfactual=(("ngram", 9),)))
    assert 0.0 <= online(tr.observation(start), "cf_run", 1) <= 1.0  # a run past k_max is capped
    v2 = DrafterFeatureTracker(K_MAX, 2)
    v2.reset(None, ("draft", "ngram", "head"))
    v2.update(RoundOutcome(10, 3, 3, 1, 2, 1.0, drafter="head", counterfactual=(("ngram", 2),)))
    assert v2.observation(start).shape == (V2,)


def test_online_features_move_on_replay_where_the_head_plays(greedy):
    """On a replayed greedy request the head plays every round: prompt lookup's slot shows its runs (and where it
    reaches the round's tokens), the head's own and the draft model's slots stay at 0."""
    wl, prof = greedy
    twin = Twin([("head", 3)])
    drive_drafters(twin, TraceEngine(wl, prof, K_MAX).start(SHIPPED_REQUEST), wl.drafter_names)
    last = twin.rows[-1][1]
    assert online(last, "cf_seen", 1) > 0 and max(online(v3, "cf_run", 1) for _, v3 in twin.rows) > 0
    assert max(online(v3, "cf_atleast", 1) for _, v3 in twin.rows) > 0
    assert not any(v3[V2:][[0, 1, 2, 6, 7, 8]].any() for _, v3 in twin.rows)


def test_online_features_stay_neutral_on_a_sampled_request():
    """At T > 0 no round carries a counterfactual: every online feature stays at 0 whatever plays, while the version-2
    part moves."""
    wl, prof = cached_workload("smollm2-t07"), load_profile("cpu-smollm2")
    twin = Twin([("head", 3), ("ngram", 4), ("draft", 2), (NO_DRAFTER, 0)])
    drive_drafters(twin, TraceEngine(wl, prof, K_MAX).start(0), wl.drafter_names)
    assert len(twin.rows) > 10
    assert all(not v3[V2:].any() for _, v3 in twin.rows)
    assert len({v3[:V2].tobytes() for _, v3 in twin.rows}) > 1


def test_the_env_is_check_env_clean_and_observes_as_the_exported_controller(greedy):
    """specgym/SpecDecodeDrafter-v0 observes version 3 (checker clean), and a version-3 policy playing the env's
    observations sees, through drive_drafters, the same vector every round (one feature code)."""
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    wl, prof = greedy
    env = gym.make("specgym/SpecDecodeDrafter-v0", workload=wl, profile=prof, split="test", k_max=K_MAX).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (len(DRAFTER_FEATURE_NAMES),) and env.features == DRAFTER_FEATURE_NAMES
    ctrl = Recorder(random_artifact("drafter", k_max=K_MAX, seed=3), "random")
    obs, _ = env.reset(seed=0, options={"request": SHIPPED_REQUEST})
    seen, done = [obs], False
    while not done:
        obs, _, done, _, _ = env.step(ctrl.network.act(obs))
        assert env.observation_space.contains(obs)
        seen.append(obs)
    drive_drafters(ctrl, TraceEngine(wl, prof, K_MAX).start(SHIPPED_REQUEST), wl.drafter_names)
    assert len(ctrl.obs) == len(seen) - 1
    for a, b in zip(ctrl.obs, seen):
        assert a.tobytes() == b.tobytes()
    assert any(b[V2:].any() for b in seen)

"""Choosing the drafter each round (the ``drafter`` decision kind): exact replay, the clairvoyant choice, the rules,
the run predictor, the spec rows and the harness.

Every trace here is SYNTHETIC, written by the tests in SpecDecode-Bench's format (tests/specdecode_files.py) and
imported with the shipped importer; the last test reads the shared copy of the published files and skips when it is
absent."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from specdecode_files import shared_files, synthetic_file, two_drafter_file

from specgym.agents.specs import build, expand, resolve
from specgym.agents.traits import Traits
from specgym.baselines.drafter_fixed import FixedDrafter
from specgym.baselines.drafter_marginal import DrafterMarginal, fit_on_fit_split
from specgym.baselines.drafter_oracle import drafter_oracle_one, drafter_oracle_times
from specgym.baselines.lookup_rule import LookupRule
from specgym.envs.core.drafter_choice import NO_DRAFTER, DrafterController, DrafterDecision, drive_drafters
from specgym.envs.core.rounds import RoundStart
from specgym.envs.core.run_predictor import MAX_RUN, RunPredictor, bucket, recent_code
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.specdecode import import_file
from specgym.errors import SpecgymError
from specgym.eval.drafter_runner import ROUND_ORACLE, run_drafter_controller, run_drafter_oracle
from specgym.eval.harness import EvalConfig, evaluate

K_MAX = 12


@pytest.fixture(scope="module")
def wl(tmp_path_factory):
    """A SYNTHETIC two-drafter workload (EAGLE-like and n-gram-like runs), with repeats so lookups match."""
    return import_file(two_drafter_file(tmp_path_factory.mktemp("dc") / "combined_instructcoder.jsonl", 30)).workload


@pytest.fixture(scope="module")
def engine(wl):
    return TraceEngine(wl, k_max=K_MAX)


class Scripted(DrafterController):
    """Plays a random (drafter, K) each round and records what it saw."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.name = "scripted"
        self.log: list[tuple[RoundStart, DrafterDecision, object]] = []

    def propose(self, start):
        d = str(self.rng.choice([*self.drafters, NO_DRAFTER]))
        dec = DrafterDecision(d, int(self.rng.integers(0, self.ctx.k_max + 1)))
        self.log.append((start, dec, None))
        return dec

    def observe(self, outcome):
        start, dec, _ = self.log[-1]
        self.log[-1] = (start, dec, outcome)


def test_replay_is_exact_for_any_drafter_and_cap(wl, engine):
    """A round at g with drafter d and cap K produces min(run_d[g], K') + 1 tokens (K' = K clipped to the room, and
    0 for prompt lookup where the context has no earlier match: it has nothing to propose) and costs d's round time
    at the cache prompt_len + g; a plain step costs the same whatever the drafter."""
    assert wl.drafter_info("ngram")["kind"] == "lookup" and (wl.lookup_len == 0).any()
    nothing = 0
    for r in range(6):
        ctrl = Scripted(r)
        tot = drive_drafters(ctrl, engine.start(r), wl.drafter_names)
        sl = wl.span(r)
        n = sl.stop - sl.start
        assert tot.tokens == n
        for start, dec, o in ctrl.log:
            g = start.position
            assert start.kv == wl.prompt_len[r] + g and start.lookup_len == wl.lookup_len[sl][g]
            cap = 0 if dec.plain else min(dec.k, K_MAX, n - g - 1)
            d = wl.default_drafter if dec.plain else dec.drafter
            empty = d == "ngram" and wl.lookup_len[sl][g] == 0 and cap > 0
            if empty:  # nothing to propose: a plain step, as live
                cap, nothing = 0, nothing + 1
            acc = min(int(wl.runs[d][sl][g]), cap)
            assert (o.drafted, o.accepted, o.produced) == (cap, acc, acc + 1)
            want = wl.profile.round_time(o.drafted, wl.prompt_len[r] + g, d if o.drafted else None)
            assert o.time_ms == pytest.approx(want, rel=1e-12)
            assert o.drafter == (None if empty else d)
    assert nothing > 0


def test_fixed_drafter_vectorised_equals_the_round_loop(wl, engine):
    reqs = wl.split_indices("all")
    for d, k in (("ngram", 5), ("eagle", 3), ("ngram", K_MAX)):
        fast = run_drafter_controller(engine, reqs, FixedDrafter(d, k))
        slow = run_drafter_controller(engine, reqs, FixedDrafter(d, k), trace=[int(reqs[0])])
        np.testing.assert_allclose(fast.time_ms, slow.time_ms, rtol=1e-12)
        for f in ("tokens", "rounds", "drafted", "accepted"):
            np.testing.assert_array_equal(getattr(fast, f), getattr(slow, f))
    chain = evaluate(EvalConfig(wl, "fixed:4,fixed:4@eagle", split="all", k_max=K_MAX, bootstrap=0))
    times = {row["spec"]: row["total_time_ms"] for row in chain["rows"]}
    assert times["fixed:4"] == pytest.approx(times["fixed:4@eagle"], rel=1e-12)  # the default drafter's chain row


def test_oracle_matches_its_reference_and_beats_every_single_drafter_and_rule(wl, engine):
    reqs = wl.split_indices("all")
    oracle = run_drafter_oracle(engine, reqs)
    tables = [engine.table_for(d) for d in wl.drafter_names]
    for j, r in enumerate(reqs.tolist()[:8]):
        ref, plan = drafter_oracle_one([engine.request_runs(r, d) for d in wl.drafter_names], tables, K_MAX,
                                       float(wl.prompt_len[r]))
        assert oracle.time_ms[j] == pytest.approx(ref, rel=1e-9)
        assert oracle.rounds[j] == len(plan)
    rivals = [FixedDrafter(d, k) for d in wl.drafter_names for k in range(K_MAX + 1)]
    rivals += [*(LookupRule(n) for n in (1, 2, 3)), DrafterMarginal()]
    for ctrl in rivals:
        res = run_drafter_controller(engine, reqs, ctrl)
        assert (oracle.time_ms <= res.time_ms * (1 + 1e-9)).all(), ctrl.name
        np.testing.assert_array_equal(res.tokens, wl.lengths[reqs])
    assert oracle.time_ms.sum() < min(run_drafter_controller(engine, reqs, FixedDrafter(d, k)).time_ms.sum()
                                      for d in wl.drafter_names for k in range(K_MAX + 1))
    # the vectorised DP on all requests equals the per-request reference everywhere
    offsets = np.concatenate([[0], np.cumsum(wl.lengths)])
    times = drafter_oracle_times([engine.runs(d) for d in wl.drafter_names], tables, offsets, K_MAX, wl.prompt_len)
    np.testing.assert_allclose(times, oracle.time_ms, rtol=1e-12)


def test_lookup_rule_switches_on_the_match_length(wl, engine):
    ctrl = LookupRule(2, k_model=10)
    ctrl.reset(engine.context(0), wl.drafter_names)
    assert ctrl.propose(RoundStart(5, 50, 2)) == DrafterDecision("ngram", K_MAX)
    assert ctrl.propose(RoundStart(5, 50, 4)) == DrafterDecision("ngram", K_MAX)
    assert ctrl.propose(RoundStart(5, 50, 1)) == DrafterDecision("eagle", 10)
    assert ctrl.propose(RoundStart(5, 50, -1)) == DrafterDecision("eagle", 10)  # no token ids: the model drafter
    with pytest.raises(SpecgymError, match="1..4"):
        LookupRule(5)
    lonely = LookupRule(3)
    with pytest.raises(SpecgymError, match="does not hold"):
        lonely.reset(engine.context(0), ["eagle"])


def test_run_predictor_counts_survival_per_bucket():
    runs = {"a": np.array([0, 1, 2, 3, 0, 0]), "b": np.array([5, 5, 5, 5, 5, 5])}
    lookup = np.array([0, 0, 0, 0, 3, 3])
    pos = np.array([0, 0, 0, 0, 0, 0])
    pred = RunPredictor.fit(runs, lookup, pos)
    e = pred.expected_tokens("a", 0, 0)
    # bucket (0, 0): runs 0,1,2,3 -> P(>=1)=3/4, P(>=2)=2/4, P(>=3)=1/4, shrunk to the pooled 3/6, 2/6, 1/6
    w = 20.0
    s1 = (3 + w * 3 / 6) / (4 + w)
    assert e[0] == 1.0 and e[1] == pytest.approx(1 + s1)
    assert pred.expected_tokens("b", 3, 0)[MAX_RUN] == pytest.approx(6.0)  # runs 5 everywhere: min(5, K) + 1
    assert bucket(3, 0) != bucket(0, 0) and bucket(-1, 100) != bucket(4, 100)
    back = RunPredictor.from_dict(pred.to_dict())
    np.testing.assert_allclose(back.expected["a"], pred.expected["a"], atol=1e-6)
    with pytest.raises(SpecgymError, match="format"):
        RunPredictor.from_dict({"format": "x"})
    with pytest.raises(SpecgymError, match="not 'c'"):
        pred.expected_tokens("c", 0, 0)


def test_marginal_fits_on_the_train_split_and_prefers_the_better_drafter(wl):
    pred = fit_on_fit_split(wl, wl.profile)
    assert pred.meta["split"] == "train" and pred.meta["positions"] == int(wl.lengths[wl.split_indices("train")].sum())
    assert 0 < pred.meta["rounds"] < pred.meta["positions"]  # the rollout's round starts
    # a predictor that says n-gram rounds accept everything: the rule drafts n-gram at the largest cap
    sure = RunPredictor(("eagle", "ngram"), {"eagle": np.ones_like(pred.expected["eagle"]),
                                             "ngram": np.tile(np.arange(1, MAX_RUN + 2, dtype=float),
                                                              (len(pred.expected["eagle"]), 1))})
    ctrl = DrafterMarginal(sure)
    ctrl.reset(TraceEngine(wl, k_max=K_MAX).context(0), wl.drafter_names)
    assert ctrl.propose(RoundStart(3, 40, 0)) == DrafterDecision("ngram", K_MAX)
    never = RunPredictor(("eagle", "ngram"), {d: np.ones_like(pred.expected["eagle"]) for d in ("eagle", "ngram")})
    ctrl = DrafterMarginal(never)
    ctrl.reset(TraceEngine(wl, k_max=K_MAX).context(0), wl.drafter_names)
    assert ctrl.propose(RoundStart(3, 40, 0)) == DrafterDecision(NO_DRAFTER, 0)  # nothing pays: a plain step


def _round_reference(runs: list[np.ndarray], tables, kv0: float) -> tuple[float, int]:
    """Plain Python: each round plays the (drafter, K) of its own best rate; the request's time and rounds."""
    n, i, spent, rounds = len(runs[0]), 0, 0.0, 0
    while i < n:
        best, arg = 1.0 / float(tables[0].base[0] + tables[0].per_kv[0] * (kv0 + i)), (0, 0)
        for d, (run, t) in enumerate(zip(runs, tables)):
            for k in range(1, min(K_MAX, n - i - 1) + 1):
                rate = (min(int(run[i]), k) + 1) / float(t.base[k] + t.per_kv[k] * (kv0 + i))
                if rate > best:
                    best, arg = rate, (d, k)
        d, k = arg
        spent += float(tables[d].base[k] + tables[d].per_kv[k] * (kv0 + i))
        i += (min(int(runs[d][i]), k) if k else 0) + 1
        rounds += 1
    return spent, rounds


def test_round_oracle_matches_its_reference_and_the_plan_bounds_it(wl, engine):
    reqs = wl.split_indices("all")
    per_round = run_drafter_oracle(engine, reqs, ROUND_ORACLE)
    plan = run_drafter_oracle(engine, reqs)
    tables = [engine.table_for(d) for d in wl.drafter_names]
    for j, r in enumerate(reqs.tolist()[:8]):
        ref, rounds = _round_reference([engine.request_runs(r, d) for d in wl.drafter_names], tables,
                                       float(wl.prompt_len[r]))
        assert per_round.time_ms[j] == pytest.approx(ref, rel=1e-9) and per_round.rounds[j] == rounds
    assert (plan.time_ms <= per_round.time_ms * (1 + 1e-9)).all()  # planning where rounds start never loses
    assert plan.time_ms.sum() < per_round.time_ms.sum()  # and on per-start runs it gains
    np.testing.assert_array_equal(per_round.tokens, wl.lengths[reqs])


def test_spec_rows_and_all(wl, tmp_path):
    assert build("fixed:10@ngram", K_MAX).kind == "drafter" and build("fixed:10", K_MAX).kind == "chain"
    assert build("lookup-rule:2", K_MAX).controller.n == 2
    assert build("drafter-oracle", K_MAX).controller is None and build("round-oracle", K_MAX).family == "oracle"
    for bad, why in (("fixed:x@ngram", "K@DRAFTER"), ("fixed:40@ngram", "K@DRAFTER"), ("lookup-rule:z", "1..4"),
                     ("drafter-marginal:3", "no such run predictor file")):
        with pytest.raises(SpecgymError, match=why):
            build(bad, K_MAX)
    specs, _ = expand("all", K_MAX, Traits.of(wl))
    assert {"lookup-rule:3", "drafter-marginal", "drafter-oracle", "round-oracle", f"fixed:{K_MAX}@ngram"} <= set(
        specs)
    assert "fixed:1@eagle" not in specs  # the default drafter's fixed K are the chain rows
    one = import_file(synthetic_file(tmp_path / "combined_gsm8k.jsonl", n=6), drafters=("eagle",)).workload
    specs, notes = expand("all", K_MAX, Traits.of(one))
    assert not any("@" in s or s.startswith(("lookup-rule", "drafter-")) for s in specs)
    with pytest.raises(SpecgymError, match="no drafter 'ngram'"):
        run_drafter_controller(TraceEngine(one, k_max=K_MAX), one.split_indices("all"),
                               resolve("fixed:3@ngram", K_MAX).rows[0].controller)


def test_harness_reports_the_best_single_drafter(wl):
    rep = evaluate(EvalConfig(wl, "all", split="all", k_max=K_MAX, bootstrap=200))
    best = rep["best_single_drafter"]
    assert best is not None and best.startswith("fixed:")
    rows = {row["spec"]: row for row in rep["rows"]}
    assert rows[best]["speedup_vs_best_single_drafter"] == pytest.approx(1.0)
    assert rows["drafter-oracle"]["speedup_vs_best_single_drafter"] > 1.0
    assert rows["drafter-oracle"]["family"] == "oracle" and rows["lookup-rule:3"]["kind"] == "drafter"
    assert "speedup_vs_best_single_drafter" in rows["lookup-rule:3"]["ci95"]
    for row in rows.values():
        if row["kind"] == "drafter" or row["family"] == "fixed":
            assert row["speedup_vs_best_single_drafter"] <= rows["drafter-oracle"]["speedup_vs_best_single_drafter"]


@pytest.mark.skipif(not shared_files(), reason="the shared copy of SpecDecode-Bench is absent")
def test_published_instructcoder_choice_beats_the_best_single_drafter(tmp_path):
    """A replay of published data (not a live run): on InstructCoder's test split, the lookup rule and the marginal
    rule beat the best single drafter at its best fixed K, and the clairvoyant choice bounds them."""
    path = next(p for p in shared_files() if "instructcoder" in p.name)
    wl = import_file(path).workload
    rep = evaluate(EvalConfig(wl, "all", k_max=16, profile="h100-llama31-8b", bootstrap=0))
    rows = {row["spec"]: row["speedup_vs_best_single_drafter"] for row in rep["rows"]}
    assert rows["lookup-rule:3"] > 1.2 and rows["drafter-marginal"] > 1.2
    assert rows["drafter-oracle"] >= max(rows.values()) - 1e-9


def test_run_predictor_recent_round_estimate():
    """Rollout rounds after an all-accepted round of drafter 0 say longer runs; other codes read the coarse one."""
    runs = {"a": np.array([1, 1, 1, 1])}
    pos, lookup = np.zeros(4, np.int64), np.zeros(4, np.int64)
    hot = recent_code(0, 3, 3)
    rounds = ({"a": np.full(50, 6)}, np.zeros(50, np.int64), np.zeros(50, np.int64), np.full(50, hot))
    pred = RunPredictor.fit(runs, lookup, pos, rounds=rounds)
    assert pred.expected_tokens("a", 0, 0, hot)[6] > 5.0
    assert pred.expected_tokens("a", 0, 0, 0)[6] == pytest.approx(2.0)
    assert recent_code(0, 0, 0) == 0 and recent_code(1, 4, 0) != recent_code(1, 4, 2) != recent_code(1, 4, 4)


@pytest.mark.parametrize("env_id", ["specgym/SpecDecode-v1", "specgym/SpecDecodeToken-v1"])
def test_chain_envs_refuse_a_trace_without_draft_signals_at_once(wl, env_id):
    """K and token observations read the draft's confidence: on published per-start runs they would be NaN, so the
    env refuses before the first step, naming the workload and the mode that can train on it."""
    import gymnasium as gym

    with pytest.raises(SpecgymError, match=f"workload '{wl.name}' has no draft confidence.*--mode drafter"):
        gym.make(env_id, config={"workload": wl, "profile": "h100-llama31-8b", "k_max": K_MAX})


def test_env_is_check_env_clean_and_replays_as_the_harness(wl, tmp_path):
    """The registered env passes Gymnasium's checker, and a scripted action sequence in the env costs what the same
    decisions cost through drive_drafters (one protocol)."""
    import warnings

    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from specgym.envs.core.drafter_features import DRAFTER_FEATURE_NAMES, action_of, decision_of, n_actions

    env = gym.make("specgym/SpecDecodeDrafter-v0", workload=wl, split="all", k_max=K_MAX).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)
    assert env.action_space.n == n_actions(K_MAX) and env.observation_space.shape == (len(DRAFTER_FEATURE_NAMES),)
    used = 1 + len(wl.drafter_names) * K_MAX  # the actions of the slots this workload fills
    for a in range(n_actions(K_MAX)):
        dec = decision_of(a, wl.drafter_names, K_MAX)
        assert action_of(dec, wl.drafter_names, K_MAX) == (a if a < used else 0)  # an empty slot: a plain step
        assert dec.plain == (a == 0 or a >= used)
    rng = np.random.default_rng(0)
    for r in (0, 3):
        obs, _ = env.reset(seed=1, options={"request": r})
        actions, time_ms, done = [], 0.0, False
        while not done:
            assert env.observation_space.contains(obs)
            actions.append(int(rng.integers(n_actions(K_MAX))))
            obs, _, done, _, info = env.step(actions[-1])
            time_ms += info["time_ms"]

        class Replay(DrafterController):
            name = "replay"

            def __init__(self):
                self.i = 0

            def propose(self, start):
                self.i += 1
                return decision_of(actions[self.i - 1], self.drafters, K_MAX)

        tot = drive_drafters(Replay(), TraceEngine(wl, k_max=K_MAX).start(r), wl.drafter_names)
        assert tot.time_ms == pytest.approx(time_ms, rel=1e-12) and tot.rounds == len(actions)
    one = import_file(synthetic_file(tmp_path / "combined_gsm8k.jsonl", n=4), drafters=("eagle",)).workload
    with pytest.raises(SpecgymError, match="needs two"):
        gym.make("specgym/SpecDecodeDrafter-v0", workload=one, split="all")


@pytest.mark.slow
def test_train_export_and_run_a_drafter_policy(wl, tmp_path):
    """PPO in drafter mode (behaviour-cloned from the marginal rule) trains, exports, and the exported policy runs
    in the harness as a drafter row, deciding as the env's observations say (the same feature code)."""
    from specgym.agents.artifact import load_policy
    from specgym.agents.drafter_policy import DrafterPolicyController
    from specgym.envs.gym.drafter_env import SpecDecodeDrafterEnv
    from specgym.envs.workloads.trace_format import save_workload
    from specgym.training.export import export_run
    from specgym.training.ppo import TrainRequest, train

    path = save_workload(wl, tmp_path / "w.parquet")
    tiny = {"n_envs": 2, "n_steps": 256, "batch_size": 128, "n_epochs": 2, "eval_freq": 0, "k_max": K_MAX,
            "bc_init": "drafter-marginal"}
    train(TrainRequest(workload=str(path), mode="drafter", out=tmp_path / "run", timesteps=1024, seed=0,
                       overrides=tiny, quiet=True))
    out = export_run(tmp_path / "run", tmp_path / "policy", force=True)  # a tiny run, maybe below its teacher
    art = load_policy(out)
    assert art.mode == "drafter"
    rep = evaluate(EvalConfig(str(path), f"ppo:{out},lookup-rule:3", split="all", k_max=K_MAX, bootstrap=0))
    rows = {row["spec"]: row for row in rep["rows"]}
    assert rows[f"ppo:{out}"]["kind"] == "drafter" and rows[f"ppo:{out}"]["family"] == "learned"
    assert art.teacher == "drafter-marginal" and art.obs_low is not None  # exported with its guard
    ctrl = DrafterPolicyController(dataclasses.replace(art, obs_low=None, obs_high=None, teacher=None), "p")
    env = SpecDecodeDrafterEnv(workload=wl, split="all", k_max=K_MAX)
    obs, _ = env.reset(options={"request": 2})
    env_time, done = 0.0, False
    while not done:
        obs, _, done, _, info = env.step(ctrl.network.act(obs))
        env_time += info["time_ms"]
    tot = drive_drafters(ctrl, TraceEngine(wl, k_max=K_MAX).start(2), wl.drafter_names)
    assert tot.time_ms == pytest.approx(env_time, rel=1e-12)


def test_a_guarded_drafter_policy_hands_rounds_outside_its_range_to_drafter_marginal(wl):
    """Outside the range it saw in training, every round is its teacher's: a range no observation fits makes the
    policy play drafter-marginal exactly; the range it was trained on hands over nothing on its own requests."""
    from specgym.agents.artifact import PolicyArtifact
    from specgym.agents.drafter_policy import DrafterPolicyController
    from specgym.baselines.drafter_marginal import DrafterMarginal
    from specgym.envs.core.drafter_features import DRAFTER_FEATURE_NAMES, DRAFTER_FEATURE_VERSION, n_actions

    n, rng = len(DRAFTER_FEATURE_NAMES), np.random.default_rng(0)
    weights = [rng.normal(size=(8, n)).astype(np.float32), rng.normal(size=(n_actions(K_MAX), 8)).astype(np.float32)]
    biases = [np.zeros(8, np.float32), np.zeros(n_actions(K_MAX), np.float32)]

    def policy(low: float, high: float, teacher: str | None = "drafter-marginal") -> DrafterPolicyController:
        art = PolicyArtifact(mode="drafter", k_min=0, k_max=K_MAX, weights=weights, biases=biases,
                             activation="tanh", feature_version=DRAFTER_FEATURE_VERSION,
                             features=list(DRAFTER_FEATURE_NAMES), obs_low=np.full(n, low), obs_high=np.full(n, high),
                             teacher=teacher)
        ctrl = DrafterPolicyController(art, "guarded")
        ctrl.prepare(wl, wl.profile)
        return ctrl

    engine = TraceEngine(wl, k_max=K_MAX)
    rule = DrafterMarginal()
    rule.prepare(wl, wl.profile)
    nowhere, everywhere = policy(5.0, 6.0), policy(-1.0, 2.0)
    for r in range(4):
        want = drive_drafters(rule, engine.start(r), wl.drafter_names)
        got = drive_drafters(nowhere, engine.start(r), wl.drafter_names)
        assert got.time_ms == want.time_ms and got.tokens == want.tokens
        drive_drafters(everywhere, engine.start(r), wl.drafter_names)
    assert nowhere.guard_stats()["share"] == 1.0 and nowhere.guard_stats()["teacher"] == "drafter-marginal"
    assert everywhere.guard_stats()["handed"] == 0
    with pytest.raises(SpecgymError, match="teacher 'marginal' cannot decide for a drafter-mode policy"):
        policy(0.0, 1.0, teacher="marginal")


def test_predictor_train_runs_cli_and_the_file_spec(wl, tmp_path):
    from specgym.cli import main
    from specgym.envs.core.run_predictor import load_run_predictor
    from specgym.envs.workloads.trace_format import save_workload

    path = save_workload(wl, tmp_path / "w.parquet")
    out = tmp_path / "runs.json"
    assert main(["predictor", "train-runs", "--workload", str(path), "--out", str(out)]) == 0
    pred = load_run_predictor(out)
    assert pred.drafters == ("eagle", "ngram") and pred.meta["split"] == "train"
    assert main(["predictor", "train-runs", "--workload", str(path), "--out", str(out)]) != 0  # no silent overwrite
    rep = evaluate(EvalConfig(wl, f"drafter-marginal:{out},drafter-marginal", split="test", k_max=K_MAX,
                              bootstrap=0))
    times = [row["total_time_ms"] for row in rep["rows"] if row["kind"] == "drafter"]
    assert times[0] == pytest.approx(times[1], rel=1e-4)  # the file is the fit the rule makes itself
    (tmp_path / "bad.json").write_text('{"format": "specgym-run-predictor", "drafters": []}')
    with pytest.raises(SpecgymError, match="bad.json"):
        build(f"drafter-marginal:{tmp_path / 'bad.json'}", K_MAX)


def test_a_drafter_mode_artifact_is_a_drafter_row(wl, tmp_path):
    """``ppo:DIR`` of a drafter-mode policy builds the exported controller as a drafter row, and it runs in the
    harness (a random policy: the protocol, not its quality)."""
    from specgym.agents.artifact import random_artifact, write_artifact
    from specgym.agents.drafter_policy import DrafterPolicyController

    write_artifact(random_artifact("drafter", k_max=K_MAX), tmp_path / "pol")
    row = build(f"ppo:{tmp_path / 'pol'}", K_MAX)
    assert row.kind == "drafter" and row.family == "learned" and isinstance(row.controller, DrafterPolicyController)
    res = run_drafter_controller(TraceEngine(wl, k_max=K_MAX), wl.split_indices("all"), row.controller)
    np.testing.assert_array_equal(res.tokens, wl.lengths)
    with pytest.raises(SpecgymError, match="k_max"):
        run_drafter_controller(TraceEngine(wl, k_max=4), wl.split_indices("all")[:1], row.controller)


def test_the_drafter_modes_action_labels_name_every_action_the_policy_decodes():
    """``policy.json``'s action labels (``agents/modes.py``) and ``decision_of`` agree on every index: one label per
    action, slot and K as decoded (the labels once assumed two slots)."""
    from specgym.agents.modes import ACTIONS
    from specgym.envs.core.drafter_features import SLOTS, decision_of, n_actions

    drafters = [f"d{s}" for s in range(SLOTS)]
    for k_max in (4, 8):
        labels = ACTIONS["drafter_cap"].values(1, n_actions(k_max), None)
        assert len(labels) == n_actions(k_max) and labels[0] == "plain"
        for a, label in enumerate(labels[1:], start=1):
            dec = decision_of(a, drafters, k_max)
            assert label == f"slot{drafters.index(dec.drafter)}:{dec.k}"

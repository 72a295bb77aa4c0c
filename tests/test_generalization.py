"""Cost-aware generalisation: the marginal rule, the domain-randomised distribution, behaviour cloning on it, the
generalist training run and the held-out suite."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specgym.envs.core.cost import CostProfile
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.domains import (
    Cell,
    DomainDistribution,
    ProfileRanges,
    suite_cells,
    synthetic_pool,
)
from specgym.envs.workloads.synthetic import generate_workload
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate


def _profile(ratio: float, slope: float, overhead: float, t: float = 10.0, k_max: int = 8) -> CostProfile:
    return CostProfile("test", ratio * t, tuple(t * (1 + slope * n) for n in range(k_max + 1)), overhead * t,
                       source="synthetic")


def _tok_s(wl, specs: str, profile: CostProfile, split: str = "all") -> dict[str, float]:
    rep = evaluate(EvalConfig(workload=wl, controllers=specs, split=split, profile=profile, bootstrap=0))
    return {r["spec"]: r["throughput_tok_s"] for r in rep["rows"]}


@pytest.fixture(scope="module")
def mix():
    return generate_workload("speclane-mix", 120, seed=5)


def test_marginal_reads_the_cost_profile(mix):
    """Where a draft token costs as much as a target step it never drafts (= plain decoding); on near-flat
    verification with a cheap draft it drafts and beats plain decoding."""
    dear = _tok_s(mix, "marginal,fixed:0", _profile(ratio=1.0, slope=0.5, overhead=0.2))
    assert dear["marginal"] == pytest.approx(dear["fixed:0"], rel=1e-9)
    cheap = _tok_s(mix, "marginal,fixed:0", _profile(ratio=0.02, slope=0.0, overhead=0.0))
    assert cheap["marginal"] > 1.5 * cheap["fixed:0"]


@pytest.mark.parametrize("profile", [(0.05, 0.02, 0.02), (0.2, 0.1, 0.05)])
def test_marginal_is_at_least_as_good_as_the_best_fixed_k(mix, profile):
    specs = "marginal," + ",".join(f"fixed:{k}" for k in range(9))
    tps = _tok_s(mix, specs, _profile(*profile))
    best_fixed = max(v for k, v in tps.items() if k.startswith("fixed:"))
    assert tps["marginal"] >= 0.99 * best_fixed


def test_marginal_calibrates_a_mis_calibrated_draft_online():
    """An over-confident draft (confidence well above acceptance) fools a fixed confidence threshold; marginal's
    online calibration reads the judged tokens and stays close to the best fixed K."""
    from specgym.envs.workloads.synthetic import CategorySpec, SyntheticSpec

    spec = SyntheticSpec(categories=(CategorySpec("c", 1.0, 0.45, 0.05),), conf_scale=0.5, conf_shift=1.5,
                         min_len=150, max_len=250, greedy=True)
    wl = generate_workload(spec, 80, seed=3, name="overconfident")
    prof = _profile(0.1, 0.05, 0.03)
    tps = _tok_s(wl, "marginal,confidence:0.4," + ",".join(f"fixed:{k}" for k in range(9)), prof)
    best_fixed = max(v for k, v in tps.items() if k.startswith("fixed:"))
    assert tps["marginal"] >= 0.98 * best_fixed
    assert tps["marginal"] > tps["confidence:0.4"]


def test_profile_ranges_sample_inside_their_bounds():
    rng = np.random.default_rng(0)
    r = ProfileRanges()
    for _ in range(200):
        p = r.sample(rng)
        t = p.verify_ms[0]
        assert r.cost_ratio[0] <= p.draft_ms / t <= r.cost_ratio[1]
        assert r.verify_slope[0] <= p.verify_ms[1] / t - 1 <= r.verify_slope[1]
        assert r.overhead[0] <= p.round_overhead_ms / t <= r.overhead[1]
        assert p.source == "synthetic"


def test_synthetic_pool_is_labelled_and_mis_calibrated_both_ways():
    pool = synthetic_pool(n=9, requests=10, seed=1)
    assert all(wl.is_synthetic for wl in pool)
    gaps = []
    for wl in pool:
        gaps.append(float(np.mean(wl.draft_conf) - np.mean(wl.p_accept)))
    assert min(gaps) < -0.05 and max(gaps) > 0.05  # under- and over-confident drafts


def test_domain_distribution_draws_workloads_and_profiles(mix):
    other = generate_workload("assc-regimes", 20, seed=1)
    dist = DomainDistribution([mix, other], weights=[1.0, 3.0], own_profile_share=0.0)
    rng = np.random.default_rng(0)
    draws = [dist.sample(rng) for _ in range(400)]
    share = np.mean([wl is other for wl, _ in draws])
    assert 0.68 < share < 0.82
    assert len({p.draft_ms for _, p in draws}) > 300
    assert json.dumps(dist.describe())
    with pytest.raises(SpecgymError, match="weights"):
        DomainDistribution([mix], weights=[1.0, 2.0])
    with pytest.raises(SpecgymError, match="at least one"):
        DomainDistribution([])


def test_token_env_on_domains_draws_a_profile_per_episode(mix):
    import gymnasium as gym

    dist = DomainDistribution([mix], own_profile_share=0.0)
    env = gym.make("specgym/SpecDecodeToken-v1", domains=dist, split="train")
    costs = set()
    for s in range(5):
        env.reset(seed=s)
        costs.add(round(env.unwrapped.engine.profile.draft_ms, 9))
    assert len(costs) == 5
    with pytest.raises(SpecgymError):
        env.reset(options={"request": 0})


def test_bc_on_domains_clones_marginal(mix):
    from specgym.training.bc_init import demonstrations

    dist = DomainDistribution([mix], own_profile_share=0.0)
    obs, labels = demonstrations("marginal", dist, "token", 0, 8, passes=1, domain_episodes=20)
    assert obs.ndim == 2 and len(obs) == len(labels) > 500
    assert 0.05 < labels.mean() < 0.95  # both decisions occur across randomised profiles


def test_suite_cells_hold_out_a_recorded_workload_and_unseen_profiles():
    from specgym.envs.workloads.domains import HELD_OUT_RECORDED, SUITE_PROFILES, TRAIN_RECORDED

    cells = suite_cells()
    assert cells
    assert not set(HELD_OUT_RECORDED) & set(TRAIN_RECORDED)
    assert {c.profile for c in cells} <= set(SUITE_PROFILES)
    assert any(c.workload in HELD_OUT_RECORDED and c.split == "all" for c in cells)
    assert all(c.split == "test" for c in cells if c.workload in TRAIN_RECORDED)


def test_suite_report_compares_with_the_best_baseline_in_hindsight():
    """A baseline evaluated as a 'policy' is never above the best baseline in hindsight, and its intervals hold
    the point estimate."""
    from specgym.eval.suite import markdown, run_suite

    cells = [Cell("speclane-mix@777000", "speclane-table", "all")]
    rep = run_suite(["confidence:0.4"], cells=cells, bootstrap=200)
    p = rep["cells"][0]["policies"]["confidence:0.4"]
    assert p["vs_best_baseline"] <= 1.0 + 1e-12
    lo, hi = p["vs_best_baseline_ci95"]
    assert lo <= p["vs_best_baseline"] <= hi
    assert 0 < p["oracle_ratio"] <= 1.0
    cell = rep["cells"][0]
    assert cell["informed_oracle_tok_s"] == pytest.approx(cell["oracle_tok_s"])  # a greedy workload: they coincide
    assert p["informed_ratio"] == pytest.approx(p["oracle_ratio"])
    assert "mean_headroom_closed_informed" in rep["summary"]["confidence:0.4"]
    assert "headroom closed (informed)" in markdown(rep)
    assert not math.isnan(rep["summary"]["confidence:0.4"]["geomean_vs_marginal"])
    assert "confidence:0.4" in markdown(rep) and "(synthetic)" in markdown(rep)
    assert load_profile("speclane-table")


@pytest.mark.slow
def test_generalist_training_run(tmp_path):
    """``specgym train --domains generalist`` trains on the randomised distribution and validates on its cells
    against marginal (tiny budget)."""
    from specgym.cli import main

    run = tmp_path / "gen"
    assert main(["train", "--domains", "generalist", "--mode", "token", "--timesteps", "2048", "--out", str(run),
                 "--hyperparams", "n_envs=2", "n_steps=256", "batch_size=128", "eval_freq=2048",
                 "eval_max_requests=3"]) == 0
    state = json.loads((run / "state.json").read_text())
    assert state["timesteps_done"] == 2048
    assert "speedup_vs_marginal" in state["val_history"][-1]


@pytest.mark.slow
def test_policy_card_ships_the_best_seed_on_validation(tmp_path):
    """Two seeds -> the one better on validation is shipped (the suite never picks it); the card reports both seeds
    and the suite's mean and spread; an existing policy folder is refused without --force."""
    from specgym.commands.policy_card import main as card_main
    from specgym.eval.suite import run_suite
    from specgym.training.export import export_run
    from specgym.training.ppo import TrainRequest, train

    runs = []
    for seed in (0, 1):
        run = tmp_path / f"s{seed}"
        train(TrainRequest(workload="assc-regimes", mode="k", out=run, timesteps=2048, seed=seed, quiet=True,
                           overrides={"n_envs": 2, "n_steps": 256, "batch_size": 128, "eval_freq": 2048,
                                      "eval_max_requests": 10}))
        export_run(run, run / "policy", force=True)  # a tiny run: its verdict is not the point
        runs.append(run)
    specs = [f"ppo:{r / 'policy'}" for r in runs]
    suite = run_suite(specs, cells=[Cell("speclane-mix@777000", "speclane-table", "all")], bootstrap=100,
                      max_requests=20)
    (tmp_path / "suite.json").write_text(json.dumps(suite, default=float))
    scores = [json.loads((r / "state.json").read_text())["best"]["speedup_vs_best_fixed"] for r in runs]
    best = runs[int(np.argmax(scores))]
    dest = tmp_path / "policies" / "mine"
    argv = [str(dest), "--runs", ",".join(map(str, runs)), "--suite", str(tmp_path / "suite.json"),
            "--suite-specs", ",".join(specs)]
    assert card_main(argv) == 0
    assert (dest / "policy.npz").read_bytes() == (best / "policy" / "policy.npz").read_bytes()
    card = (dest / "README.md").read_text()
    assert card.count("**(shipped)**") == 1 and f"**(shipped)** | {best.name} |" in card
    assert "**(shipped)**" in card and "± " in card and "speclane-mix@777000" in card
    assert card_main(argv) == 2  # refused: exists
    assert card_main([*argv, "--force"]) == 0


def test_a_shipped_card_says_at_the_top_what_its_export_warned_of():
    """A policy exported with --force below its teacher or its fixed reference carries the warning in policy.json;
    its card says so in a Status section before anything else (and a card without a warning has none)."""
    import specgym.catalogue as catalogue
    from specgym.agents.artifact import list_policies
    from specgym.training.policy_card import _warning_section

    assert _warning_section({}) == []
    assert _warning_section({"warning": "r is BELOW its teacher t (0.9x)"})[0].startswith("## Status")
    seen = 0
    for name in list_policies():
        folder = catalogue.resolve("policy", name)
        meta = json.loads((folder / "policy.json").read_text())
        card = (folder / "README.md").read_text()
        assert ("## Status" in card) == bool(meta.get("warning")), name
        seen += bool(meta.get("warning"))
    assert seen >= 1  # smollm2-drafter: below drafter-marginal on val (0.990x), shipped as the learned row

"""Serving at concurrency: batched profiles, the batched replay engine, batch controllers, the vLLM tuner, the
batched environment."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specgym.agents.specs import make
from specgym.baselines.batch_rules import BatchSizeTable, GoodputRule
from specgym.envs.core.batch_cost import BatchCostProfile, Roofline, roofline_profile
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.envs.profiles import load_batch_profile
from specgym.errors import SpecgymError

A100 = roofline_profile("a100", Roofline(6.7e9, 6.8e7, bandwidth_gb_s=2039, peak_tflops=312), 512, 8)


def test_roofline_is_memory_bound_then_compute_bound():
    flat = A100.verify(1, 9) / A100.verify(1, 1)
    steep = A100.verify(256, 9) / A100.verify(256, 1)
    assert flat < 1.01 and steep > 5  # 9 tokens cost one at batch 1, ~9x at batch 256
    assert A100.step_time(1, 0) == A100.verify(1, 1)


@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_concurrency_one_equals_the_single_request_engine(mix_workload, k):
    req = np.arange(40)
    br = BatchReplay(mix_workload, A100, 1, requests=req, seed=5)
    br.run_fixed(k)
    v = VectorReplay(TraceEngine(mix_workload, A100.at(1), 8, seed=5), req)
    v.run_fixed(k)
    assert br.tokens == int((v.pos - v.start).sum())
    assert br.now_ms == pytest.approx(float(v.time_ms.sum()), rel=1e-12)


def test_closed_and_open_loop_serve_every_request(mix_workload):
    closed = BatchReplay(mix_workload, A100, [(50.0, 4), (50.0, 32)], requests=np.arange(120), seed=1)
    closed.run_fixed(2)
    assert closed.done and np.isfinite(closed.tpot_ms()).all() and closed.tokens == mix_workload.lengths[:120].sum()
    opened = BatchReplay(mix_workload, A100, 64, arrival_rate=50.0, requests=np.arange(60), seed=1)
    opened.run_fixed(2)
    assert opened.done and (opened.admit_ms >= opened.arrival_ms - 1e-9).all()
    assert opened.goodput(1e9) == pytest.approx(opened.throughput()) and opened.goodput(0.0) == 0.0


def test_batch_controllers(mix_workload, tmp_path):
    table = BatchSizeTable.parse("[[1, 8, 4], [9, 64, 1]]")
    # the JSON `specgym tune vllm --out` writes is a table file too
    (tmp_path / "tuned.json").write_text(json.dumps({"workload": "w", "table": [[1, 8, 4], [9, 64, 1]]}))
    assert BatchSizeTable.parse(str(tmp_path / "tuned.json"))._k.tolist() == table._k.tolist()
    from specgym.envs.core.batch import BatchState

    st = lambda b: BatchState(b, 0, b, np.arange(b), np.arange(0))  # noqa: E731
    assert [table.propose(st(b)) for b in (1, 8, 9, 64, 65)] == [4, 4, 1, 1, 0]
    g = GoodputRule()
    g.reset(A100, 8)
    assert g.propose(st(1)) >= 3 and g.propose(st(512)) == 0  # speculate when memory-bound, not when compute-bound
    for spec in ("static:2", "goodput", "per-seq:assc", "table:[[1,512,2]]"):
        sim = BatchReplay(mix_workload, A100, 16, requests=np.arange(48), seed=0)
        sim.run(make(spec, kinds=("batch",)))
        assert sim.done and sim.tokens == mix_workload.lengths[:48].sum(), spec
    with pytest.raises(SpecgymError, match="token-level"):
        BatchReplay(mix_workload, A100, 4, requests=np.arange(8)).run(make("per-seq:confidence", kinds=("batch",)))
    with pytest.raises(SpecgymError, match="static needs"):
        make("static:99", kinds=("batch",))


def test_vllm_table_beats_every_static_k_at_every_concurrency(mix_workload, capsys):
    from specgym.eval.tune import tune_vllm

    res = tune_vllm(mix_workload, A100, max_batch=128, check_batches=(4,))
    assert res["no_worse_than_static_everywhere"]
    ks = [row[2] for row in res["table"]]
    assert ks[0] >= 2 and ks[-1] <= 1 and res["table"][0][0] == 1 and res["table"][-1][1] == 128
    assert all(a[1] + 1 == b[0] for a, b in zip(res["table"], res["table"][1:]))  # contiguous ranges
    frag = json.loads("{" + res["vllm_fragment"] + "}")["num_speculative_tokens_per_batch_size"]
    assert frag == res["table"]
    c = res["checks"][0]
    assert 0.85 < c["simulated_tok_s"] / c["predicted_tok_s"] < 1.1


def test_batch_profile_files_round_trip_and_errors(tmp_path):
    from specgym.envs.core.batch_cost import save_batch_profile

    save_batch_profile(A100, tmp_path / "p.json")
    back = load_batch_profile(tmp_path / "p.json")
    assert back.verify(100, 3) == pytest.approx(A100.verify(100, 3))
    bad = json.loads((tmp_path / "p.json").read_text())
    bad["batch_sizes"] = [4, 2] + bad["batch_sizes"][2:]
    (tmp_path / "b.json").write_text(json.dumps(bad))
    with pytest.raises(SpecgymError, match="b.json: .*increasing"):
        load_batch_profile(tmp_path / "b.json")
    with pytest.raises(SpecgymError, match="not a batched cost profile"):
        (tmp_path / "s.json").write_text(json.dumps({"name": "x", "draft_ms": 1, "verify_ms": [1, 2]}))
        load_batch_profile(tmp_path / "s.json")
    assert isinstance(load_batch_profile("batch-a100-7b-roofline"), BatchCostProfile)


def test_batch_env_and_batch_policy(mix_workload):
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    import specgym  # noqa: F401
    from specgym.agents.artifact import random_artifact
    from specgym.agents.batch_policy import BatchPolicyController

    env = gym.make("specgym/SpecDecodeBatch-v0", workload=mix_workload, batch_profile=A100, requests=24,
                   max_batch=32)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        obs, r, done, _, info = env.step(0)
        total += r
    assert total == pytest.approx(0.0, abs=1e-9)  # plain decoding gains nothing over plain decoding
    policy = BatchPolicyController(random_artifact("batch"))
    sim = BatchReplay(mix_workload, A100, 8, requests=np.arange(16))
    sim.run(policy)
    assert sim.done


@pytest.mark.slow
def test_train_batch_mode_export_and_compare(tmp_path, capsys):
    """``specgym train --mode batch`` trains on the batched env, validates against goodput and the best static K,
    exports a batch policy that ``specgym tune compare`` runs beside the rules with paired intervals."""
    from specgym.cli import main

    run = tmp_path / "batch"
    assert main(["train", "--mode", "batch", "--workload", "speclane-mix", "--timesteps", "1024", "--out", str(run),
                 "--hyperparams", "n_envs=2", "n_steps=256", "batch_size=128", "eval_freq=1024",
                 "max_batch=32"]) == 0
    state = json.loads((run / "state.json").read_text())
    assert state["timesteps_done"] == 1024 and "speedup_vs_goodput" in state["val_history"][-1]
    assert main(["export", str(run), "--out", str(tmp_path / "pol"), "--force"]) == 0  # a tiny run: below
    assert json.loads((tmp_path / "pol" / "policy.json").read_text())["mode"] == "batch"
    capsys.readouterr()
    out = tmp_path / "cmp.json"
    assert main(["tune", "compare", "--workload", "speclane-mix", "--profile", "batch-a100-7b-roofline",
                 "--controllers", f"goodput,static:2,ppo:{tmp_path / 'pol'}", "--replications", "2",
                 "--requests", "48", "--max-batch", "32", "--out", str(out)]) == 0
    rows = {r["controller"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["goodput"]["vs_reference"] == pytest.approx(1.0)
    lo, hi = rows[f"ppo:{tmp_path / 'pol'}"]["vs_reference_ci95"]
    assert lo <= rows[f"ppo:{tmp_path / 'pol'}"]["vs_reference"] <= hi

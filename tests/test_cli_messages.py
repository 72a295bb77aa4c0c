"""CLI messages: each names the right thing (the controller or sketch a run lacks), what ``workloads show`` and
``list`` tell, batch-size tables checked, trees live in ``generate``, progress on long steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specgym.baselines.batch_rules import BatchSizeTable
from specgym.cli import main
from specgym.envs.workloads.trace_format import load_workload, save_workload
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.report import markdown_table
from specgym.paths import MODELS_DIR


def _no_train(tmp_path):
    wl = load_workload("midpair-greedy")
    sub = wl.subset(np.concatenate([wl.split_indices(s)[:3] for s in ("val", "test")]))
    path = tmp_path / "notrain.parquet"
    save_workload(sub, path)
    return path


@pytest.mark.parametrize("spec", ["tree-sequoia", "tree-predicted:midpair"])
def test_split_all_without_train_names_the_controller_that_needs_it(tmp_path, capsys, spec, one_line_error):
    assert main(["eval", "--workload", str(_no_train(tmp_path)), "--split", "all", "--controllers",
                 f"fixed:2,{spec}", "--bootstrap", "0", "--no-plots", "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, f"{spec}:", "'train'", "fits itself on the train split")
    assert not (tmp_path / "r").exists()


def test_tree_oracle_closes_no_headroom_against_the_chain_limit(tmp_path):
    wl = load_workload("midpair-greedy")
    sub = wl.subset(np.concatenate([wl.split_indices(s)[:4] for s in ("train", "test")]))
    rep = evaluate(EvalConfig(workload=sub, controllers="fixed:3,tree-oracle", bootstrap=0))
    table = markdown_table(rep)
    oracle_line = next(line for line in table.splitlines() if line.startswith("| tree-oracle"))
    cells = [c.strip() for c in oracle_line.strip("|").split("|")]
    assert cells[6] == cells[7] == "–"  # headroom closed (clairvoyant / informed): a limit, not a controller
    assert "clairvoyant limit of chain drafts" in table


def test_live_bench_refuses_a_replay_only_controller_before_loading_anything(monkeypatch):
    import specgym.eval.bench.live as live

    def no_load(*a, **k):
        raise AssertionError("the pair was loaded before the specs were checked")

    monkeypatch.setattr(live, "load_pair", no_load)
    with pytest.raises(SpecgymError, match="tree-predicted:midpair: grows its tree"):
        live.run_live_bench(console=None, specs=["fixed:2", "tree-predicted:midpair"])


def test_workloads_show_says_format_signals_and_sketch(capsys):
    assert main(["workloads", "show", "midpair-greedy"]) == 0
    out = capsys.readouterr().out
    assert "format    v2; signal columns: token_id," in out and "hidden_sketch of 16 dims" in out
    assert "64 bytes per token" in out
    assert main(["workloads", "show", "speclane-mix"]) == 0
    assert "format    v1; signal columns: none" in capsys.readouterr().out


def test_workloads_list_shows_what_the_package_ships(capsys):
    assert main(["workloads", "list"]) == 0
    out = capsys.readouterr().out
    for heading in ("shipped model pairs", "shipped prompts files", "shipped acceptance predictors",
                    "shipped policies"):
        assert heading in out
    assert "midpair-prompts" in out and "midpair-predicted" in out and "trained on midpair-greedy" in out
    assert "fallback on conf, shape, position, lookup" in out


def test_batch_size_tables_are_checked():
    for table, words in (([[1, 64, 3], [60, 128, 1]], "overlap"), ([[1, 64, 3], [70, 128, 1]], "gap"),
                         ([[2, 64, 3]], "starts at batch 2"), ([[1, 64, 99]], "K 99 is above 16")):
        with pytest.raises(SpecgymError, match=words):
            BatchSizeTable(table)
    ok = BatchSizeTable([[65, 128, 1], [1, 64, 3]])  # rows in any order
    assert ok.max_batch == 128
    with pytest.raises(SpecgymError, match="above k_max 2"):
        ok.check_k_max(2)
    with pytest.raises(SpecgymError, match="no such file"):
        BatchSizeTable.parse("missing.json")


def test_predictor_hint_names_the_missing_sketch_not_another_format(tmp_path, capsys, one_line_error):
    wl = load_workload("midpair-greedy")
    import dataclasses

    sub = wl.subset(np.arange(40))
    sub = dataclasses.replace(sub, hidden_sketch=None,
                              signal_meta={k: v for k, v in sub.signal_meta.items() if k != "hidden_sketch"})
    path = tmp_path / "nosketch.parquet"
    save_workload(sub, path)
    assert main(["predictor", "train", "--workload", str(path), "--groups", "conf,hidden",
                 "--out", str(tmp_path / "p.json")]) == 2
    err = one_line_error(capsys, "hidden (hidden_sketch)", "--hidden-sketch D")
    assert "format v2" not in err


def test_a_predictor_no_better_than_chance_is_not_written(tmp_path, capsys, one_line_error):
    from tests.synthetic_v2 import v2_workload

    wl = v2_workload(80, temperature=0.8)  # sampled: p_accept is a probability, free of the greedy identity
    val = wl.split == "val"
    req_of_pos = np.repeat(np.arange(wl.n_requests), wl.lengths)
    flip = val[req_of_pos]
    wl.p_accept[flip] = 1.0 - wl.p_accept[flip]  # validation labels the reverse of train's
    path = tmp_path / "w.parquet"
    save_workload(wl, path)
    out = tmp_path / "p.json"
    assert main(["predictor", "train", "--workload", str(path), "--kinds", "logistic", "--out", str(out)]) == 2
    one_line_error(capsys, "not written", "validation AUC", "no better than chance")
    assert not out.exists()


def test_profile_reports_progress():
    pytest.importorskip("torch")
    from specgym.envs.engines.model_loading import load_pair
    from specgym.envs.engines.profiler import measure_profile

    pair = load_pair(str(MODELS_DIR / "tinypair" / "draft"), str(MODELS_DIR / "tinypair" / "target"),
                     fast_kernels=False)
    seen: list[float] = []
    measure_profile(pair, k_max=2, context=16, repeats=3, warmup=1, progress=seen.append)
    assert seen and seen == sorted(seen) and 0.0 <= seen[0] and seen[-1] < 1.0


def test_generate_runs_a_live_tree_and_refuses_a_replay_only_one(capsys, one_line_error):
    pytest.importorskip("torch")
    tiny = ["--draft", str(MODELS_DIR / "tinypair" / "draft"), "--target", str(MODELS_DIR / "tinypair" / "target")]
    assert main(["generate", *tiny, "--prompt", "def f(x):", "--controller", "tree-static:2-1",
                 "--max-new-tokens", "12", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["greedy_identical"] and res["tokens"] == 12 and set(res["nodes_per_round"]) <= {0, 1, 2, 4}
    assert main(["generate", *tiny, "--prompt", "x", "--controller", "tree-predicted:midpair"]) == 2
    one_line_error(capsys, "runs in replay only")

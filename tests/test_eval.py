"""Evaluation harness: report structure, determinism, metrics consistency and bad controller specs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specgym import make_controller
from specgym.agents.specs import Traits, all_specs
from specgym.cli import main
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.errors import SpecgymError
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.plots import PLOT_FILES
from specgym.eval.report import COLUMNS
from specgym.eval.runner import run_controller, run_fixed_vectorised

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ev") / "report"
    assert main(["eval", "--workload", "assc-regimes", "--max-requests", "40", "--seed", "3", "--out", str(out)]) == 0
    return out


def test_report_golden_structure(small_report):
    files = sorted(p.name for p in small_report.iterdir())
    assert files == sorted([".specgym", "report.json", "report.md", *PLOT_FILES])  # + the marker of what specgym wrote
    for name in PLOT_FILES:
        data = (small_report / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
    rep = json.loads((small_report / "report.json").read_text())
    assert rep["workload"]["synthetic"] and rep["workload"]["sha256"] and rep["seed"] == 3
    specs = [r["spec"] for r in rep["rows"]]
    assert set(specs) == set(all_specs(Traits.anything(), rep["k_max"], ("chain",))[0])  # every baseline in the table
    assert {"marginal", "fixed:1", f"fixed:{rep['k_max']}"} <= set(specs)
    tput = [r["throughput_tok_s"] for r in rep["rows"]]
    assert tput == sorted(tput, reverse=True)
    for row in rep["rows"]:
        for key, _, _ in COLUMNS[1:]:
            assert key in row
        assert row["oracle_ratio"] <= 1.0 + 1e-12
    assert rep["oracle"]["controller"] == "oracle"  # the clairvoyant row, unchanged
    informed = rep["informed_oracle"]  # beside it, never among the controllers' rows
    assert informed["controller"] == informed["spec"] == "oracle:informed" and "oracle:informed" not in specs
    assert informed["total_time_ms"] >= rep["oracle"]["total_time_ms"]
    for key, _, _ in COLUMNS[1:]:
        assert key in informed
    h = rep["headroom"]
    assert set(h) == {"best_fixed_tok_s", "informed_tok_s", "clairvoyant_tok_s", "chance_tok_s", "removable_tok_s",
                      "chance_share"}
    assert h["chance_tok_s"] + h["removable_tok_s"] == pytest.approx(h["clairvoyant_tok_s"] - h["best_fixed_tok_s"])
    md = (small_report / "report.md").read_text()
    assert "(synthetic workload)" in md and "**oracle**" in md and "**oracle:informed**" in md
    assert "## Headroom split" in md and "prediction + decision" in md
    header = next(line for line in md.splitlines() if line.startswith("| controller"))
    best = rep["reference"]["best_fixed_k"]  # the column names the K it compares with (issue 17)
    titles = [f"{c[1]} (K={best})" if c[0] == "speedup_vs_best_fixed" else c[1] for c in COLUMNS]
    assert [c.strip() for c in header.strip("|").split("|")] == titles
    assert "headroom closed (informed)" in header
    assert set(rep["traces"]) == {"code", "reasoning"}


def test_same_seed_identical_report(tmp_path):
    args = ["eval", "--workload", "speclane-mix", "--controllers", "assc,speclane,fixed:3,ucb", "--max-requests", "30",
            "--no-plots"]
    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "report.json").read_text())
    b = json.loads((tmp_path / "b" / "report.json").read_text())
    assert a == b


def test_seed_changes_sampled_draws_only():
    """Sampled traces replay different acceptance draws per seed; greedy traces are seed-independent."""
    from specgym.envs.workloads.synthetic import generate_workload

    sampled = generate_workload("geometric", 20, seed=0)
    greedy = generate_workload("speclane-mix", 20, seed=0)
    run = lambda wl, seed: evaluate(EvalConfig(workload=wl, controllers="assc", split="all", seed=seed))["rows"]
    assert run(sampled, 1) != run(sampled, 2)
    assert run(greedy, 1) == run(greedy, 2)


def test_metrics_consistency(mix_workload):
    rep = evaluate(EvalConfig(workload=mix_workload, controllers="fixed:1,fixed:4,assc", split="all"))
    ref = rep["reference"]
    best = ref["best_fixed_k"]
    rows = {r["spec"]: r for r in rep["rows"]}
    assert rows["fixed:4"]["speedup_vs_k4"] == pytest.approx(1.0)
    if best in (1, 4):
        assert rows[f"fixed:{best}"]["speedup_vs_best_fixed"] == pytest.approx(1.0)
        assert rows[f"fixed:{best}"]["headroom_closed"] == pytest.approx(0.0)
    assert rows["fixed:4"]["mean_k"] <= 4.0
    assert rep["oracle"]["total_time_ms"] <= min(float(v) for v in ref["fixed_time_ms"].values())
    r1 = rows["fixed:1"]
    assert r1["draft_waste"] == pytest.approx(1 - (r1["mean_accept_len"] - 1) / r1["mean_k"], rel=1e-9)


def test_scalar_runner_equals_vectorised_for_fixed_k(mix_workload):
    engine = TraceEngine(mix_workload, k_max=8, seed=4)
    reqs = np.arange(25)
    vec = run_fixed_vectorised(engine, reqs, 3)
    scal = run_controller(engine, reqs, make_controller("fixed:3"), trace=[0])  # tracing forces the scalar loop
    np.testing.assert_allclose(vec.time_ms, scal.time_ms)
    np.testing.assert_array_equal(vec.rounds, scal.rounds)
    assert len(scal.traces[0]) == scal.rounds[0]


@pytest.mark.parametrize("spec", ["fixed:x", "nope"])
def test_bad_controller_spec_points_to_the_valid_names(spec, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["eval", "--controllers", spec, "--out", str(out), "--max-requests", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert spec in err and "'specgym eval --help' lists the valid forms" in err and "\n" not in err
    assert not out.exists()
    with pytest.raises(SpecgymError):
        evaluate(EvalConfig(workload="speclane-mix", controllers=spec))


def test_existing_report_folder_is_not_overwritten(small_report, capsys):
    before = (small_report / "report.json").read_text()
    assert main(["eval", "--workload", "assc-regimes", "--max-requests", "5", "--out", str(small_report)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (small_report / "report.json").read_text() == before


def test_plots_stay_readable_with_every_controller(mix_workload):
    """17+ series: legends sit outside the axes, categories (not controllers) carry the colours, one small panel
    per adaptive controller and category for K over time."""
    import matplotlib.pyplot as plt

    from specgym.eval.plots import plot_acceptance, plot_k_over_time, plot_throughput

    rep = evaluate(EvalConfig(workload=mix_workload, controllers="all", split="all", max_requests=30))
    fig = plot_throughput(rep)
    fig.canvas.draw()
    (ax,) = fig.axes
    legend = fig.legends[0].get_window_extent()
    assert not ax.get_window_extent().overlaps(legend)  # below the axes, never over bars
    assert {t.get_text() for t in fig.legends[0].get_texts()} >= {"fixed K or tree shape", "adaptive rule"}
    plt.close(fig)
    fig = plot_acceptance(rep)
    cats = list(rep["workload"]["mean_p_accept_by_category"])
    colours = {tuple(c.get_facecolor()[0]) for c in fig.axes[0].collections}
    assert len(colours) == len(cats)  # one colour (and marker) per category, whatever the number of controllers
    plt.close(fig)
    fig = plot_k_over_time(rep)
    adaptive = [r for r in rep["rows"] if not r["spec"].startswith("fixed:")]
    assert len(fig.axes) == len(adaptive) * len(rep["traces"])
    plt.close(fig)


"""The live bench's one config (:class:`~specgym.eval.bench.live_config.LiveBenchConfig`), checked once when made, and
its controllers, built and prepared once with a fresh copy for every run; without loading a model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specgym.agents.specs import build
from specgym.cli import main
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.workloads.synthetic import generate_workload
from specgym.errors import SpecgymError
from specgym.eval.bench.live import LiveBenchConfig, live_config, run_live_bench
from specgym.eval.bench.live_measure import LiveControllers, _order
from specgym.eval.runner import run_controller


def test_a_config_is_checked_when_made_and_keeps_its_specs_expanded():
    cfg = LiveBenchConfig(specs=["fixed:2", "tree-static:2-1"], repeats=2)
    assert cfg.specs == ("fixed:2", "tree-static:2-1") and cfg.repeats == 2
    assert LiveBenchConfig(specs="fixed:2,marginal").specs == ("fixed:2", "marginal")
    assert LiveBenchConfig(resamples=0).resamples == 0  # no intervals
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.repeats = 3  # type: ignore[misc]


@pytest.mark.parametrize("options, fragment", [
    ({"specs": ["fixed:2", "tree-predicted:midpair"]}, "tree-predicted:midpair: grows its tree"),
    ({"specs": ["oracle"]}, "bad controller spec 'oracle'"),
    ({"repeats": 0}, "repeats (--repeats) must be an integer >= 1, got 0"),
    ({"per_category": -1}, "per_category (--prompts) must be an integer >= 1"),
    ({"micro_repeats": 2.5}, "micro_repeats must be an integer >= 1, got 2.5"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
    ({"resamples": -1}, "resamples must be an integer >= 0"),
    ({"device": "tpu"}, "--device 'tpu': expected cpu, cuda or cuda:N"),
    ({"draft": "a"}, "give both --draft and --target, or neither"),
    ({"pair_name": "midpair", "target": "b", "draft": "a"}, "pair_name midpair names both models"),
    ({"profile": "no-such-profile"}, "unknown cost profile 'no-such-profile'"),
])
def test_each_bad_field_is_one_line_naming_it(options, fragment):
    with pytest.raises(SpecgymError) as err:
        LiveBenchConfig(**options)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_run_live_bench_takes_a_config_or_its_fields_before_loading_anything(monkeypatch):
    import specgym.eval.bench.live_measure as measure

    monkeypatch.setattr(measure, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SpecgymError, match="give a config or its fields, not both"):
        run_live_bench(None, LiveBenchConfig(), repeats=2)
    with pytest.raises(SpecgymError, match="repeats"):
        run_live_bench(None, repeats=0)


def test_bench_live_checks_its_flags_once_into_the_config_the_section_runs():
    from specgym.cli import build_parser

    args = build_parser().parse_args(["bench", "live", "--prompts", "2", "--repeats", "1", "--controllers",
                                      "fixed:2,marginal", "--device", "cpu"])
    cfg = live_config(args, "midpair-greedy")
    assert (cfg.workload, cfg.per_category, cfg.repeats, cfg.specs, cfg.device) == \
        ("midpair-greedy", 2, 1, ("fixed:2", "marginal"), "cpu")
    assert main(["bench", "live", "--controllers", "fixed:2,oracle"]) == 2


def test_rows_run_in_a_rotating_order_with_plain_decoding_first_in_the_first_repeat():
    assert _order(4, 2, rep=0, shift=1) == [2, 1, 3, 0]
    assert _order(4, 2, rep=1, shift=5) == [1, 2, 3, 0]  # rotated by the prompt's slot, plain wherever it falls
    assert sorted(_order(5, 0, rep=3, shift=17)) == list(range(5))


def test_a_controller_is_built_once_and_every_run_gets_it_as_built():
    """UCB learns across requests: each repeat (and each replay) must start from the controller as built, so the
    copies are independent of each other and of the prototype, and share the workload rather than copy it."""
    wl = generate_workload("speclane-mix", 24, seed=3)
    proto = build("ucb").controller
    ctrls = LiveControllers({"ucb": proto}, {"ucb": proto}, {id(wl): wl})
    eng = TraceEngine(wl, wl.profile, 8, seed=0)
    requests = np.arange(wl.n_requests)
    first, second = ctrls.fresh_live("ucb"), ctrls.fresh("ucb")
    a = run_controller(eng, requests, first).time_ms
    assert first.bandit.total > 0 and proto.bandit.total == 0 and second.bandit.total == 0  # the prototype never learns
    b = run_controller(TraceEngine(wl, wl.profile, 8, seed=0), requests, second).time_ms
    np.testing.assert_array_equal(a, b)  # a fresh copy decides as the first one did
    again = run_controller(TraceEngine(wl, wl.profile, 8, seed=0), requests, first).time_ms
    assert not np.array_equal(a, again)  # one that kept learning would not: why every repeat gets a copy
    ctrls.protos["holder"] = type("Holder", (), {"wl": wl})()
    assert ctrls.fresh("holder").wl is wl  # shared, never copied
    assert ctrls.fresh("fixed:3").k == 3  # a spec outside the rows (tree-chain:SPEC's chain): built on first use

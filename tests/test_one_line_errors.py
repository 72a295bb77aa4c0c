"""One-line errors: bad or unusual inputs (env configs, reset options, controller proposals, non-UTF-8 files,
folders, sizes that would exhaust memory, memory and file-system errors) end in one line (SpecgymError; exit status
2 on the CLI), never a traceback.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import specgym
from specgym import Controller, SpecgymError, drive, make_controller
from specgym.cli import main


@pytest.mark.parametrize("env_id,kwargs,fragment", [
    ("specgym/SpecDecode-v1", {"workload": None}, "workload"),
    ("specgym/SpecDecode-v1", {"workload": "assc-regimes", "profile": 42}, "profile"),
    ("specgym/SpecDecode-v1", {"workload": "assc-regimes", "outcome_seed": "x"}, "outcome_seed"),
    ("specgym/SpecDecode-v1", {"workload": "assc-regimes", "k_min": 2.7}, "k_min"),
    ("specgym/SpecDecode-v1", {"workload": "assc-regimes", "split": "training"}, "split"),
    ("specgym/SpecDecode-v1", {"domains": 3}, "domains"),
    ("specgym/SpecDecodeToken-v1", {"workload": 1.5}, "workload"),
    ("specgym/SpecDecodeBatch-v0", {"workload": "assc-regimes", "requests": -5}, "requests"),
    ("specgym/SpecDecodeBatch-v0", {"workload": "assc-regimes", "concurrency": "bogus"}, "concurrency"),
])
def test_wrong_env_config_types_are_one_line_errors(env_id, kwargs, fragment):
    with pytest.raises(SpecgymError, match=fragment) as info:
        gym.make(env_id, **kwargs).reset(seed=0)
    assert "\n" not in str(info.value)


def test_domains_may_name_the_shipped_distribution():
    env = gym.make("specgym/SpecDecode-v1", domains="generalist")
    env.reset(seed=0)
    assert env.unwrapped.domains is not None


def test_unknown_reset_options_are_refused():
    env = gym.make("specgym/SpecDecode-v1", workload="assc-regimes")
    with pytest.raises(SpecgymError, match=r"unknown reset option\(s\) \['bogus'\]"):
        env.reset(seed=0, options={"bogus": 1})
    env.reset(seed=0, options={"request": 0})


def test_make_controller_and_engine_bounds():
    with pytest.raises(SpecgymError, match="expected a string"):
        make_controller(None)  # type: ignore[arg-type]
    engine = specgym.TraceEngine(specgym.load_workload("assc-regimes"))
    with pytest.raises(SpecgymError, match="out of range"):
        engine.start(99999)
    with pytest.raises(SpecgymError, match="out of range"):
        engine.start(-1)


class _Returns(Controller):
    """A controller proposing a fixed (possibly invalid) value."""

    def __init__(self, value):
        self.value, self.name = value, f"returns-{value!r}"

    def reset(self, ctx):
        pass

    def propose(self):
        return self.value

    def observe(self, outcome):
        pass


@pytest.mark.parametrize("value", [None, float("nan"), 2.5, "3", True])
def test_a_controller_proposing_a_non_integer_is_named(value):
    engine = specgym.TraceEngine(specgym.load_workload("assc-regimes"))
    with pytest.raises(SpecgymError, match="must be a whole number"):
        drive(_Returns(value), engine.start(0))


def test_a_numpy_integer_k_is_fine():
    import numpy as np

    engine = specgym.TraceEngine(specgym.load_workload("assc-regimes"))
    assert drive(_Returns(np.int64(3)), engine.start(0)).tokens > 0


def test_non_utf8_and_folder_inputs(tmp_path, capsys, one_line_error):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe{}")
    with pytest.raises(SpecgymError, match="not UTF-8"):
        specgym.load_profile(bad)
    assert main(["eval", "--workload", "assc-regimes", "--profile", str(bad), "--out", str(tmp_path / "e")]) == 2
    one_line_error(capsys, "not UTF-8")
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(b'{"prompt": "\xff"}\n')
    for p, fragment in ((prompts, "not UTF-8"), (tmp_path, "is a folder")):
        assert main(["record", "--prompts", str(p), "--out", str(tmp_path / "t.parquet")]) == 2
        one_line_error(capsys, fragment)
    assert main(["tune", "vllm", "--workload", "assc-regimes", "--profile", str(bad)]) == 2
    one_line_error(capsys, "not UTF-8")


@pytest.mark.parametrize("argv,fragment", [
    (["eval", "--bootstrap", "10000000000"], "--bootstrap"),
    (["eval", "--bootstrap", "1"], "may exclude its estimate"),
    (["workloads", "make", "--preset", "speclane-mix", "--requests", "100000000000", "--out", "x.parquet"],
     "--requests"),
])
def test_sizes_that_would_run_out_of_memory_are_bounded(argv, fragment, capsys, tmp_path, monkeypatch, one_line_error):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    one_line_error(capsys, fragment)
    assert list(tmp_path.iterdir()) == []


def test_memory_and_file_system_errors_never_trace_back(capsys, monkeypatch, one_line_error):
    import specgym.commands.workloads as workloads

    def boom(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(workloads, "generate_workload", boom)
    assert main(["workloads", "make", "--preset", "speclane-mix", "--out", "/nonexistent-dir/x.parquet"]) == 2
    one_line_error(capsys, "out of memory")

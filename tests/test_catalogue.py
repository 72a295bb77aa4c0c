"""The catalogue of shipped data: every kind resolves its shipped names from any folder and reports a miss in one
line that lists them."""

from __future__ import annotations

from pathlib import Path

import pytest

import specgym.catalogue as catalogue
from specgym.errors import SpecgymError

ALWAYS_SHIPPED = ("workload", "profile", "batch_profile", "policy", "prompts", "predictor")


@pytest.mark.parametrize("kind", ALWAYS_SHIPPED)
def test_every_shipped_name_resolves_from_any_folder(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = catalogue.names(kind)
    assert shipped and shipped == sorted(shipped)
    for name in shipped:
        path = catalogue.resolve(kind, name)
        assert path.is_absolute() and path.exists() and name in path.name


def test_profiles_and_batch_profiles_do_not_mix():
    assert not set(catalogue.names("profile")) & set(catalogue.names("batch_profile"))
    assert all(n.startswith("batch-") for n in catalogue.names("batch_profile"))


@pytest.mark.parametrize("kind, pattern", [
    ("workload", "unknown workload 'nope'; shipped workloads: "),
    ("profile", "unknown cost profile 'nope'; shipped profiles: "),
    ("batch_profile", "batch profile 'nope' not found; shipped: "),
    ("policy", r"policy 'nope' not found \(neither a folder nor a shipped policy; shipped: "),
    ("pair", "no shipped model pair 'nope'; shipped: "),
    ("predictor", "unknown acceptance predictor 'nope'; shipped: "),
])
def test_a_miss_lists_the_shipped_names(kind, pattern):
    with pytest.raises(SpecgymError, match=pattern) as exc:
        catalogue.resolve(kind, "nope")
    assert "\n" not in str(exc.value)
    if catalogue.names(kind):
        assert catalogue.names(kind)[0] in str(exc.value)


def test_a_path_is_taken_as_given(tmp_path):
    f = tmp_path / "x.parquet"
    f.write_bytes(b"")
    assert catalogue.resolve("workload", f) == f
    assert catalogue.resolve("prompts", tmp_path / "missing.jsonl") == tmp_path / "missing.jsonl"  # the reader says
    with pytest.raises(SpecgymError, match="workload file not found"):
        catalogue.resolve("workload", tmp_path / "missing.parquet")


def test_unknown_kind():
    with pytest.raises(SpecgymError, match="unknown data kind 'model'"):
        catalogue.names("model")
    with pytest.raises(SpecgymError, match="unknown data kind 'model'"):
        catalogue.resolve("model", Path("x"))


def test_a_pair_names_its_two_models():
    for name in catalogue.names("pair"):
        draft, target = catalogue.pair_models(name)
        # the target: a folder beside the draft, or the model file a registry package installs (smollm2's GGUF)
        assert (draft / "config.json").is_file()
        assert (target / "config.json").is_file() or (target.suffix == ".gguf" and target.is_file())
    with pytest.raises(SpecgymError, match="no shipped model pair 'nope'"):
        catalogue.pair_models("nope")

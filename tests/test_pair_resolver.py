"""One pair resolver (:func:`specgym.envs.engines.live.pairs.resolve_pair`) for ``generate``, ``record``, ``profile``,
``bench live`` and ``specgym.load_pair``: by name, by two models, by the recording, and the same one-line refusals
everywhere, before any model loads."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import specgym
import specgym.catalogue as catalogue
from specgym.cli import main
from specgym.envs.engines.live.pairs import PairFlags, resolve_pair
from specgym.errors import SpecgymError
from specgym.paths import DATA_DIR, MODELS_DIR, default_pair_name


def test_a_shipped_pair_by_name_and_by_default():
    p = resolve_pair("tinypair")
    assert (p.draft, p.target, p.name, p.shipped) == (str(MODELS_DIR / "tinypair" / "draft"),
                                                      str(MODELS_DIR / "tinypair" / "target"), "tinypair", True)
    assert resolve_pair() == resolve_pair(default_pair_name())


def test_a_package_provided_target_goes_by_the_pair_name():
    """smollm2's target is a package's GGUF: every caller names it ``smollm2`` (what its recordings store), never the
    machine's site-packages path."""
    try:
        catalogue.external_target("smollm2")
    except SpecgymError as exc:
        pytest.skip(str(exc))
    p = resolve_pair("smollm2")
    assert p.target == "smollm2" and p.draft == str(MODELS_DIR / "smollm2" / "draft") and p.shipped


def test_two_models_name_a_users_pair():
    p = resolve_pair(None, "some/where/mine/draft", "some/where/mine/target")
    assert (p.draft, p.target, p.name, p.shipped) == ("some/where/mine/draft", "some/where/mine/target", "mine", False)
    assert resolve_pair(None, "distilgpt2", "gpt2").name == "gpt2"  # hub names: the target as given


@pytest.mark.parametrize("name, draft, target, fragment", [
    ("midpair", None, "x", "--pair midpair names both models: give --pair or --draft/--target, not both (got "
                           "--target too)"),
    ("midpair", "a", "b", "(got --draft and --target too)"),
    ("nope", None, None, "no shipped model pair 'nope'; shipped: "),
    (None, "a", None, "give both --draft and --target, or neither"),
    (None, None, "b", "give both --draft and --target, or neither"),
])
def test_refusals_are_one_line(name, draft, target, fragment):
    with pytest.raises(SpecgymError) as err:
        resolve_pair(name, draft, target)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def _recording(source: dict) -> SimpleNamespace:
    return SimpleNamespace(name="w", source=source)


def test_a_recording_names_its_pair_and_a_missing_model_is_one_line(tmp_path):
    shipped = _recording({"draft_model": "models/tinypair/draft", "target_model": "models/tinypair/target"})
    p = resolve_pair(recorded=shipped)
    assert (p.draft, p.target, p.name) == (str(DATA_DIR / "models/tinypair/draft"),
                                           str(DATA_DIR / "models/tinypair/target"), "tinypair")
    assert resolve_pair("midpair", recorded=shipped).name == "midpair"  # a name wins
    assert resolve_pair(recorded=_recording({})) == resolve_pair()  # names none: default
    gone = _recording({"draft_model": str(tmp_path / "gone/draft"), "target_model": str(tmp_path / "gone/target")})
    with pytest.raises(SpecgymError, match=r"workload w was recorded from draft .*gone/draft.* pass the pair with "
                                           r"--draft and --target"):
        resolve_pair(recorded=gone)
    mine = resolve_pair(None, "a/draft", "a/target", recorded=gone)
    assert (mine.draft, mine.name) == ("a/draft", "a")  # the user's two models: the recording is not asked


def test_a_caller_spells_its_own_options():
    flags = PairFlags(pair="name", draft="draft=", target="target=", caller="f: ")
    with pytest.raises(SpecgymError, match="^f: give both draft= and target=, or neither"):
        resolve_pair(None, "a", None, flags=flags)


@pytest.mark.parametrize("argv, fragment", [
    (["generate", "--prompt", "x", "--pair", "nope"], "no shipped model pair 'nope'"),
    (["record", "--prompts", "midpair-prompts", "--out", "OUT", "--pair", "nope"], "no shipped model pair 'nope'"),
    (["profile", "--out", "OUT", "--pair", "nope"], "no shipped model pair 'nope'"),
    (["record", "--prompts", "midpair-prompts", "--out", "OUT", "--pair", "midpair", "--target", "x"],
     "give --pair or --draft/--target, not both (got --target too)"),
    (["profile", "--out", "OUT", "--draft", "x"], "give both --draft and --target, or neither"),
    (["bench", "live", "--draft", "x"], "give both --draft and --target, or neither"),
])
def test_every_command_refuses_alike_before_loading_a_model(argv, fragment, tmp_path, capsys, monkeypatch):
    import specgym.commands.live as live

    monkeypatch.setattr(live, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = [str(tmp_path / "out.json") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err, err


def test_the_live_bench_and_load_pair_resolve_the_same_way():
    from specgym.eval.bench.live import LiveBenchConfig

    with pytest.raises(SpecgymError, match="no shipped model pair 'nope'"):
        LiveBenchConfig(pair_name="nope")
    with pytest.raises(SpecgymError, match="pair_name midpair names both models"):
        LiveBenchConfig(pair_name="midpair", draft="a", target="b")
    with pytest.raises(SpecgymError, match="no shipped model pair 'nope'"):
        specgym.load_pair("nope")
    with pytest.raises(SpecgymError, match="^specgym.load_pair: 'midpair' names a shipped pair"):
        specgym.load_pair("midpair", draft="a", target="b")
    assert Path(resolve_pair("midpair").draft).parent == MODELS_DIR / "midpair"

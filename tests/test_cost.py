"""Cost profiles: shipped presets, round times, validation."""

from __future__ import annotations

import json

import pytest

import specgym.catalogue as catalogue
from specgym.envs.core.cost import CostProfile, save_profile
from specgym.envs.profiles import load_profile
from specgym.errors import SpecgymError


def test_speclane_preset_reproduces_write_up():
    p = load_profile("speclane-table")
    a = 0.55
    tput = {k: (1 - a ** (k + 1)) / (1 - a) / p.round_time(k) * 1000 for k in (4, 8)}
    assert tput[4] == pytest.approx(45.5, abs=0.3) and tput[8] == pytest.approx(36.0, abs=0.1)
    assert p.source == "published"


def test_round_time_formula():
    p = CostProfile("x", draft_ms=2.0, verify_ms=(10.0, 11.0, 12.0), round_overhead_ms=0.5)
    assert p.round_time(0) == 10.0
    assert p.round_time(2) == 2 * 2.0 + 12.0 + 0.5
    assert list(p.round_times(2)) == [10.0, 13.5, 16.5]
    with pytest.raises(SpecgymError, match="needs k_max\\+1 = 4"):
        p.round_times(3)


def test_all_shipped_profiles_load():
    assert {"speclane-table", "assc-illustrative"} <= set(catalogue.names("profile"))
    for name in catalogue.names("profile"):
        assert load_profile(name).t_ar_ms > 0


@pytest.mark.parametrize("patch,msg", [
    ({"draft_ms": -1}, "'draft_ms' must be >= 0"),
    ({"verify_ms": [10]}, "at least 2"),
    ({"verify_ms": [10, "x"]}, r"'verify_ms\[2\]' must be a number"),
    ({"source": "guess"}, "'source' must be one of"),
    ({"colour": 1}, "unknown field"),
])
def test_bad_profiles(tmp_path, patch, msg):
    d = {"name": "t", "draft_ms": 1.0, "verify_ms": [10, 10, 10]} | patch
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(SpecgymError, match=msg):
        load_profile(path)


def test_unknown_profile_and_round_trip(tmp_path):
    with pytest.raises(SpecgymError, match="unknown cost profile 'h100'"):
        load_profile("h100")
    p = load_profile("speclane-table")
    save_profile(p, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == p


def test_profile_writers_apply_the_readers_rules(tmp_path):
    """``save_profile`` and ``save_batch_profile`` check what they write with the loaders' own rules: a profile the
    reader would refuse (a negative verify time) is refused in one line naming the file, and nothing is written."""
    import dataclasses

    from specgym.envs.core.batch_cost import save_batch_profile
    from specgym.envs.profiles import load_batch_profile

    bad = CostProfile("neg", 0.1, (1.0, 1.2, -2.3), source="measured")
    with pytest.raises(SpecgymError, match=r"bad\.json \(not written\).*verify_ms\[3\]"):
        save_profile(bad, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()
    good = dataclasses.replace(bad, verify_ms=(1.0, 1.2, 1.4))
    assert load_profile(save_profile(good, tmp_path / "good.json")) == good

    batch = load_batch_profile("batch-cpu-midpair")
    save_batch_profile(batch, tmp_path / "b.json")
    assert load_batch_profile(tmp_path / "b.json").verify_ms == batch.verify_ms
    object.__setattr__(batch, "source", "guessed")  # past the constructor's checks: only the reader's catch it
    with pytest.raises(SpecgymError, match=r"b2\.json \(not written\)"):
        save_batch_profile(batch, tmp_path / "b2.json")
    assert not (tmp_path / "b2.json").exists()


def test_tree_verify_continuation_never_goes_negative():
    """A chain-fitted profile far cheaper than the micro-benchmarks (the -2.3 ms profile of issue 42): the shifted
    continuation would go negative, so the measured tree-verify ratios are used instead, and the result loads."""
    from specgym.envs.engines.live.profiler import extend_tree_verify

    micro = CostProfile("micro", 0.1, (4.0, 4.2, 4.4, 3.9, 4.8), source="measured")
    shift = extend_tree_verify(CostProfile("fit", 0.1, (1.0, 1.2, 3.0), source="measured"), micro)
    assert shift.verify_ms[3:] == pytest.approx((3.0 + 3.9 - 4.4, 3.0 + 4.8 - 4.4))
    assert "increments" in shift.description
    fit = CostProfile("fit", 0.1, (0.3, 0.35, 0.4), source="measured")
    ext = extend_tree_verify(fit, micro)
    assert ext.verify_ms[3:] == pytest.approx((0.4 * 3.9 / 4.4, 0.4 * 4.8 / 4.4), abs=1e-4)
    assert "ratios" in ext.description and min(ext.verify_ms) > 0
    assert CostProfile.from_dict(ext.to_dict(), "ext").verify_ms == ext.verify_ms

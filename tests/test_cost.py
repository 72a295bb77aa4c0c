"""Cost profiles: shipped presets, round times, validation."""

from __future__ import annotations

import json

import pytest

import specgym.catalogue as catalogue
from specgym.envs.core.cost import CostProfile, load_profile, save_profile
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

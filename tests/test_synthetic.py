"""Synthetic workloads: presets match their documented parameters, determinism, labelling, confidence signal."""

from __future__ import annotations

import numpy as np
import pytest

from specgym.envs.workloads.synthetic import generate_workload, spec_with
from specgym.errors import SpecgymError


def test_speclane_mix_categories_and_lengths():
    wl = generate_workload("speclane-mix", 2000, seed=0)
    assert wl.is_synthetic and wl.label == "speclane-mix (synthetic)"
    share = {c: float((wl.category == c).mean()) for c in ("chat", "code", "math")}
    assert share == pytest.approx({"chat": 0.5, "code": 0.3, "math": 0.2}, abs=0.04)
    assert wl.lengths.min() >= 128 and wl.lengths.max() <= 384
    req_of_pos = np.repeat(np.arange(wl.n_requests), wl.lengths)
    for cat, alpha in (("chat", 0.55), ("code", 0.82), ("math", 0.41)):
        assert wl.p_accept[(wl.category == cat)[req_of_pos]].mean() == pytest.approx(alpha, abs=0.02)
    assert set(np.unique(wl.p_accept)) <= {0.0, 1.0}  # greedy: 0/1 outcomes
    assert wl.profile.name == "speclane-table"


def test_assc_regimes_have_flat_and_rugged_stretches():
    wl = generate_workload("assc-regimes", 300, seed=0)
    acc = wl.p_accept
    assert acc.mean() == pytest.approx((0.96 * 40 + 0.28 * 25) / 65, abs=0.05)
    # long runs of acceptances exist (flat regions) far more than an iid chain of the same mean would give
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], acc, [0]])) != 0))[::2]
    assert runs.max() > 40
    assert wl.profile.cost_ratio == pytest.approx(0.1)


def test_draft_confidence_carries_real_but_imperfect_signal():
    wl = generate_workload("speclane-mix", 500, seed=1)
    acc = wl.p_accept == 1
    assert wl.draft_conf[acc].mean() > wl.draft_conf[~acc].mean() + 0.2
    assert ((wl.draft_conf > 0.5) != acc).mean() > 0.05  # imperfect
    assert np.corrcoef(wl.draft_conf, wl.draft_entropy)[0, 1] < -0.5  # entropy falls as confidence rises


def test_deterministic_in_seed():
    a = generate_workload("assc-regimes", 50, seed=5)
    b = generate_workload("assc-regimes", 50, seed=5)
    c = generate_workload("assc-regimes", 50, seed=6)
    np.testing.assert_array_equal(a.p_accept, b.p_accept)
    assert a.split.tolist() == b.split.tolist()
    assert a.p_accept.shape != c.p_accept.shape or not np.array_equal(a.p_accept, c.p_accept)


def test_custom_mix_and_errors():
    spec = spec_with("speclane-mix", min_len=10, max_len=12, greedy=False)
    wl = generate_workload(spec, 20, seed=0, name="custom")
    assert wl.name == "custom" and wl.lengths.max() <= 12 and (wl.temperature > 0).all()
    with pytest.raises(SpecgymError, match="unknown synthetic preset"):
        generate_workload("nope", 10)
    with pytest.raises(SpecgymError, match="min_len"):
        generate_workload(spec_with("speclane-mix", min_len=0), 10)

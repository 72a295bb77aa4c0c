"""Trace format: round trip, validation and clear errors for every kind of bad file."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specgym.envs.workloads.trace_format import (
    META_KEY,
    load_workload,
    save_workload,
    workload_from_requests,
    workload_to_table,
)
from specgym.errors import SpecgymError


def test_round_trip_preserves_everything(tmp_path, mix_workload):
    path = save_workload(mix_workload, tmp_path / "w.parquet")
    wl = load_workload(path)
    assert wl.name == mix_workload.name and wl.is_synthetic
    assert wl.profile == mix_workload.profile
    np.testing.assert_array_equal(wl.offsets, mix_workload.offsets)
    for col in ("p_accept", "draft_conf", "draft_entropy"):
        np.testing.assert_array_equal(getattr(wl, col), getattr(mix_workload, col))
    assert np.isnan(wl.target_entropy).all()
    assert wl.split.tolist() == mix_workload.split.tolist()
    assert wl.source["params"]["categories"][0]["name"] == "chat"


def test_save_refuses_to_overwrite(tmp_path, mix_workload):
    path = save_workload(mix_workload, tmp_path / "w.parquet")
    with pytest.raises(SpecgymError, match="already exists"):
        save_workload(mix_workload, path)
    save_workload(mix_workload, path, overwrite=True)


def test_subset_and_split(mix_workload):
    idx = mix_workload.split_indices("test")
    sub = mix_workload.subset(idx)
    assert sub.n_requests == len(idx) and set(sub.split.tolist()) == {"test"}
    r = int(idx[3])
    np.testing.assert_array_equal(sub.p_accept[sub.span(3)], mix_workload.p_accept[mix_workload.span(r)])
    with pytest.raises(SpecgymError, match="unknown split"):
        mix_workload.split_indices("holdout")


def _write(table, path, meta=None):
    if meta is not None:
        table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    pq.write_table(table, path)
    return path


def test_truncated_file(tmp_path, mix_workload):
    path = save_workload(mix_workload, tmp_path / "w.parquet")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SpecgymError, match=r"w\.parquet: not a readable Parquet file"):
        load_workload(path)


def test_corrupt_file(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"PAR1 this is not parquet at all PAR1")
    with pytest.raises(SpecgymError, match="not a readable Parquet file"):
        load_workload(path)


def test_missing_column(tmp_path, mix_workload):
    table = workload_to_table(mix_workload).drop_columns(["draft_entropy"])
    path = _write(table, tmp_path / "m.parquet")
    with pytest.raises(SpecgymError, match=r"m\.parquet: missing column 'draft_entropy'"):
        load_workload(path)


def test_missing_metadata(tmp_path, mix_workload):
    table = workload_to_table(mix_workload).replace_schema_metadata({})
    path = _write(table, tmp_path / "nometa.parquet")
    with pytest.raises(SpecgymError, match="missing specgym metadata"):
        load_workload(path)


def test_wrong_version(tmp_path, mix_workload):
    meta = mix_workload.metadata() | {"format_version": 99}
    path = _write(workload_to_table(mix_workload), tmp_path / "v.parquet", meta)
    with pytest.raises(SpecgymError, match="unsupported format_version 99"):
        load_workload(path)


def _with_column(table, name, values):
    i = table.column_names.index(name)
    return table.set_column(i, name, values)


def test_p_accept_out_of_range(make_trace, tmp_path, flat_profile):

    wl = make_trace([[1, 0, 1]], flat_profile)
    table = workload_to_table(wl)
    bad = pa.array([[1.0, 1.5, 0.0]], pa.list_(pa.float32()))
    path = _write(_with_column(table, "p_accept", bad), tmp_path / "r.parquet", wl.metadata())
    with pytest.raises(SpecgymError, match=r"field 'p_accept' value 1\.5 out of range \[0\.0, 1\.0\] \(request 'r0'\)"):
        load_workload(path)


def test_nan_not_allowed(make_trace, tmp_path, flat_profile):

    wl = make_trace([[1, 0, 1]], flat_profile)
    bad = pa.array([[0.5, float("nan"), 0.2]], pa.list_(pa.float32()))
    path = _write(_with_column(workload_to_table(wl), "draft_conf", bad), tmp_path / "n.parquet", wl.metadata())
    with pytest.raises(SpecgymError, match="field 'draft_conf' contains NaN"):
        load_workload(path)


def test_inconsistent_offsets(make_trace, tmp_path, flat_profile):

    wl = make_trace([[1, 0, 1]], flat_profile)
    bad = pa.array([[0.5, 0.2]], pa.list_(pa.float32()))
    path = _write(_with_column(workload_to_table(wl), "draft_entropy", bad), tmp_path / "o.parquet", wl.metadata())
    with pytest.raises(SpecgymError, match="offsets differ"):
        load_workload(path)


def test_empty_workload(tmp_path, mix_workload):
    table = workload_to_table(mix_workload).slice(0, 0)
    path = _write(table, tmp_path / "e.parquet", mix_workload.metadata())
    with pytest.raises(SpecgymError, match="workload is empty"):
        load_workload(path)
    with pytest.raises(SpecgymError, match="no requests"):
        workload_from_requests("x", {"kind": "synthetic"}, mix_workload.profile, [])


def test_unknown_name_lists_shipped():
    with pytest.raises(SpecgymError, match="unknown workload 'nope'; shipped workloads: .*speclane-mix"):
        load_workload("nope")


def test_load_10k_requests_fast(tmp_path):
    """Loading a 10k-request workload is far below a second (checked loosely; bench prints the figure)."""
    import time

    from specgym.envs.workloads.synthetic import generate_workload

    path = save_workload(generate_workload("speclane-mix", 10_000, seed=0), tmp_path / "big.parquet")
    t0 = time.perf_counter()
    wl = load_workload(path)
    assert wl.n_requests == 10_000
    assert time.perf_counter() - t0 < 5.0  # generous: a smoke bound, the benchmark reports the real figure


def test_shipped_metadata_names_no_machine_paths():
    """Shipped workloads and profiles name models and prompt files relative to the package, never by the absolute
    path of the machine that built them."""
    import json
    import re

    import specgym.catalogue as catalogue
    from specgym.paths import PROFILES_DIR

    absolute = re.compile(r'"(/(?:work|root|home|tmp|Users)/[^"]*)"')
    for name in catalogue.names("workload"):
        meta = json.dumps(load_workload(name).metadata())
        assert not absolute.findall(meta), (name, absolute.findall(meta))
    for name in catalogue.names("profile"):
        text = (PROFILES_DIR / f"{name}.json").read_text()
        assert not re.findall(r"/(?:work|root|home|tmp|Users)/", text), name

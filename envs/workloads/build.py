"""Assembling a workload from per-request dicts (recorders, generators, importers): :func:`workload_from_requests`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.workloads.validation import validate_workload
from specgym.envs.workloads.workload import RUNS_DTYPE, SIGNAL_COLUMNS, Workload, assign_splits
from specgym.errors import SpecgymError


def workload_from_requests(
    name: str,
    source: dict[str, Any],
    profile: CostProfile,
    requests: Sequence[dict[str, Any]],
    split_seed: int = 0,
    split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    extra: dict[str, Any] | None = None,
    signal_meta: dict[str, Any] | None = None,
    drafters: list[dict[str, Any]] | None = None,
) -> Workload:
    """Assemble a workload from per-request dicts.

    Each dict holds ``request_id``, ``category``, ``temperature``, ``prompt_len``, optional ``prompt_text``, the
    per-position arrays ``p_accept``, ``draft_conf``, ``draft_entropy``, optional ``target_entropy`` (NaN where a
    request lacks it), the optional signal columns (:data:`SIGNAL_COLUMNS`; each in every request or in none) and,
    format v3, optional ``runs`` (``{drafter: per-start runs}``). In v3 the first three per-position arrays are
    optional too: absent from every request, the column is ``None``. Splits are assigned from ``split_seed``
    unless every request carries a ``split``.

    Args:
        signal_meta: The ``signals`` metadata block (recorded traces with signal columns).
        drafters: The ``drafters`` metadata block (:func:`drafter_entry`; needed with ``runs``).
    """
    if not requests:
        raise SpecgymError(f"workload {name!r}: no requests")
    per_position = requests[0].get("p_accept") is not None
    lengths = np.array([_request_length(name, r, per_position) for r in requests], dtype=np.int64)
    offsets = np.zeros(len(requests) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    cols: dict[str, Any] = {c: _column(name, requests, lengths, c, np.float32)
                            for c in ("p_accept", "draft_conf", "draft_entropy")}
    # before v3 target_entropy was NaN where unknown: a per-position trace keeps that (NaN-filled, never None)
    cols["target_entropy"] = _column(name, requests, lengths, "target_entropy", np.float32, nan_fill=True)
    if cols["target_entropy"] is None and per_position:
        cols["target_entropy"] = np.full(int(offsets[-1]), np.nan, np.float32)
    signals = {c: _column(name, requests, lengths, c, dtype) for c, (dtype, _) in SIGNAL_COLUMNS.items()}
    runs = _runs_columns(name, requests, lengths)
    _check_prompt_lens(name, requests)
    if all("split" in r for r in requests):
        split = np.array([r["split"] for r in requests], dtype=object)
    else:
        split = assign_splits(len(requests), split_seed, split_fractions)
    texts = [r.get("prompt_text") for r in requests]
    wl = Workload(
        name=name,
        source=source,
        profile=profile,
        request_id=np.array([str(r["request_id"]) for r in requests], dtype=object),
        category=np.array([str(r["category"]) for r in requests], dtype=object),
        temperature=np.array([r["temperature"] for r in requests], dtype=np.float32),
        prompt_len=np.array([r["prompt_len"] for r in requests], dtype=np.int32),
        split=split,
        offsets=offsets,
        prompt_text=None if all(t is None for t in texts) else [t or "" for t in texts],
        split_seed=split_seed,
        extra=dict(extra or {}),
        signal_meta=dict(signal_meta or {}),
        runs=runs,
        drafters=list(drafters or []),
        **cols,
        **{c: v for c, v in signals.items() if v is not None},
    )
    validate_workload(wl, where=f"workload {name!r}")
    return wl


def _request_length(name: str, r: dict[str, Any], per_position: bool) -> int:
    """A request's positions: its ``p_accept`` values, or (a runs-only v3 trace) its first drafter's runs."""
    if per_position:
        return len(r["p_accept"])
    runs = r.get("runs") or {}
    if not runs:
        raise SpecgymError(f"workload {name!r}: request {r.get('request_id')!r} has neither 'p_accept' nor runs")
    return len(next(iter(runs.values())))


def _column(name: str, requests: Sequence[dict[str, Any]], lengths: np.ndarray, col: str, dtype: Any,
            nan_fill: bool = False) -> np.ndarray | None:
    """One per-position field of every request, concatenated: None where no request has it; in some requests
    only, NaN-filled where missing (``nan_fill``) or refused."""
    have = [r.get(col) is not None for r in requests]
    if not any(have):
        return None
    if not all(have) and not nan_fill:
        raise SpecgymError(f"workload {name!r}: field {col!r} present in some requests only (all or none)")
    parts = [np.full(n, np.nan, np.float32) if r.get(col) is None else np.asarray(r[col])
             for r, n in zip(requests, lengths)]
    bad = next((k for k, (v, n) in enumerate(zip(parts, lengths)) if len(v) != n), None)
    if bad is not None:
        raise SpecgymError(f"workload {name!r}: field {col!r} has {len(parts[bad])} values, expected "
                           f"{lengths[bad]} (request {requests[bad]['request_id']!r})")
    return np.concatenate(parts).astype(dtype, copy=False)


def _runs_columns(name: str, requests: Sequence[dict[str, Any]], lengths: np.ndarray) -> dict[str, np.ndarray]:
    """Every drafter's runs (``{drafter: flat int16 runs}``, drafters in order of first appearance); a drafter must
    have runs in every request or in none."""
    run_names = list(dict.fromkeys(k for r in requests for k in (r.get("runs") or {})))
    runs: dict[str, np.ndarray] = {}
    for d in run_names:
        parts = [(r.get("runs") or {}).get(d) for r in requests]
        if any(p is None for p in parts):
            raise SpecgymError(f"workload {name!r}: runs of drafter {d!r} present in some requests only")
        runs[d] = _runs_column([r["request_id"] for r in requests], parts, lengths, name, d)
    return runs


def _check_prompt_lens(name: str, requests: Sequence[dict[str, Any]]) -> None:
    """Refuse a ``prompt_len`` that is no integer in the int32 range it is stored in (a larger value would
    overflow, not be refused)."""
    int32 = np.iinfo(np.int32)
    bad_len = next((r for r in requests if isinstance(r["prompt_len"], bool) or not isinstance(r["prompt_len"], (
        int, np.integer)) or not 0 <= r["prompt_len"] <= int32.max), None)
    if bad_len is not None:
        raise SpecgymError(f"workload {name!r}: field 'prompt_len' = {bad_len['prompt_len']!r} of request "
                           f"{bad_len['request_id']!r}: expected an integer in [0, {int32.max:,}]")


def _runs_column(ids: list[Any], runs: list[Any], lengths: np.ndarray, name: str, drafter: str) -> np.ndarray:
    """One drafter's runs of every request as a flat int16 array (lengths checked, range checked)."""
    parts = [np.asarray(r, dtype=np.int64) for r in runs]
    for rid, p, n in zip(ids, parts, lengths):
        if p.shape != (n,):
            raise SpecgymError(f"workload {name!r}: runs of drafter {drafter!r} have {p.size} values, expected {n} "
                               f"(request {rid!r})")
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() > np.iinfo(RUNS_DTYPE).max):
        raise SpecgymError(f"workload {name!r}: runs of drafter {drafter!r} must be in [0, "
                           f"{np.iinfo(RUNS_DTYPE).max}]")
    return flat.astype(RUNS_DTYPE)

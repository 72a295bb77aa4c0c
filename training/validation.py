"""Validation of an in-memory policy against the references (the best fixed K, SpecLane, confidence:0.4)."""

from __future__ import annotations

from typing import Any

from specgym.agents.artifact import PolicyArtifact
from specgym.agents.policy_controller import PolicyController
from specgym.eval.harness import EvalConfig, evaluate
from specgym.eval.stats import geomean

#: Validation figures a run reports besides the best fixed K: (key in the result, the baseline it compares with).
COMPARED_BASELINES = (("speedup_vs_marginal", "marginal"), ("speedup_vs_speclane", "speclane"),
                      ("speedup_vs_confidence", "confidence:0.4"), ("speedup_vs_goodput", "goodput"),
                      ("speedup_vs_sequoia", "tree-sequoia"))


def validate_policy(artifact: PolicyArtifact, workload: Any, split: str = "val", max_requests: int | None = None,
                    seed: int = 0) -> dict[str, Any]:
    """Evaluate a policy with :func:`specgym.eval.harness.evaluate` against the references.

    References: ``fixed:1..k_max`` (hence the best fixed K), ``speclane``, and in token mode ``confidence:0.4``.
    Returns the policy's row figures plus ``speedup_vs_speclane`` / ``speedup_vs_confidence`` and the best fixed K.
    """
    k_max = artifact.k_max
    refs = [f"fixed:{k}" for k in range(1, k_max + 1)] + ["speclane"]
    if artifact.mode == "token":
        refs.append("confidence:0.4")
    policy = PolicyController(artifact, name="ppo (training)")
    report = evaluate(EvalConfig(workload=workload, controllers=[",".join(refs), policy], split=split, seed=seed,
                                 k_max=k_max, max_requests=max_requests))
    out = _policy_figures(report, policy.name, split, {"speclane": "speclane", "confidence:0.4": "confidence"})
    out["oracle_tok_s"] = report["oracle"]["throughput_tok_s"]
    return out


def _policy_figures(report: dict[str, Any], name: str, split: str, refs: dict[str, str]) -> dict[str, Any]:
    """The policy row's figures, the best fixed K, and ``speedup_vs_X`` / ``X_tok_s`` for each reference spec
    present (``refs``: spec -> short name)."""
    rows = {r["spec"]: r for r in report["rows"]}
    row = rows[name]
    out = {k: row[k] for k in ("throughput_tok_s", "speedup_vs_ar", "speedup_vs_best_fixed", "oracle_ratio",
                               "mean_k", "mean_accept_len", "draft_waste") if k in row}
    out["best_fixed_k"] = report["reference"]["best_fixed_k"]
    out["best_fixed_tok_s"] = rows[f"fixed:{out['best_fixed_k']}"]["throughput_tok_s"]
    for spec, short in refs.items():
        if spec in rows:
            out[f"{short}_tok_s"] = rows[spec]["throughput_tok_s"]
            out[f"speedup_vs_{short}"] = row["throughput_tok_s"] / out[f"{short}_tok_s"]
    out["split"], out["requests"] = split, report["workload"]["requests"]
    return out


def validate_tree_policy(artifact: PolicyArtifact, workload: Any, profile: str | None, split: str = "val",
                         max_requests: int | None = None) -> dict[str, Any]:
    """A tree-mode policy (through the tree runner) against ``fixed:1..k_max`` and ``tree-sequoia`` under the run's
    profile."""
    from specgym.agents.tree_policy import TreePolicyController

    policy = TreePolicyController(artifact, name="tree-ppo (training)")
    refs = [f"fixed:{k}" for k in range(1, artifact.k_max + 1)] + ["tree-sequoia"]
    report = evaluate(EvalConfig(workload=workload, controllers=[",".join(refs), policy], split=split,
                                 k_max=artifact.k_max, max_requests=max_requests, profile=profile))
    return _policy_figures(report, policy.name, split, {"tree-sequoia": "sequoia"})


def generalist_cells(seed: int = 9000) -> list[tuple[str, Any, Any]]:
    """Validation cells of domain-randomised runs: ``(label, workload, profile)``.

    Six synthetic workloads from a pool seed no training or suite workload uses, and the recorded training
    workloads' *val* splits (reduced to a val-only workload), each priced with two fixed randomised profiles.
    """
    import numpy as np

    from specgym.envs.workloads.domains import TRAIN_RECORDED, ProfileRanges, synthetic_pool
    from specgym.envs.workloads.trace_format import cached_workload
    import specgym.catalogue as catalogue

    workloads = synthetic_pool(n=6, requests=60, seed=seed)
    for name in TRAIN_RECORDED:
        if name in catalogue.names("workload"):
            wl = cached_workload(name)
            workloads.append(wl.subset(wl.split_indices("val")))
    rng = np.random.default_rng(seed)
    profiles = [ProfileRanges().sample(rng) for _ in range(2)]
    return [(f"{wl.name}/p{i}", wl, prof) for wl in workloads for i, prof in enumerate(profiles)]


def validate_generalist(artifact: PolicyArtifact, cells: list[tuple[str, Any, Any]],
                        max_requests: int | None = None) -> dict[str, Any]:
    """Mean figures of a policy over validation cells: against the best fixed K and against ``marginal``.

    ``speedup_vs_best_fixed`` and ``speedup_vs_marginal`` are geometric means over the cells of the ratios of
    throughput; the best model of a run is kept by ``speedup_vs_marginal``.
    """
    from specgym.baselines.marginal import MarginalStop

    ratios: dict[str, list[float]] = {"best_fixed": [], "marginal": [], "oracle": []}
    tps = []
    for _, wl, prof in cells:
        policy = PolicyController(artifact, name="ppo (training)")
        rep = evaluate(EvalConfig(workload=wl, controllers=[policy, MarginalStop()], split="all",
                                  k_max=artifact.k_max, profile=prof, max_requests=max_requests, bootstrap=0))
        rows = {r["spec"]: r for r in rep["rows"]}
        row = rows[policy.name]
        ratios["best_fixed"].append(row["speedup_vs_best_fixed"])
        ratios["marginal"].append(row["throughput_tok_s"] / rows["marginal"]["throughput_tok_s"])
        ratios["oracle"].append(row["oracle_ratio"])
        tps.append(row["speedup_vs_ar"])
    mean = {k: geomean(v) for k, v in ratios.items()}
    return {"speedup_vs_best_fixed": mean["best_fixed"], "speedup_vs_marginal": mean["marginal"],
            "oracle_ratio": mean["oracle"], "throughput_tok_s": float("nan"), "speedup_vs_ar": sum(tps) / len(tps),
            "cells": len(cells), "split": "val cells", "requests": sum(len(wl.split_indices("all")) for _, wl, _ in
                                                                   cells)}


def validate_batch(artifact: PolicyArtifact, workload: Any, profile_name: str, max_batch: int,
                   replications: int = 4) -> dict[str, Any]:
    """A batch policy against the goodput rule and the best static K on mixed-concurrency replications (val split)."""
    from specgym.agents.batch_policy import BatchPolicyController
    from specgym.envs.core.batch_cost import load_batch_profile
    from specgym.eval.batch_eval import compare

    policy = BatchPolicyController(artifact, name="ppo (training)")
    specs: list[Any] = ["goodput", policy, *(f"static:{k}" for k in (0, 1, 2, 4))]
    res = compare(workload, load_batch_profile(profile_name), specs, replications=replications, requests=96,
                  max_batch=max_batch, split="val", k_max=artifact.k_max, seed=12345)
    rows = {r["controller"]: r for r in res["rows"]}
    best_static = max((r for n, r in rows.items() if n.startswith("static:")), key=lambda r: r["tok_s_mean"])
    p = rows[policy.name]
    return {"speedup_vs_goodput": p["vs_reference"], "speedup_vs_best_fixed": p["tok_s_mean"] /
            best_static["tok_s_mean"], "throughput_tok_s": p["tok_s_mean"], "oracle_ratio": float("nan"),
            "replications": replications, "split": "val", "requests": 96 * replications}


def make_validator(cfg: Any, workload: Any):
    """``(validate(artifact, max_requests) -> figures, key)`` for a run: its workload's val split, or the
    validation cells of a domain-randomised run; ``key`` is the figure the best model is kept by."""
    if cfg.mode == "batch":
        return (lambda art, max_requests=None: validate_batch(art, workload, cfg.ppo.batch_profile,
                                                              cfg.ppo.max_batch)), "speedup_vs_goodput"
    if cfg.mode == "tree":
        return (lambda art, max_requests=None: validate_tree_policy(art, workload, cfg.ppo.profile, "val",
                                                                    max_requests)), "speedup_vs_best_fixed"
    if getattr(cfg.ppo, "domains", None):
        cells = generalist_cells()
        return (lambda art, max_requests=None: validate_generalist(art, cells, max_requests)), "speedup_vs_marginal"
    return (lambda art, max_requests=None: validate_policy(art, workload, "val", max_requests)), \
        "speedup_vs_best_fixed"


def describe(res: dict[str, Any]) -> str:
    """One line of validation figures (whichever a validator returned)."""
    parts = []
    if res.get("throughput_tok_s") == res.get("throughput_tok_s"):  # not NaN
        parts.append(f"{res['throughput_tok_s']:.2f} tok/s")
    if "best_fixed_k" in res:
        parts.append(f"vs best fixed K={res['best_fixed_k']} {res['speedup_vs_best_fixed']:.3f}x")
    elif "replications" in res:
        parts.append(f"vs best static K {res['speedup_vs_best_fixed']:.3f}x ({res['replications']} mixed-concurrency "
                     "replications)")
    else:
        parts.append(f"vs best fixed K {res['speedup_vs_best_fixed']:.3f}x (geo-mean of {res['cells']} cells)")
    for key, label in COMPARED_BASELINES:
        if key in res:
            parts.append(f"vs {label} {res[key]:.3f}x")
    if res.get("oracle_ratio") == res.get("oracle_ratio"):
        parts.append(f"oracle ratio {res['oracle_ratio']:.3f}")
    return ", ".join(parts)

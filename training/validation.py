"""Validation of an in-memory policy against the references (the best fixed K, SpecLane, confidence:0.4)."""

from __future__ import annotations

from typing import Any

from specgym.agents.policy_controller import PolicyArtifact, PolicyController
from specgym.eval.harness import EvalConfig, evaluate


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
    rows = {r["spec"]: r for r in report["rows"]}
    row = rows[policy.name]
    out = {k: row[k] for k in ("throughput_tok_s", "speedup_vs_ar", "speedup_vs_best_fixed", "oracle_ratio",
                               "mean_k", "mean_accept_len", "draft_waste") if k in row}
    out["best_fixed_k"] = report["reference"]["best_fixed_k"]
    out["best_fixed_tok_s"] = rows[f"fixed:{out['best_fixed_k']}"]["throughput_tok_s"]
    out["speclane_tok_s"] = rows["speclane"]["throughput_tok_s"]
    out["speedup_vs_speclane"] = row["throughput_tok_s"] / out["speclane_tok_s"]
    if "confidence:0.4" in rows:
        out["confidence_tok_s"] = rows["confidence:0.4"]["throughput_tok_s"]
        out["speedup_vs_confidence"] = row["throughput_tok_s"] / out["confidence_tok_s"]
    out["oracle_tok_s"] = report["oracle"]["throughput_tok_s"]
    out["split"], out["requests"] = split, report["workload"]["requests"]
    return out

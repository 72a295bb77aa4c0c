"""Metrics of a workload run. Requests are served one at a time.

* ``throughput_tok_s`` = total produced tokens / total time.
* ``speedup_vs_ar`` = T_AR / T with T_AR = N * t_AR; ``speedup_vs_k4`` and ``speedup_vs_best_fixed`` likewise
  against fixed K=4 and the best fixed K on the same requests and draws.
* ``mean_accept_len`` = produced / rounds (includes the bonus token, as vLLM reports it); ``mean_k`` = mean
  drafted tokens per round.
* ``draft_waste`` = (drafted - accepted) / drafted over the run.
* ``tpot_ms`` per request = T_req / N_req; mean and p99 over requests.
* ``oracle_ratio`` = T_oracle / T (1.0 = perfect); ``headroom_closed`` = (T_bestfixed - T) / (T_bestfixed -
  T_oracle), undefined (None) when the best fixed K already equals the oracle.
* Against the informed oracle (knows p_accept, not the draws): ``informed_ratio`` = T_informed / T (may exceed 1 by
  luck of the draws: the informed oracle is optimal in expectation), ``headroom_closed_informed`` = (T_bestfixed -
  T) / (T_bestfixed - T_informed), and ``prediction_decision_tok_s`` = informed tok/s - tok/s, the part of the
  headroom a better prediction or decision could still remove (the rest, clairvoyant - informed, is chance).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specgym.eval.runner import RunResult


def headroom_closed(t_best: float, t: float, t_ref: float) -> float | None:
    """``(T_bestfixed - T) / (T_bestfixed - T_ref)``: the share of the gap to a reference (an oracle) closed; None
    when the reference is not faster than the best fixed K."""
    gap = t_best - t_ref
    return (t_best - t) / gap if gap > 1e-9 * t_best else None


def run_metrics(res: RunResult, t_ar: float, t_k4: float, t_best: float, t_oracle: float,
                t_informed: float | None = None) -> dict[str, Any]:
    """The section-6 figures of one controller's run (and the informed-oracle ones when ``t_informed`` is given)."""
    tokens = float(res.tokens.sum())
    total = float(res.time_ms.sum())
    tpot = res.time_ms / res.tokens
    drafted = float(res.drafted.sum())
    out: dict[str, Any] = {
        "controller": res.name,
        "throughput_tok_s": tokens / total * 1000.0,
        "speedup_vs_ar": tokens * t_ar / total,
        "speedup_vs_k4": t_k4 / total,
        "speedup_vs_best_fixed": t_best / total,
        "oracle_ratio": t_oracle / total,
        "headroom_closed": headroom_closed(t_best, total, t_oracle),
        "mean_accept_len": tokens / float(res.rounds.sum()),
        "mean_k": drafted / float(res.rounds.sum()),
        "draft_waste": (drafted - float(res.accepted.sum())) / drafted if drafted > 0 else 0.0,
        "tpot_ms_mean": float(tpot.mean()),
        "tpot_ms_p99": float(np.percentile(tpot, 99)),
        "total_time_ms": total,
        "tokens": int(tokens),
        "rounds": int(res.rounds.sum()),
    }
    if t_informed is not None:
        out["informed_ratio"] = t_informed / total
        out["headroom_closed_informed"] = headroom_closed(t_best, total, t_informed)
        out["prediction_decision_tok_s"] = tokens / t_informed * 1000.0 - out["throughput_tok_s"]
    return out


def category_metrics(res: RunResult, categories: np.ndarray) -> dict[str, dict[str, float]]:
    """Throughput, acceptance rate (accepted / drafted), accept length and mean K per request category."""
    out: dict[str, dict[str, float]] = {}
    for cat in dict.fromkeys(categories.tolist()):
        m = categories == cat
        drafted = float(res.drafted[m].sum())
        out[cat] = {
            "throughput_tok_s": float(res.tokens[m].sum() / res.time_ms[m].sum() * 1000.0),
            "acceptance_rate": float(res.accepted[m].sum() / drafted) if drafted > 0 else 0.0,
            "mean_accept_len": float(res.tokens[m].sum() / res.rounds[m].sum()),
            "mean_k": drafted / float(res.rounds[m].sum()),
        }
    return out

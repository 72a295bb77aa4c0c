"""The figures of a run, measured against the references of the same requests and draws. Requests are served one
at a time.

* ``throughput_tok_s`` = total produced tokens / total time.
* ``speedup_vs_ar`` = T_AR / T with T_AR = N * t_AR (the fixed K = 0 run when the profile has a context term);
  ``speedup_vs_k4`` and ``speedup_vs_best_fixed`` likewise against fixed K=4 and the best fixed K on the same
  requests and draws.
* ``mean_accept_len`` = produced / rounds (includes the bonus token, as vLLM reports it); ``mean_k`` = mean
  drafted tokens per round.
* ``draft_waste`` = (drafted - accepted) / drafted over the run.
* ``tpot_ms`` per request = T_req / N_req; mean and p99 over requests.
* ``oracle_ratio`` = T_oracle / T (1.0 = perfect); ``headroom_closed`` = (T_bestfixed - T) / (T_bestfixed -
  T_oracle), undefined (None) when the oracle is less than :data:`MIN_HEADROOM` (0.5%) faster than the best fixed K:
  a share of a gap that small is noise (a controller 1% off a 0.001% gap would read -100,000%).
* Against the informed oracle (knows p_accept, not the draws): ``informed_ratio`` = T_informed / T (may exceed 1 by
  luck of the draws: the informed oracle is optimal in expectation), ``headroom_closed_informed`` = (T_bestfixed -
  T) / (T_bestfixed - T_informed), and ``prediction_decision_tok_s`` = informed tok/s - tok/s, the part of the
  headroom a better prediction or decision could still remove (the rest, clairvoyant - informed, is chance).

One function, :func:`figures`, computes them for every row that has them: a controller's, the informed oracle's,
the clairvoyant oracle's (:func:`oracle_figures`: no rounds, so no round figures), a suite cell's policy and a
training validation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specgym.eval.references import References
from specgym.eval.runner import RunResult


@dataclass(frozen=True)
class Figures:
    """The figures of one run (see the module docstring); round figures are None for a run without rounds."""

    controller: str
    throughput_tok_s: float
    speedup_vs_ar: float
    speedup_vs_k4: float
    speedup_vs_best_fixed: float
    oracle_ratio: float
    headroom_closed: float | None
    informed_ratio: float
    headroom_closed_informed: float | None
    prediction_decision_tok_s: float
    mean_accept_len: float | None
    mean_k: float | None
    draft_waste: float | None
    tpot_ms_mean: float
    tpot_ms_p99: float
    total_time_ms: float
    tokens: int
    rounds: int | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON row of a report (round figures left out when the run has none)."""
        out = asdict(self)
        if self.rounds is None:
            for key in ("mean_accept_len", "mean_k", "draft_waste", "rounds"):
                del out[key]
        return out


#: The smallest gap between the best fixed K and an oracle, as a share of the best fixed K's time, that a headroom
#: share is computed over.
MIN_HEADROOM = 0.005


def headroom_closed(t_best: float, t: float, t_ref: float) -> float | None:
    """``(T_bestfixed - T) / (T_bestfixed - T_ref)``: the share of the gap to a reference (an oracle) closed; None
    when the reference is less than :data:`MIN_HEADROOM` of the best fixed K's time faster than it (no headroom to
    share out: the ratio of two near-equal times' difference is noise)."""
    gap = t_best - t_ref
    return (t_best - t) / gap if gap > MIN_HEADROOM * t_best else None


def _figures(name: str, tokens: np.ndarray, time_ms: np.ndarray, refs: References,
             counts: tuple[float, float, float] | None) -> Figures:
    n = float(tokens.sum())
    total = float(time_ms.sum())
    tpot = time_ms / tokens
    t_best, t_informed = refs.t_best, refs.t_informed
    round_figs: dict[str, Any] = {"mean_accept_len": None, "mean_k": None, "draft_waste": None, "rounds": None}
    if counts is not None:
        rounds, drafted, accepted = counts
        round_figs = {"mean_accept_len": n / rounds, "mean_k": drafted / rounds,
                      "draft_waste": (drafted - accepted) / drafted if drafted > 0 else 0.0, "rounds": int(rounds)}
    return Figures(
        controller=name,
        throughput_tok_s=n / total * 1000.0,
        speedup_vs_ar=(n * refs.t_ar_ms if refs.ar_ms is None else float(refs.ar_ms.sum())) / total,
        speedup_vs_k4=refs.t_fixed(refs.k4) / total,
        speedup_vs_best_fixed=t_best / total,
        oracle_ratio=refs.t_oracle / total,
        headroom_closed=headroom_closed(t_best, total, refs.t_oracle),
        informed_ratio=t_informed / total,
        headroom_closed_informed=headroom_closed(t_best, total, t_informed),
        prediction_decision_tok_s=(n / t_informed - n / total) * 1000.0,
        tpot_ms_mean=float(tpot.mean()),
        tpot_ms_p99=float(np.percentile(tpot, 99)),
        total_time_ms=total,
        tokens=int(n),
        **round_figs,
    )


def figures(run: RunResult, refs: References) -> Figures:
    """The figures of a controller's (or the informed oracle's) run on the references' requests."""
    return _figures(run.name, run.tokens, run.time_ms, refs,
                    (float(run.rounds.sum()), float(run.drafted.sum()), float(run.accepted.sum())))


def oracle_figures(refs: References) -> Figures:
    """The clairvoyant oracle's figures (its time per request is all the references keep of it)."""
    return _figures("oracle", refs.lengths, refs.oracle_ms, refs, None)


def headroom_split(refs: References) -> dict[str, Any]:
    """The headroom above the best fixed K, split at the informed oracle (throughputs in tok/s).

    *chance* = clairvoyant - informed: what knowing the draws adds, which no controller that has to predict can
    remove; *removable* = informed - best fixed K: what prediction + decision can gain. ``chance_share`` is the
    chance part of the best-fixed-to-clairvoyant headroom in time (the unit of ``headroom_closed``).
    """
    tps = {name: refs.tokens / t * 1000.0 for name, t in (("best_fixed", refs.t_best),
                                                          ("informed", refs.t_informed),
                                                          ("clairvoyant", refs.t_oracle))}
    closed = headroom_closed(refs.t_best, refs.t_informed, refs.t_oracle)  # the informed oracle's own share
    return {
        "best_fixed_tok_s": tps["best_fixed"], "informed_tok_s": tps["informed"],
        "clairvoyant_tok_s": tps["clairvoyant"],
        "chance_tok_s": tps["clairvoyant"] - tps["informed"],
        "removable_tok_s": tps["informed"] - tps["best_fixed"],
        "chance_share": None if closed is None else 1.0 - closed,
    }


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

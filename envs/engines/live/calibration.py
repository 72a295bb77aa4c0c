"""A cost profile fitted to the live engine's own rounds: the replay prices rounds as this machine runs them.

Micro-benchmarks (:func:`~specgym.envs.engines.live.profiler.measure_profile`) time each forward in isolation, with
random tokens, at one context length; real rounds differ from that (caches warm from the previous call, the
controller's bookkeeping, context growing through the request), and on one CI-class machine the micro-benchmarked
profile priced a one-draft-token round at 5.57 ms where the engine's rounds took 4.63 ms. The error is in the
profile's shape, so it reorders controllers in replay. :func:`calibrate` therefore decodes a few requests with every
fixed K = 0..k_max (requests interleaved so a drifting machine slows every K alike) and fits the cost model
(:mod:`specgym.envs.core.cost`) to the rounds:

* ``draft_ms`` = total time of the drafting phases / tokens drafted (the engine times each round's drafting phase);
* ``verify(d + 1)`` = mean of (round time - drafting phase) over the rounds that drafted ``d`` tokens, spikes left
  out (``verify(1)`` = the plain rounds: t_AR), with ``round_overhead_ms`` = 0 since the remainder already holds it.

The fit also reports how round time depends on context length (the fitted profile has no context term; the slope
says whether that matters here) and the residual error. A mean rather than a median: a request's time is a sum of
rounds, so the mean is what predicts it. Only spikes beyond 3x the median (a preemption, a page fault) are left out:
an earlier 5% trim of each end also dropped the ordinary slow rounds of a shared VM, which live requests do pay,
and priced rounds 1-2% fast.

Rounds of other drafters (the draft head's) verify ``d + 1`` tokens in the same target forward, so they count towards
``verify(d + 1)`` too (``fit_profile(verify_samples=...)``). And a benchmark interleaving calibration with its
measurement decodes each calibration request with the cap cycling through every K round by round
(:func:`cycled_rounds`): every drafted count is then timed at every calibration point, in the state the machine is in
at that moment, instead of each K at a few points of a drifting machine (on a shared VM, one K timed at 4 moments
priced its rounds 8% off).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile, DraftCost
from specgym.envs.core.kinds import HEAD_DRAFTER, IMPLICIT_DRAFTER, NGRAM_DRAFTER
from specgym.errors import SpecgymError

#: A round this many times its group's median (or a 1/SPIKE fraction of it) is a spike, not the machine's cost.
SPIKE = 3.0


@dataclass(frozen=True)
class RoundSample:
    """One measured round: tokens drafted, context length at its start, drafting-phase and whole-round time (ms)."""

    drafted: int
    context: int
    draft_phase_ms: float
    round_ms: float


@dataclass
class CalibrationFit:
    """A profile fitted to engine rounds, and how well it fits.

    Attributes:
        profile: The fitted :class:`CostProfile` (``source="measured"``).
        rounds: Rounds measured per drafted count ``d`` (index ``d``).
        round_ms: Fitted time of a round drafting ``d`` tokens (index ``d``).
        context_slope: Relative change of round time per 100 tokens of context (least squares over all rounds,
            after removing each ``d``'s mean); e.g. 0.02 = +2% per 100 tokens.
        context_range: Smallest and largest context length seen.
        seconds: Wall time of the calibration run.
    """

    profile: CostProfile
    rounds: list[int]
    round_ms: list[float]
    context_slope: float
    context_range: tuple[int, int]
    seconds: float
    samples: list[RoundSample] = field(default_factory=list, repr=False)

    def summary(self) -> str:
        """One line for logs and bench output."""
        r = self.round_ms
        head = ""
        if HEAD_DRAFTER in self.profile.drafter_names:
            dc = self.profile.draft_cost(HEAD_DRAFTER)
            head = f", draft head {dc.per_token_ms:.3f} ms/token + {dc.fixed_ms:.3f} ms"
        took = f" in {self.seconds:.0f} s" if self.seconds else ""
        return (f"fitted to {sum(self.rounds)} engine rounds{took}: t_AR {r[0]:.2f} ms, "
                f"draft {self.profile.draft_ms:.3f} ms/token{head}, round(1) {r[1]:.2f} ms, round({len(r) - 1}) "
                f"{r[-1]:.2f} ms; context {self.context_range[0]}-{self.context_range[1]} tokens changes a round by "
                f"{100 * self.context_slope:+.1f}% per 100 tokens")


def spike_free_mean(x: Sequence[float], spike: float = SPIKE) -> float:
    """Mean of ``x`` without the values beyond ``spike`` times its median (or below the median over ``spike``)."""
    a = np.asarray(x, dtype=np.float64)
    med = float(np.median(a))
    if med <= 0:
        return float(a.mean())
    kept = a[(a <= med * spike) & (a >= med / spike)]
    return float(kept.mean())


def cycled_rounds(engine: Any, ids: Sequence[int], max_new_tokens: int, ks: Sequence[int],
                  temperature: float = 0.0, seed: int = 0, drafter: str | None = None) -> list[RoundSample]:
    """Decode one request with the draft cap cycling through ``ks`` round by round (``[k]``: a fixed K), drafted by
    the draft model or by ``drafter``, and return every round's timing."""
    if not ks:
        raise SpecgymError("calibration: no draft caps to cycle through")
    req = engine.start(ids, max_new_tokens, temperature, seed)
    j = 0
    while not req.done:
        k = int(ks[j % len(ks)])
        j += 1
        if drafter is None:
            req.play(k)
        else:
            req.play(k, drafter=drafter)
    return [RoundSample(r.drafted, len(ids) + r.position, ms, r.time_ms)
            for r, ms in zip(req.result.rounds, req.result.draft_phase_ms)]


def measure_rounds(engine: Any, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int], k_max: int,
                   repeats: int = 1, temperature: float = 0.0,
                   progress: Callable[[float], None] | None = None) -> list[RoundSample]:
    """Decode every prompt with every fixed K in 0..k_max (``repeats`` times, K rotated per prompt) at
    ``temperature`` and return every round's timing (``progress(fraction_done)`` after each request)."""
    samples: list[RoundSample] = []
    ks = list(range(k_max + 1))
    total, done = repeats * len(prompts) * len(ks), 0
    for rep in range(repeats):
        for p, (ids, n) in enumerate(zip(prompts, max_new_tokens)):
            shift = (p + rep) % len(ks)
            for k in ks[shift:] + ks[:shift]:
                if progress is not None:
                    progress(done / total)
                done += 1
                samples += cycled_rounds(engine, ids, int(n), [k], temperature, seed=p)
    return samples


def fit_profile(samples: Sequence[RoundSample], k_max: int, name: str = "fitted", description: str = "",
                hardware: dict[str, Any] | None = None, seconds: float = 0.0,
                verify_samples: Sequence[RoundSample] = ()) -> CalibrationFit:
    """Fit the cost model to measured rounds of the draft model (see the module docstring); every ``d`` in 0..k_max
    needs rounds. ``verify_samples``: rounds another drafter proposed, which inform ``verify(d + 1)`` only (their
    drafting phases are that drafter's cost, not the draft model's)."""
    by_d: list[list[RoundSample]] = [[] for _ in range(k_max + 1)]
    for s in samples:
        if s.drafted <= k_max:
            by_d[s.drafted].append(s)
    missing = [d for d, rows in enumerate(by_d) if not rows]
    if missing:
        raise SpecgymError(f"calibration: no rounds drafted {missing} tokens; decode longer requests")
    drafted = sum(s.drafted for s in samples if s.drafted > 0)
    draft_ms = sum(s.draft_phase_ms for s in samples if s.drafted > 0) / drafted
    verify_by_d = [list(rows) for rows in by_d]
    for s in verify_samples:
        if 0 < s.drafted <= k_max:
            verify_by_d[s.drafted].append(s)
    rest = [spike_free_mean([s.round_ms - s.draft_phase_ms for s in rows]) if d else
            spike_free_mean([s.round_ms for s in rows]) for d, rows in enumerate(verify_by_d)]
    verify = [max(v, 1e-3) for v in rest]
    round_ms = [verify[0]] + [d * draft_ms + verify[d] for d in range(1, k_max + 1)]
    # context dependence: relative residual of each round against its d's fit, regressed on context
    ctx = np.array([s.context for s in samples], dtype=np.float64)
    rel = np.array([s.round_ms / round_ms[s.drafted] - 1.0 for s in samples if s.drafted <= k_max])
    ctx = ctx[: len(rel)]
    keep = np.abs(rel) < 1.0  # drop preemption spikes from the slope
    slope = float(np.polyfit(ctx[keep] / 100.0, rel[keep], 1)[0]) if keep.sum() > 2 and np.ptp(ctx[keep]) > 0 \
        else 0.0
    prof = CostProfile(
        name=name, draft_ms=round(draft_ms, 4), verify_ms=tuple(round(v, 4) for v in verify), round_overhead_ms=0.0,
        source="measured",
        description=description or (f"fitted to {len(samples)} live-engine rounds (K = 0..{k_max}; drafting "
                                    f"phase / tokens = draft_ms, mean remainder (spikes out) per drafted count = "
                                    f"verify(d + 1), overhead included there"
                                    + (f"; {len(verify_samples)} rounds of other drafters in verify"
                                       if len(verify_samples) else "") + ")"),
        hardware={**(hardware or {}), "method": "rounds"},
    )
    return CalibrationFit(prof, [len(rows) for rows in verify_by_d], [round(v, 4) for v in round_ms], slope,
                          (int(ctx.min()), int(ctx.max())), seconds, list(samples))


def calibrate(engine: Any, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int], k_max: int,
              repeats: int = 1, name: str = "fitted", hardware: dict[str, Any] | None = None,
              temperature: float = 0.0, progress: Callable[[float], None] | None = None) -> CalibrationFit:
    """Measure rounds on ``prompts`` at ``temperature`` (see :func:`measure_rounds`) and fit a profile to them; an
    engine with a draft head also times the head's rounds (:func:`head_cost`) and the profile names three drafters
    (the draft model, prompt lookup, the head)."""
    if not prompts:
        raise SpecgymError("calibration needs at least one prompt")
    t0 = time.perf_counter()
    engine.run_request(prompts[0], 2, 8)  # warm-up
    samples = measure_rounds(engine, prompts, max_new_tokens, k_max, repeats, temperature, progress=progress)
    fit = fit_profile(samples, k_max, name, hardware=hardware, seconds=time.perf_counter() - t0)
    if getattr(engine, "head", None) is not None:
        head = head_cost(engine, prompts, max_new_tokens, k_max, temperature)
        prof = with_drafters(fit.profile, ((NGRAM_DRAFTER, DraftCost("lookup")), (HEAD_DRAFTER, head)))
        fit.profile = replace(prof, description=f"{prof.description}; drafters: draft (the model above), ngram "
                                                f"(prompt lookup, no draft cost), head (its drafting phases in "
                                                f"rounds of fixed K = 1..{k_max} at T = {temperature:g}: fixed + "
                                                f"per_token x K)")
        fit.seconds = time.perf_counter() - t0
    return fit


def head_cost(engine: Any, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int],
              k_max: int, temperature: float = 0.0) -> DraftCost:
    """The draft head's cost, fitted to its drafting phases: rounds with every fixed K = 1..k_max drafted by the
    head at ``temperature`` (sampling draws from the head's softmax, so it costs more than greedy)."""
    samples = [s for ids, n in zip(prompts, max_new_tokens) for k in range(1, k_max + 1)
               for s in cycled_rounds(engine, ids, int(n), [k], temperature, drafter=HEAD_DRAFTER)]
    return fit_head_cost(samples)


def fit_head_cost(samples: Sequence[RoundSample]) -> DraftCost:
    """``phase = fixed + per_token * drafted`` by least squares over the head's drafting phases (both >= 0; the
    head always proposes K tokens, so the rounds need at least two distinct K; rounds that drafted nothing are
    left out)."""
    samples = [s for s in samples if s.drafted > 0]
    if len({s.drafted for s in samples}) < 2:
        raise SpecgymError("calibration: the draft head drafted too few rounds to fit its cost; decode longer "
                           "requests")
    d = np.asarray([s.drafted for s in samples], dtype=np.float64)
    t = np.asarray([s.draft_phase_ms for s in samples], dtype=np.float64)
    keep = t / d <= np.median(t / d) * SPIKE  # drop preemption spikes
    per_token, fixed = np.polyfit(d[keep], t[keep], 1)
    if fixed < 0:
        per_token, fixed = float(t[keep].sum() / d[keep].sum()), 0.0
    return DraftCost("model", round(float(fixed), 4), round(float(per_token), 4))


def with_drafters(profile: CostProfile, others: Sequence[tuple[str, DraftCost]]) -> CostProfile:
    """``profile`` pricing its default drafter as it does and ``others`` beside it (names already there are
    replaced): how a fitted profile keeps the costs of the drafters a calibration did not time."""
    default = profile.drafters[:1] or ((IMPLICIT_DRAFTER, DraftCost("model", 0.0, profile.draft_ms)),)
    names = {n for n, _ in others}
    return replace(profile, drafters=(*default, *[(n, dc) for n, dc in profile.drafters[1:] if n not in names],
                                      *others))

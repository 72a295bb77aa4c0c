"""The live bench's second phase: what the replay harness predicts for every row (:func:`predict`), priced three ways
(the profile controllers saw, the profile fitted to the calibration rounds interleaved with the measurement, the
micro-benchmarks), from each row's replay on the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specgym.baselines.tree_chain import ChainAsTree
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.kinds import HEAD_DRAFTER
from specgym.envs.engines.live.calibration import fit_head_cost, fit_profile, with_drafters
from specgym.envs.engines.live.profiler import extend_tree_verify
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.eval.bench.live_measure import LiveControllers, LiveSetup, Measurement
from specgym.eval.drafter_runner import run_drafter_controller
from specgym.eval.runner import run_controller
from specgym.eval.tree_runner import run_tree_controller


@dataclass
class Prediction:
    """The replay's prediction of every row.

    Attributes:
        pricing: The profile the prediction is priced by: fitted to the interleaved calibration rounds (with the draft
            head's cost from its interleaved rounds) where they cover every K, else the profile controllers saw.
        micro: The micro-benchmarked profile, with the other drafters' costs of the profile controllers saw.
        ms: Row -> its replayed time (ms) on the measured requests, decisions under the profile controllers saw:
            priced by that profile, by ``pricing`` and by ``micro``.
    """

    pricing: CostProfile
    micro: CostProfile
    ms: dict[str, tuple[float, float, float]] = field(default_factory=dict)


def _pricing(console: Any, setup: LiveSetup, m: Measurement) -> tuple[CostProfile, CostProfile]:
    """The pricing profile and the micro-benchmarked one, each pricing the other drafters as the profile controllers
    saw does (printed: which it is, and the head's interleaved cost)."""
    prof, k_max = setup.prof, setup.k_max
    covered = {smp.drafted for smp in m.cal_samples}
    interleaved = fit_profile(m.cal_samples, k_max, name=f"interleaved-{setup.pair_name}",
                              verify_samples=m.head_samples) if covered >= set(range(k_max + 1)) else None
    pricing = prof if interleaved is None else interleaved.profile
    if interleaved is not None:
        console.print(f"interleaved calibration: {interleaved.summary()}", highlight=False)
    # the interleaved rounds and the micro-benchmarks time the draft model: the other drafters keep prof's costs,
    # but for the head's when its interleaved rounds timed it
    pricing, micro = (with_drafters(p, prof.drafters[1:]) if prof.drafters[1:] and p is not prof else p
                      for p in (pricing, setup.micro))
    if pricing is not prof and len({smp.drafted for smp in m.head_samples}) >= 2:
        pricing = with_drafters(pricing, ((HEAD_DRAFTER, fit_head_cost(m.head_samples)),))
        hc = pricing.draft_cost(HEAD_DRAFTER)
        console.print(f"draft head timed in {len(m.head_samples)} interleaved rounds: {hc.fixed_ms:.3f} ms + "
                      f"{hc.per_token_ms:.3f} ms per token", highlight=False)
    source = (f"fitted to {len(m.cal_samples)} calibration rounds interleaved with the measurement"
              if pricing is not prof else prof.name)
    console.print(f"pricing profile: {source}: t_AR {pricing.t_ar_ms:.2f} ms, round(1) {pricing.round_time(1):.2f} "
                  f"ms, round({k_max}) {pricing.round_time(k_max):.2f} ms", highlight=False)
    return pricing, micro


@dataclass
class _Replays:
    """The replay engines of one prediction: chain rows on ``chain`` (decided and priced under the profile
    controllers saw) and ``chain_micro``; drafter rows on one engine per profile; tree rows on ``trees``."""

    setup: LiveSetup
    ctrls: LiveControllers
    pricing: CostProfile
    micro: CostProfile
    chain: TraceEngine
    chain_micro: TraceEngine
    trees: dict[str, TreeEngine]

    def ms(self, spec: str) -> tuple[float, float, float]:
        """Replay time of ``spec`` on the measured requests, decisions under the profile controllers saw, priced by
        it, by ``pricing`` (the same rounds: controllers decide as they did live) and by the micro-benchmarks."""
        s, requests = self.setup, self.setup.requests
        profiles = (s.prof, self.pricing, self.micro)
        if spec in s.drafter_specs:  # the replay of the same decisions kind: every drafter's runs, each engine's costs
            up, pr, mi = (float(run_drafter_controller(TraceEngine(s.wl, p, s.k_max, seed=0), requests,
                                                       self.ctrls.fresh(spec)).time_ms.sum()) for p in profiles)
            return up, pr, mi
        if spec in s.tree_specs:
            ctrl = self.ctrls.fresh(spec)
            if isinstance(ctrl, ChainAsTree):  # the width-1 tree is the chain round: predicted as the chain
                return self.ms(spec.partition(":")[2])
            up, pr, mi = (float(run_tree_controller(self.trees[p.name], requests, ctrl).time_ms.sum())
                          for p in profiles)
            return up, pr, mi
        res = run_controller(self.chain, requests, self.ctrls.fresh(spec), trace=requests.tolist())
        repriced = sum(self.pricing.round_time(d) for rounds in res.traces.values() for _, _, d, _ in rounds)
        micro_ms = float(run_controller(self.chain_micro, requests, self.ctrls.fresh(spec)).time_ms.sum())
        return float(res.time_ms.sum()), float(repriced), micro_ms


def predict(console: Any, setup: LiveSetup, m: Measurement, ctrls: LiveControllers) -> Prediction:
    """Every row's replayed time on the measured requests, priced three ways (:class:`Prediction`)."""
    wl, k_max = setup.wl, setup.k_max
    chain = TraceEngine(wl, setup.prof, k_max, seed=0)
    chain_micro = TraceEngine(wl, setup.micro, k_max, seed=0)
    pricing, micro = _pricing(console, setup, m)
    trees: dict[str, TreeEngine] = {}
    if setup.tree_specs:
        pricing = extend_tree_verify(pricing, micro)
        trees = {p.name: TreeEngine(wl, p, k_max) for p in (setup.prof, pricing, micro)}
    replays = _Replays(setup, ctrls, pricing, micro, chain, chain_micro, trees)
    return Prediction(pricing, micro, {spec: replays.ms(spec) for spec in setup.specs})

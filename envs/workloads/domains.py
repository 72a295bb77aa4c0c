"""Training distributions over (workload, cost profile): domain randomisation for policies that generalise.

A controller deployed on unknown hardware with an unknown draft should read the cost profile and adapt online to the
draft's calibration. :class:`DomainDistribution` gives every training episode a fresh *domain*: a workload drawn
from a pool (recorded traces and synthetic families with randomised parameters, including over- and
under-confident drafts) re-priced under a randomised cost profile:

* ``cost ratio`` (``draft_ms / t_AR``) log-uniform in ``[0.01, 0.3]``;
* ``verify slope``: verifying ``n`` tokens costs ``t_AR * (1 + slope * (n - 1))``, slope uniform in ``[0, 0.2]``;
* ``round overhead`` uniform in ``[0, 0.1] * t_AR``.

Time is measured in units of ``t_AR`` (rewards and features are ratios, so the scale does not matter).
:func:`synthetic_pool` builds the synthetic part deterministically from a seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import specgym.catalogue as catalogue
from specgym.envs.core.cost import CostProfile
from specgym.envs.workloads.synthetic import (
    CategorySpec,
    RegimeSpec,
    SyntheticSpec,
    generate_workload,
)
from specgym.envs.workloads.trace_format import Workload, cached_workload
from specgym.errors import SpecgymError


@dataclass(frozen=True)
class ProfileRanges:
    """Ranges of the randomised cost profiles (see the module docstring)."""

    cost_ratio: tuple[float, float] = (0.01, 0.3)
    verify_slope: tuple[float, float] = (0.0, 0.2)
    overhead: tuple[float, float] = (0.0, 0.1)
    t_ar_ms: float = 10.0
    k_max: int = 16

    def sample(self, rng: np.random.Generator) -> CostProfile:
        """One random profile (source ``synthetic``)."""
        lo, hi = self.cost_ratio
        c = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        s = rng.uniform(*self.verify_slope)
        o = rng.uniform(*self.overhead)
        t = self.t_ar_ms
        return CostProfile("randomised", c * t, tuple(t * (1.0 + s * n) for n in range(self.k_max + 1)), o * t,
                           source="synthetic", description=f"randomised: cost ratio {c:.3f}, verify slope {s:.3f}, "
                                                           f"overhead {o:.3f} t_AR")


@dataclass(frozen=True)
class ProfileJitter:
    """Cost profiles around one profile: its draft cost, verify slope and round overhead each scaled by a factor
    drawn log-uniformly in ``[1 / spread, spread]`` (``t_AR`` and every other term kept). What a specialist policy
    trains on so that a machine of the same kind with other costs is inside its experience (PPO config key
    ``profile_jitter``).

    Attributes:
        base: The profile jittered (the workload's own, or the run's ``profile``).
        spread: The largest factor (``>= 1``; 1 = the base profile only).
    """

    base: CostProfile
    spread: float = 2.5

    def sample(self, rng: np.random.Generator) -> CostProfile:
        """One jittered profile (source ``synthetic``)."""
        w = math.log(self.spread)
        f_draft, f_slope, f_over = (math.exp(rng.uniform(-w, w)) for _ in range(3))
        b = self.base
        v = np.asarray(b.verify_ms, dtype=np.float64)
        verify = tuple(float(x) for x in v[0] + f_slope * (v - v[0]))
        return replace(b, name=f"{b.name}~jitter", draft_ms=b.draft_ms * f_draft, verify_ms=verify,
                       round_overhead_ms=b.round_overhead_ms * f_over, source="synthetic",
                       description=f"{b.name} jittered: draft x{f_draft:.2f}, verify slope x{f_slope:.2f}, "
                                   f"overhead x{f_over:.2f}")


class DomainDistribution:
    """Workloads (with sampling weights) x randomised cost profiles.

    Args:
        workloads: The pool; each episode draws one (by ``weights``) and one of its requests (from ``split``).
        weights: Relative sampling weight of each workload (default: equal).
        profiles: Ranges of the randomised profiles.
        own_profile_share: Share of episodes that keep the workload's own profile instead (recorded workloads
            carry a measured one).
    """

    def __init__(self, workloads: Sequence[Workload], weights: Sequence[float] | None = None,
                 profiles: ProfileRanges | ProfileJitter | None = None, own_profile_share: float = 0.1):
        if not workloads:
            raise SpecgymError("a domain distribution needs at least one workload")
        self.workloads = list(workloads)
        w = np.ones(len(self.workloads)) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (len(self.workloads),) or (w < 0).any() or w.sum() <= 0:
            raise SpecgymError("domain weights must be non-negative, one per workload, not all zero")
        self.p = w / w.sum()
        self.profiles = profiles or ProfileRanges()
        self.own_profile_share = float(own_profile_share)

    @property
    def fit_split(self) -> str:
        """The split training draws from: the pool's one fit split (:attr:`Workload.fit_split`)."""
        splits = {w.fit_split for w in self.workloads}
        if len(splits) != 1:
            raise SpecgymError(f"a domain pool mixes fit splits {sorted(splits)}: train on workloads that fit on one")
        return splits.pop()

    def sample(self, rng: np.random.Generator) -> tuple[Workload, CostProfile]:
        """One domain: a workload and the profile its episode is priced with."""
        wl = self.workloads[int(rng.choice(len(self.workloads), p=self.p))]
        if rng.random() < self.own_profile_share:
            return wl, wl.profile
        return wl, self.profiles.sample(rng)

    def describe(self) -> dict:
        """JSON-ready description (run configs, policy cards)."""
        r = self.profiles
        profiles: dict[str, Any] = (
            {"jitter_of": r.base.name, "spread": r.spread} if isinstance(r, ProfileJitter) else
            {"cost_ratio": list(r.cost_ratio), "verify_slope_per_token": list(r.verify_slope),
             "overhead_share_of_t_ar": list(r.overhead)})
        return {"workloads": [{"name": wl.name, "synthetic": wl.is_synthetic, "requests": wl.n_requests,
                               "weight": round(float(p), 4)} for wl, p in zip(self.workloads, self.p)],
                "profiles": profiles, "own_profile_share": self.own_profile_share}


def synthetic_pool(n: int = 36, requests: int = 120, seed: int = 1000) -> list[Workload]:
    """``n`` synthetic workloads (labelled synthetic) with random parameters, cycling through three families.

    * ``steady``: one or two categories, per-request acceptance 0.3-0.95, greedy or sampled;
    * ``mix``: three categories with random acceptance levels (a SpecLane-like mix);
    * ``regimes``: flat / rugged stretches with random levels and lengths (an ASSC-like workload).

    Every family draws the strength of the confidence signal (``kappa``, ``sigma``) and a mis-calibration
    (``conf_scale`` log-uniform in [0.5, 2], ``conf_shift`` uniform in [-1.5, 1.5]), so the pool holds over- and
    under-confident drafts.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        family = ("steady", "mix", "regimes")[i % 3]
        common: dict[str, Any] = {"min_len": 96, "max_len": 320, "kappa": float(rng.uniform(0.0, 3.0)),
                  "sigma": float(rng.uniform(0.3, 1.5)), "conf_scale": float(math.exp(rng.uniform(-0.7, 0.7))),
                  "conf_shift": float(rng.uniform(-1.5, 1.5)), "greedy": bool(rng.random() < 0.6),
                  "concentration": float(rng.uniform(3.0, 12.0))}
        if family == "steady":
            cats = tuple(CategorySpec(f"c{j}", 1.0, float(rng.uniform(0.3, 0.95)), 0.08)
                         for j in range(int(rng.integers(1, 3))))
            spec = SyntheticSpec(categories=cats, **common)
        elif family == "mix":
            cats = tuple(CategorySpec(name, float(w), float(rng.uniform(0.25, 0.9)))
                         for name, w in (("chat", 0.5), ("code", 0.3), ("math", 0.2)))
            spec = SyntheticSpec(categories=cats, **common)
        else:
            reg = RegimeSpec(flat_alpha=float(rng.uniform(0.8, 0.99)), flat_mean_len=float(rng.uniform(15, 60)),
                             rugged_alpha=float(rng.uniform(0.1, 0.5)), rugged_mean_len=float(rng.uniform(10, 40)))
            spec = SyntheticSpec(categories=(CategorySpec("text", 1.0, 0.0, 0.0),), regimes=reg, **common)
        out.append(generate_workload(spec, requests, seed=seed + i, name=f"pool-{family}-{i:02d}"))
    return out


# ----------------------------------------------------------------------------------------------------------------
# The shipped training distribution and the held-out generalisation suite
# ----------------------------------------------------------------------------------------------------------------

#: Recorded workloads whose *train* split is part of the generalist training distribution.
TRAIN_RECORDED = ("tinypair-greedy",)
#: Recorded workloads held out of training entirely (the suite's recorded cells): another temperature of the
#: trained pair, and both workloads of a pair the policies never saw.
HELD_OUT_RECORDED = ("tinypair-t08", "midpair-greedy", "midpair-t08")
#: Shipped profiles never used as such in training (the suite's profile axis).
SUITE_PROFILES = ("cpu-midpair", "gpu-like-published", "speclane-table")
#: Synthetic suite workloads: shipped presets regenerated with a seed no training pool uses.
SUITE_SYNTHETIC = ("speclane-mix", "assc-regimes")
SUITE_SEED = 777_000


def generalist_domains(seed: int = 1000, recorded_weight: float = 6.0) -> DomainDistribution:
    """The shipped policies' training distribution: the synthetic pool plus the recorded train workloads.

    Recorded workloads listed in :data:`TRAIN_RECORDED` that are not shipped (yet) are skipped. Each recorded
    workload is drawn ``recorded_weight`` times as often as one synthetic pool workload.
    """
    pool = synthetic_pool(seed=seed)
    shipped = set(catalogue.names("workload"))
    recorded = [cached_workload(n) for n in TRAIN_RECORDED if n in shipped]
    return DomainDistribution(pool + recorded, [1.0] * len(pool) + [recorded_weight] * len(recorded))


@dataclass(frozen=True)
class Cell:
    """One held-out evaluation cell: a workload (and the requests of it to use) priced with a profile."""

    workload: str
    profile: str
    split: str

    @property
    def name(self) -> str:
        return f"{self.workload} x {self.profile}"


def suite_cells() -> list[Cell]:
    """The generalisation suite: held-out recorded workloads (all requests), the recorded train workloads' test
    splits, and synthetic presets regenerated with an unseen seed (all requests), each priced with every profile of
    :data:`SUITE_PROFILES` (shipped ones only)."""
    shipped = set(catalogue.names("workload"))
    profiles = [p for p in SUITE_PROFILES if p in set(catalogue.names("profile"))]
    workloads = [(n, "all") for n in HELD_OUT_RECORDED if n in shipped]
    workloads += [(n, "test") for n in TRAIN_RECORDED if n in shipped]
    workloads += [(f"{n}@{SUITE_SEED}", "all") for n in SUITE_SYNTHETIC]
    return [Cell(w, p, split) for w, split in workloads for p in profiles]


def cell_workload(name: str, requests: int = 600) -> Workload:
    """The workload of a suite cell: a shipped name, or ``PRESET@SEED`` (a synthetic preset generated afresh)."""
    if "@" in name:
        preset, seed = name.split("@")
        return generate_workload(preset, requests, seed=int(seed), name=name)
    return cached_workload(name)

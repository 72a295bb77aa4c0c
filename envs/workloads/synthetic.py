"""Synthetic workload generator. Every workload it makes is labelled synthetic.

Model: each request belongs to a category with a mean acceptance ``alpha`` (jittered per request). Optionally a
hidden regime (flat / rugged) follows a two-state Markov chain along the completion, with geometric run lengths,
and sets the acceptance level instead. The per-position acceptance probability ``p`` is Beta-distributed around the
level. Greedy traces store the 0/1 outcome ``match ~ Bernoulli(p)``; sampled traces store ``p`` itself.
Draft confidence carries real but imperfect signal about the outcome:
``draft_conf = sigmoid(conf_scale * (logit(p) + kappa * (match - p) + sigma * noise) + conf_shift)``; draft entropy
falls as confidence rises. ``conf_scale`` / ``conf_shift`` other than 1 / 0 make the draft mis-calibrated: over-
confident (scale > 1 or shift > 0) or under-confident (scale < 1 or shift < 0) relative to its acceptance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from specgym.envs.core.cost import CostProfile
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import Workload, assign_splits, validate_workload
from specgym.errors import SpecgymError


@dataclass(frozen=True)
class CategorySpec:
    """One request category: its share of requests and its mean acceptance."""

    name: str
    weight: float
    alpha: float
    alpha_jitter: float = 0.05


@dataclass(frozen=True)
class RegimeSpec:
    """Two-state hidden regime: flat (easy, high acceptance) and rugged (hard) stretches."""

    flat_alpha: float = 0.96
    flat_mean_len: float = 40.0
    rugged_alpha: float = 0.28
    rugged_mean_len: float = 25.0


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of a synthetic workload (all stored in the workload's metadata).

    Attributes:
        categories: Request categories.
        min_len / max_len: Completion length range (uniform, inclusive).
        regimes: Hidden regime chain; None = the category's alpha holds for the whole request.
        concentration: Beta concentration of per-position p around the level (higher = less spread).
        greedy: True stores 0/1 outcomes (temperature 0); False stores p (temperature ``temperature``).
        temperature: Temperature recorded for sampled traces.
        kappa: Strength of the outcome signal in draft confidence.
        sigma: Noise in draft confidence (logit scale).
        profile: Name of the shipped cost profile the workload is generated for.
        conf_scale: Logit-scale multiplier of draft confidence (1 = calibrated up to noise).
        conf_shift: Logit-scale offset of draft confidence (0 = calibrated up to noise).
    """

    categories: tuple[CategorySpec, ...]
    min_len: int = 128
    max_len: int = 384
    regimes: RegimeSpec | None = None
    concentration: float = 6.0
    greedy: bool = True
    temperature: float = 0.8
    kappa: float = 2.0
    sigma: float = 0.8
    profile: str = "speclane-table"
    conf_scale: float = 1.0
    conf_shift: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready parameters."""
        return asdict(self)


def steady_spec(alpha: float, min_len: int, max_len: int, category: str = "steady",
                profile: str = "speclane-table") -> SyntheticSpec:
    """A steady geometric workload: every position accepts with probability ``alpha``, independently.

    Sampled (not greedy) traces storing ``p_accept = alpha``; draft features carry no signal. The reference case
    of the closed-form expectation ``(1 - a^(K+1)) / (1 - a)``.
    """
    return SyntheticSpec(categories=(CategorySpec(category, 1.0, alpha, 0.0),), min_len=min_len, max_len=max_len,
                         concentration=1e9, greedy=False, sigma=0.0, kappa=0.0, profile=profile)


PRESETS: dict[str, SyntheticSpec] = {
    "speclane-mix": SyntheticSpec(
        categories=(
            CategorySpec("chat", 0.5, 0.55),
            CategorySpec("code", 0.3, 0.82),
            CategorySpec("math", 0.2, 0.41),
        ),
        min_len=128,
        max_len=384,
        profile="speclane-table",
    ),
    "assc-regimes": SyntheticSpec(
        categories=(
            CategorySpec("code", 0.5, 0.0, 0.0),
            CategorySpec("reasoning", 0.5, 0.0, 0.0),
        ),
        min_len=128,
        max_len=384,
        regimes=RegimeSpec(),
        profile="assc-illustrative",
    ),
    # Every request at acceptance 0.55, i.i.d. per position: the workload that reproduces the fixed-K rows of the
    # SpecLane write-up's table (K=4 -> 45.5 tok/s, K=8 -> 36.0 tok/s), unlike the mix it says it used.
    "speclane-uniform": steady_spec(0.55, 128, 384, category="uniform"),
    "geometric": steady_spec(0.7, 256, 256),
}


def _check_spec(spec: SyntheticSpec) -> None:
    if not spec.categories:
        raise SpecgymError("synthetic spec: at least one category is required")
    if not 1 <= spec.min_len <= spec.max_len:
        raise SpecgymError(f"synthetic spec: need 1 <= min_len <= max_len, got {spec.min_len}..{spec.max_len}")
    for c in spec.categories:
        if not 0.0 <= c.alpha <= 1.0:
            raise SpecgymError(f"synthetic spec: category {c.name!r} alpha {c.alpha} out of [0, 1]")
        if c.weight <= 0:
            raise SpecgymError(f"synthetic spec: category {c.name!r} weight must be > 0")


def _regime_levels(rng: np.random.Generator, n: int, reg: RegimeSpec) -> np.ndarray:
    """Per-position acceptance level along one request from the two-state chain."""
    levels = np.empty(n, dtype=np.float64)
    state = rng.random() < reg.flat_mean_len / (reg.flat_mean_len + reg.rugged_mean_len)
    i = 0
    while i < n:
        mean = reg.flat_mean_len if state else reg.rugged_mean_len
        run = int(rng.geometric(1.0 / mean))
        levels[i : i + run] = reg.flat_alpha if state else reg.rugged_alpha
        i += run
        state = not state
    return levels


def generate_workload(
    spec: SyntheticSpec | str,
    n_requests: int,
    seed: int = 0,
    name: str | None = None,
    profile: CostProfile | None = None,
) -> Workload:
    """Generate a synthetic workload, deterministic in ``seed``.

    Args:
        spec: A :class:`SyntheticSpec` or a preset name (``speclane-mix``, ``assc-regimes``, ``geometric``).
        n_requests: Number of requests (>= 1).
        seed: Seed of every random draw, including the train/val/test split.
        name: Workload name; defaults to the preset name.
        profile: Cost profile to attach; defaults to the spec's shipped profile.
    """
    preset = None
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise SpecgymError(f"unknown synthetic preset {spec!r}; choose one of {', '.join(PRESETS)}")
        preset, spec = spec, PRESETS[spec]
    _check_spec(spec)
    if n_requests < 1:
        raise SpecgymError(f"--requests must be >= 1, got {n_requests}")
    rng = np.random.default_rng(seed)
    weights = np.array([c.weight for c in spec.categories], dtype=np.float64)
    cat_idx = rng.choice(len(spec.categories), size=n_requests, p=weights / weights.sum())
    lengths = rng.integers(spec.min_len, spec.max_len + 1, size=n_requests)
    offsets = np.zeros(n_requests + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])

    level = _acceptance_levels(rng, spec, cat_idx, lengths)
    p, match = _acceptance(rng, spec, level)
    p_accept = match if spec.greedy else p
    temperature = 0.0 if spec.greedy else spec.temperature
    conf, entropy = _draft_signals(rng, spec, p, match)

    prof = profile or load_profile(spec.profile)
    cat_names = np.array([c.name for c in spec.categories], dtype=object)
    wl_name = name or preset or "synthetic"
    params = spec.to_dict()
    wl = Workload(
        name=wl_name,
        source={"kind": "synthetic", "generator": "specgym.envs.workloads.synthetic", "preset": preset, "seed": seed,
                "params": params},
        profile=prof,
        request_id=np.array([f"{wl_name}-{i:06d}" for i in range(n_requests)], dtype=object),
        category=cat_names[cat_idx],
        temperature=np.full(n_requests, temperature, dtype=np.float32),
        prompt_len=rng.integers(16, 512, size=n_requests).astype(np.int32),
        split=assign_splits(n_requests, seed),
        offsets=offsets,
        p_accept=p_accept.astype(np.float32),
        draft_conf=conf.astype(np.float32),
        draft_entropy=entropy.astype(np.float32),
        target_entropy=np.full(total, np.nan, dtype=np.float32),
        split_seed=seed,
    )
    validate_workload(wl, where=f"synthetic workload {wl_name!r}")
    return wl


def _acceptance_levels(rng: np.random.Generator, spec: SyntheticSpec, cat_idx: np.ndarray,
                       lengths: np.ndarray) -> np.ndarray:
    """Acceptance level per position: the category's alpha (plus a per-request jitter) or the regime chain."""
    if spec.regimes is None:
        alphas = np.array([c.alpha for c in spec.categories])[cat_idx]
        jitter = np.array([c.alpha_jitter for c in spec.categories])[cat_idx]
        req_alpha = np.clip(alphas + jitter * rng.standard_normal(len(lengths)), 0.02, 0.98)
        return np.repeat(req_alpha, lengths)
    return np.concatenate([_regime_levels(rng, int(n), spec.regimes) for n in lengths])


def _acceptance(rng: np.random.Generator, spec: SyntheticSpec, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-position acceptance probability ``p`` around the level (Beta with the spec's concentration) and the
    outcome ``match``: a drawn 0/1 for greedy traces, ``p`` itself for sampled ones."""
    c = spec.concentration
    if c >= 1e6:
        p = level.copy()
    else:
        lv = np.clip(level, 1e-3, 1 - 1e-3)
        p = rng.beta(lv * c, (1 - lv) * c)
    if spec.greedy:
        return p, (rng.random(level.size) < p).astype(np.float64)
    return p, p


def _draft_signals(rng: np.random.Generator, spec: SyntheticSpec, p: np.ndarray,
                   match: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The draft's confidence (a noisy logit of ``p`` pulled towards the outcome by ``kappa``, then the spec's
    miscalibration) and its entropy, per position."""
    pc = np.clip(p, 1e-4, 1 - 1e-4)
    logit = np.log(pc) - np.log1p(-pc)
    z = logit + spec.kappa * (match - p) + spec.sigma * rng.standard_normal(p.size)
    if spec.conf_scale != 1.0 or spec.conf_shift != 0.0:
        z = spec.conf_scale * z + spec.conf_shift
    conf = 1.0 / (1.0 + np.exp(-z))
    conf = np.clip(conf, 1e-4, 1.0)
    entropy = -np.log(conf) * (1.0 + 0.5 * (1.0 - conf)) * np.exp(0.25 * rng.standard_normal(p.size))
    return conf, entropy


def spec_with(spec: SyntheticSpec | str, **changes: Any) -> SyntheticSpec:
    """A copy of a spec (or preset) with some parameters changed, for custom mixes."""
    base = PRESETS[spec] if isinstance(spec, str) else spec
    return replace(base, **changes)

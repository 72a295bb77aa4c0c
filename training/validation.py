"""Validation of an in-memory policy during and after training: one :class:`ValidationResult` for every mode.

A validator runs the policy and its references on held-out requests with the harness's own steps
(:func:`~specgym.eval.harness.open_replay`, :func:`~specgym.eval.references.references`,
:func:`~specgym.eval.harness.run_controllers`) and the report's own figures (:func:`~specgym.eval.metrics.figures`),
without the report around them (no bootstrap intervals, no traces): a validation costs the runs and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import specgym.catalogue as catalogue
from specgym.agents.artifact import PolicyArtifact
from specgym.agents.modes import get_mode
from specgym.baselines.marginal import MarginalStop
from specgym.envs.core.controller import Controller
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.kinds import kind_row
from specgym.envs.core.tree import TreeController
from specgym.envs.profiles import load_batch_profile
from specgym.envs.workloads.domains import TRAIN_RECORDED, ProfileRanges, synthetic_pool
from specgym.envs.workloads.trace_format import Workload, cached_workload
from specgym.eval.batch_eval import compare
from specgym.eval.harness import open_replay, resolve_controllers, run_controllers
from specgym.eval.metrics import Figures, figures
from specgym.eval.references import references
from specgym.eval.stats import geomean

#: The baselines a validation compares with: (short name in the figures, the baseline's spec).
COMPARED_BASELINES = (("marginal", "marginal"), ("speclane", "speclane"), ("confidence", "confidence:0.4"),
                      ("goodput", "goodput"), ("sequoia", "tree-sequoia"), ("lookup-rule", "lookup-rule:3"),
                      ("drafter-marginal", "drafter-marginal"), ("budget", "the budget rule"),
                      ("eagle-head", "tree-eagle:fit@head"))
_LABEL = dict(COMPARED_BASELINES)
_SHORT = {spec: name for name, spec in COMPARED_BASELINES}

#: ``validate(artifact, max_requests) -> result``
Validator = Callable[[PolicyArtifact, "int | None"], "ValidationResult"]


@dataclass
class ValidationResult:
    """The validation figures of a policy: what a run logs (``eval/*``), keeps its best model by, and summarises.

    Attributes:
        speedup_vs_best_fixed: Against the best fixed K (batch: the best static K; domain-randomised: the geometric
            mean over the validation cells).
        split: What was validated on (``val``, ``val cells``).
        requests: Requests served.
        vs: ``{short name: speedup}`` against each compared baseline (:data:`COMPARED_BASELINES`).
        throughput_tok_s: The policy's throughput (None for a mean over cells).
        speedup_vs_ar: Against plain decoding (domain-randomised: the mean over cells).
        oracle_ratio: T_oracle / T (None where no oracle ran).
        mean_k: Mean drafted tokens per round.
        mean_accept_len: Produced tokens per round.
        draft_waste: Share of drafted tokens rejected.
        best_fixed_k: The best fixed K of the split (single-workload validations).
        best_fixed_tok_s: Its throughput.
        oracle_tok_s: The clairvoyant oracle's throughput.
        baseline_tok_s: ``{short name: throughput}`` of the compared baselines.
        cells: Validation cells (domain-randomised runs).
        replications: Mixed-concurrency replications (batch runs).
    """

    speedup_vs_best_fixed: float
    split: str
    requests: int
    vs: dict[str, float] = field(default_factory=dict)
    throughput_tok_s: float | None = None
    speedup_vs_ar: float | None = None
    oracle_ratio: float | None = None
    mean_k: float | None = None
    mean_accept_len: float | None = None
    draft_waste: float | None = None
    best_fixed_k: int | None = None
    best_fixed_tok_s: float | None = None
    oracle_tok_s: float | None = None
    baseline_tok_s: dict[str, float] = field(default_factory=dict)
    cells: int | None = None
    replications: int | None = None

    def figure(self, key: str) -> float | None:
        """A figure by its flat name (``speedup_vs_marginal``, ``oracle_ratio``, ...); None if not measured."""
        if key.startswith("speedup_vs_") and key[len("speedup_vs_"):] in self.vs:
            return self.vs[key[len("speedup_vs_"):]]
        value = getattr(self, key, None)
        return value if isinstance(value, (int, float)) else None

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON record (``summary.json``'s ``val``; ``speedup_vs_X`` / ``X_tok_s`` per baseline)."""
        out = {k: v for k, v in asdict(self).items() if v is not None and k not in ("vs", "baseline_tok_s")}
        out.update({f"speedup_vs_{k}": v for k, v in self.vs.items()})
        out.update({f"{k}_tok_s": v for k, v in self.baseline_tok_s.items()})
        return out

    def describe(self) -> str:
        """One line of the figures measured."""
        parts = [] if self.throughput_tok_s is None else [f"{self.throughput_tok_s:.2f} tok/s"]
        if self.best_fixed_k is not None:
            parts.append(f"vs best fixed K={self.best_fixed_k} {self.speedup_vs_best_fixed:.3f}x")
        elif self.replications is not None:
            parts.append(f"vs best static K {self.speedup_vs_best_fixed:.3f}x ({self.replications} "
                         "mixed-concurrency replications)")
        else:
            parts.append(f"vs best fixed K {self.speedup_vs_best_fixed:.3f}x (geo-mean of {self.cells} cells)")
        parts += [f"vs {_LABEL[k]} {v:.3f}x" for k, v in self.vs.items()]
        if self.oracle_ratio is not None:
            parts.append(f"oracle ratio {self.oracle_ratio:.3f}")
        return ", ".join(parts)


def _single(policy: Controller | TreeController, k_max: int, baselines: Sequence[str], workload: Any, split: str,
            max_requests: int | None, seed: int = 0, profile: str | CostProfile | None = None) -> ValidationResult:
    """A validation on one workload's split: the policy against the best fixed K and ``baselines``."""
    replay = open_replay(workload, split, seed, k_max, profile, max_requests)
    named = resolve_controllers([",".join(baselines), policy], k_max)
    refs = references(replay.engine, replay.requests)
    figs = {row.spec: figures(run, refs) for row, run in zip(named, run_controllers(replay, named, refs))}
    mine = figs.pop(policy.name)
    others: dict[str, Figures] = figs
    best = figures(refs.fixed[refs.best_k], refs)
    short = {spec: name for name, spec in COMPARED_BASELINES}
    return ValidationResult(
        speedup_vs_best_fixed=mine.speedup_vs_best_fixed, split=split, requests=len(refs.requests),
        vs={short[s]: mine.throughput_tok_s / f.throughput_tok_s for s, f in others.items()},
        throughput_tok_s=mine.throughput_tok_s, speedup_vs_ar=mine.speedup_vs_ar, oracle_ratio=mine.oracle_ratio,
        mean_k=mine.mean_k, mean_accept_len=mine.mean_accept_len, draft_waste=mine.draft_waste,
        best_fixed_k=refs.best_k, best_fixed_tok_s=best.throughput_tok_s,
        oracle_tok_s=refs.tokens / refs.t_oracle * 1000.0,
        baseline_tok_s={short[s]: f.throughput_tok_s for s, f in others.items()})


def validate_policy(artifact: PolicyArtifact, workload: Any, split: str = "val", max_requests: int | None = None,
                    seed: int = 0, profile: str | CostProfile | None = None) -> ValidationResult:
    """A K-, token- or tree-mode policy against the best fixed K and its mode's compared baselines
    (:attr:`~specgym.agents.modes.PolicyMode.compared`: ``speclane``; ``confidence:0.4`` too in token mode;
    ``tree-sequoia`` in tree mode; EAGLE-2 fitted on the head's trees, ``tree-eagle:fit@head``, for a tree policy on
    the head), under ``profile`` (the run's; default the workload's own)."""
    row = artifact.row
    policy = row.controller(artifact, f"{row.spec_prefix} (training)", artifact.k_max)
    compared = row.compared if artifact.drafter is None else (f"tree-eagle:fit@{artifact.drafter}",)
    return _single(policy, artifact.k_max, compared, workload, split, max_requests, seed, profile)


def generalist_cells(seed: int = 9000) -> list[tuple[str, Workload, CostProfile]]:
    """Validation cells of domain-randomised runs: ``(label, workload, profile)``.

    Six synthetic workloads from a pool seed no training or suite workload uses, and the recorded training
    workloads' *val* splits (reduced to a val-only workload), each priced with two fixed randomised profiles.
    """
    workloads = synthetic_pool(n=6, requests=60, seed=seed)
    for name in TRAIN_RECORDED:
        if name in catalogue.names("workload"):
            wl = cached_workload(name)
            workloads.append(wl.subset(wl.split_indices("val")))
    rng = np.random.default_rng(seed)
    profiles = [ProfileRanges().sample(rng) for _ in range(2)]
    return [(f"{wl.name}/p{i}", wl, prof) for wl in workloads for i, prof in enumerate(profiles)]


def validate_generalist(artifact: PolicyArtifact, cells: list[tuple[str, Workload, CostProfile]],
                        max_requests: int | None = None) -> ValidationResult:
    """Mean figures of a policy over validation cells: against the best fixed K and against ``marginal``.

    ``speedup_vs_best_fixed`` and ``speedup_vs_marginal`` are geometric means over the cells of the ratios of
    throughput; the best model of a run is kept by ``speedup_vs_marginal``.
    """
    per_cell = []
    for _, wl, prof in cells:
        policy = artifact.row.controller(artifact, "ppo (training)", artifact.k_max)
        replay = open_replay(wl, "all", 0, artifact.k_max, prof, max_requests)
        refs = references(replay.engine, replay.requests)
        mine, marginal = (figures(r, refs) for r in run_controllers(
            replay, [(policy.name, policy), ("marginal", MarginalStop())], refs))
        per_cell.append((mine, mine.throughput_tok_s / marginal.throughput_tok_s))
    return ValidationResult(
        speedup_vs_best_fixed=geomean([f.speedup_vs_best_fixed for f, _ in per_cell]), split="val cells",
        requests=sum(len(wl.split_indices("all")) for _, wl, _ in cells),
        vs={"marginal": geomean([m for _, m in per_cell])},
        speedup_vs_ar=float(np.mean([f.speedup_vs_ar for f, _ in per_cell])),
        oracle_ratio=geomean([f.oracle_ratio for f, _ in per_cell]), cells=len(cells))


def validate_batch(artifact: PolicyArtifact, workload: Any, profile_name: str, max_batch: int,
                   replications: int = 4, requests: int = 96) -> ValidationResult:
    """A batch policy against its mode's compared rule (batch: the goodput rule; alloc: the budget rule it
    calibrates) and the best static K on mixed-concurrency replications of ``requests`` val requests each
    (``eval_max_requests`` caps them during training, as it caps the chain modes' validations)."""
    policy = artifact.row.controller(artifact, "ppo (training)", artifact.k_max)
    teacher = getattr(policy, "teacher", None)  # an alloc policy: the rule it calibrates, with its estimator
    ref: Any = teacher() if teacher is not None else artifact.row.compared[0]
    short = "budget" if teacher is not None else _SHORT[ref]
    statics = [f"static:{k}" for k in (0, 1, 2, 4)]
    specs: list[Any] = [ref, policy, *statics]
    res = compare(workload, load_batch_profile(profile_name), specs, replications=replications, requests=requests,
                  max_batch=max_batch, split="val", k_max=artifact.k_max, seed=12345)
    rows = {r["controller"]: r for r in res["rows"]}
    best_static = max((rows[n] for n in statics), key=lambda r: r["tok_s_mean"])
    p = rows[policy.name]
    return ValidationResult(speedup_vs_best_fixed=p["tok_s_mean"] / best_static["tok_s_mean"], split="val",
                            requests=requests * replications, vs={short: p["vs_reference"]},
                            throughput_tok_s=p["tok_s_mean"], replications=replications)


def make_validator(cfg: Any, workload: Any) -> tuple[Validator, str]:
    """``(validate(artifact, max_requests) -> result, key)`` for a run: its workload's val split under the run's
    profile (batch mode: mixed-concurrency replications), or the validation cells of a domain-randomised run;
    ``key`` is the figure the best model is kept by (the mode's, or ``speedup_vs_marginal`` over cells)."""
    row = get_mode(cfg.mode)
    if kind_row(row.kind).serving_step:
        return (lambda art, max_requests=None: validate_batch(art, workload, cfg.ppo.batch_profile,
                                                              cfg.ppo.max_batch, requests=min(96, max_requests or 96))
                ), row.best_key
    if getattr(cfg.ppo, "domains", None):
        cells = generalist_cells()
        return (lambda art, max_requests=None: validate_generalist(art, cells, max_requests)), "speedup_vs_marginal"
    return (lambda art, max_requests=None: validate_policy(art, workload, "val", max_requests,
                                                           profile=cfg.ppo.profile)), row.best_key

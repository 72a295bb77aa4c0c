"""The evaluation harness: every controller on the same requests with the same random numbers, plus the oracles.

``evaluate`` is three steps, each usable alone: :func:`open_replay` (the workload's split under one engine: common
random numbers from one seed), :func:`specgym.eval.references.references` (fixed K = 0..k_max, the clairvoyant
and the informed oracle) and :func:`run_controllers` (every controller; a ``fixed:K`` row reuses its reference
run), then :func:`assemble_report`: the figures of every row (:func:`specgym.eval.metrics.figures`), paired
bootstrap intervals, the headroom split (*chance* and *prediction + decision*) and everything needed to reproduce
any row: workload (name, path, sha256, synthetic or recorded), cost profile, seeds, k_max and the package version.
Training validation and the generalisation suite run the first three steps and skip the report.

Nothing here names a decision kind: each kind's row (:data:`specgym.envs.core.kinds.KIND_ROWS`) names its replay
runner (``replay_runner``: :func:`run_chain`, :func:`run_tree`, :func:`run_drafter`) and the reference runs its
rows are compared with (``references``: :func:`tree_references`, the fastest static tree; :func:`drafter_references`,
the best single drafter, the strongest lookup rule and the clairvoyant drafter choice), imported by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import specgym.catalogue as catalogue
from specgym.agents.specs import EVAL_KINDS, Resolution, Resolved, resolve
from specgym.envs.core.controller import Controller, fits_itself
from specgym.envs.core.cost import CostProfile
from specgym.envs.core.kinds import KindName, kind_row, load_runner
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.core.tree import TreeController
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import Workload, cached_workload
from specgym.errors import SpecgymError
from specgym.eval.censored import bound_note, censored_bound
from specgym.eval.drafter_runner import run_drafter_controller, run_drafter_oracle
from specgym.eval.metrics import category_metrics, figures, headroom_closed, headroom_split, oracle_figures
from specgym.eval.references import INFORMED, References, references
from specgym.eval.runner import RunResult, grouped_notes, run_controller
from specgym.eval.stats import PairedBootstrap
from specgym.eval.tree_runner import run_tree_controller, run_tree_oracle
from specgym.io import sha256_file
from specgym.version import __version__

Specs = (str | Resolution
         | Sequence[str | Controller | TreeController | Resolved | tuple[str, Controller | TreeController | None]])


@dataclass
class EvalConfig:
    """What to evaluate.

    Attributes:
        workload: Shipped workload name or path (or a loaded :class:`Workload`).
        controllers: Comma-separated controller specs (``all`` = every baseline + fixed:1..k_max), or a sequence
            of specs and :class:`Controller` objects (an in-memory policy, a controller of your own).
        split: Request split (``test`` by default; ``all`` for every request).
        seed: Seed of the common random numbers.
        k_max: Largest draft cap.
        profile: Cost profile override (name, path or object); default the workload's own.
        max_requests: Evaluate only the first N requests of the split (None = all).
        bootstrap: Bootstrap resamples for the paired 95% confidence intervals of every ratio (0 = none).
        per_request: Also return every controller's per-request times (``report["per_request_time_ms"]``).
    """

    workload: str | Workload
    controllers: Specs = "all"
    split: str = "test"
    seed: int = 0
    k_max: int = DEFAULT_K_MAX
    profile: str | CostProfile | None = None
    max_requests: int | None = None
    bootstrap: int = 2000
    per_request: bool = False


def resolve_controllers(specs: Specs, k_max: int, workload: Workload | None = None) -> Resolution:
    """Every controller an evaluation runs, each built once (:func:`specgym.agents.specs.resolve`, chain, tree and
    drafter kinds); with ``workload``, ``all`` means what it means for that workload (its predictors, its tree and
    drafter-choice rows, and a note for each row left out)."""
    return resolve(specs, k_max, workload, EVAL_KINDS)


def _traced_requests(wl: Workload, requests: np.ndarray) -> dict[str, int]:
    """The first request of each category in serving order (the K-over-time plot)."""
    out: dict[str, int] = {}
    for r in requests.tolist():
        out.setdefault(str(wl.category[r]), r)
    return out


@dataclass(frozen=True)
class Replay:
    """One split of a workload under one replay engine: what every run of an evaluation shares.

    Attributes:
        workload: The loaded workload.
        profile: The cost profile the engine prices rounds with.
        engine: The replay engine (common random numbers from its seed).
        requests: Workload indices of the evaluated requests, in serving order.
        path: Where the workload was read from (None for an in-memory one).
        sha256: Its file's checksum (a sharded workload: its ``workload.json``'s).
    """

    workload: Workload
    profile: CostProfile
    engine: TraceEngine
    requests: np.ndarray
    path: str | None = None
    sha256: str | None = None


def open_replay(workload: str | Path | Workload, split: str = "test", seed: int = 0, k_max: int = DEFAULT_K_MAX,
                profile: str | CostProfile | None = None, max_requests: int | None = None) -> Replay:
    """Load a workload (shipped name, path or object) and select the requests of ``split`` (the first
    ``max_requests`` of them), priced with ``profile`` (default the workload's own)."""
    if isinstance(workload, Workload):
        wl, wl_path, wl_hash = workload, None, None
    else:
        path = catalogue.resolve("workload", str(workload))
        wl, wl_path = cached_workload(path), str(path)
        wl_hash = sha256_file(path if path.is_file() else path / "workload.json")  # a sharded one: its record
    prof = profile if isinstance(profile, CostProfile) else load_profile(profile) if profile else wl.profile
    requests = wl.split_indices(split)
    if max_requests is not None:
        if max_requests < 1:
            raise SpecgymError(f"max_requests must be >= 1, got {max_requests}")
        requests = requests[:max_requests]
    if len(requests) == 0:
        raise SpecgymError(f"workload {wl.name!r} has no requests in split {split!r}")
    return Replay(wl, prof, TraceEngine(wl, prof, k_max, seed=seed), requests, wl_path, wl_hash)


def run_controllers(replay: Replay, named: Specs, refs: References,
                    trace: Sequence[int] = (),
                    progress: Callable[[str, int], Callable[[], None]] | None = None) -> list[RunResult]:
    """Serve the replay's requests with every controller, in order (one :class:`RunResult` each), each by the
    runner of its kind.

    Chain controllers run on the replay engine (a plain ``fixed:K`` is its reference run: the same requests and
    draws); tree controllers on a tree replay engine built on first use (it refuses v1 and sampled traces with one
    line), after their ``prepare`` on the workload; the tree oracle row is its plan.

    Args:
        replay: The requests and engine.
        named: The resolved controllers (:func:`resolve_controllers`; specs, controllers or ``(label,
            controller)`` pairs are resolved here).
        refs: The references of the same requests.
        trace: Requests whose round-by-round choices are kept (chain controllers but fixed K).
        progress: ``progress(label, n_requests)`` returns a per-request callback (progress bars).
    """
    state = ReplayState(replay, refs, trace)
    results: list[RunResult] = []
    for row in resolve_controllers(named, replay.engine.k_max, replay.workload):
        runner = replay_runner(row.kind)
        if runner is None:
            raise SpecgymError(f"{row.spec}: a {row.kind} controller; the replay harness runs "
                               f"{', '.join(EVAL_KINDS)} controllers")
        results.append(runner(state, row, progress(row.spec, len(replay.requests)) if progress else None))
    return results


@dataclass
class ReplayState:
    """What the runners of one evaluation share: the replay, its references, the traced requests, and the tree
    replay engine (built on first use: it refuses v1 and sampled traces with one line) and the head's
    (``head_tree_engines``, by drafter: trees drafted by the draft head, from ``ranks_head``)."""

    replay: Replay
    refs: References
    trace: Sequence[int]
    tree_engine: TreeEngine | None = None
    head_tree_engines: dict[str, TreeEngine] = field(default_factory=dict)

    def ticks(self, tick: Callable[[], None] | None) -> None:
        """Advance a progress callback by every request at once (runners that serve the split in one go)."""
        if tick is not None:
            for _ in self.replay.requests:
                tick()


def run_chain(state: ReplayState, row: Resolved, tick: Callable[[], None] | None) -> RunResult:
    """A chain controller on the replay engine (a plain ``fixed:K`` is its reference run)."""
    rp = state.replay
    return run_controller(rp.engine, rp.requests, row.controller, trace=state.trace, on_request=tick,
                          fixed=state.refs)


def run_drafter(state: ReplayState, row: Resolved, tick: Callable[[], None] | None) -> RunResult:
    """A drafter-choice controller, or the clairvoyant drafter choice (a plan row)."""
    rp = state.replay
    if row.controller is None:
        result = run_drafter_oracle(rp.engine, rp.requests, row.spec)
        state.ticks(tick)
        return result
    return run_drafter_controller(rp.engine, rp.requests, row.controller, trace=state.trace, on_request=tick)


def tree_engine_for(state: ReplayState, spec: str, drafter: str | None) -> TreeEngine:
    """The evaluation's tree replay engine for trees drafted by ``drafter`` (``None``: the draft model; ``head``:
    the draft head, from the recording's ``ranks_head`` column), built on first use; a workload that cannot replay
    them is refused in one line naming ``spec`` and the missing column."""
    rp = state.replay
    if drafter is None:
        if state.tree_engine is None:
            state.tree_engine = TreeEngine(rp.workload, rp.profile, rp.engine.k_max)
        return state.tree_engine
    engine = state.head_tree_engines.get(drafter)
    if engine is None:
        try:
            engine = TreeEngine(rp.workload, rp.profile, rp.engine.k_max, drafter=drafter)
        except SpecgymError as exc:
            raise SpecgymError(f"{spec}: {exc} (or run it live: specgym generate, specgym bench live)") from None
        state.head_tree_engines[drafter] = engine
    return engine


def run_tree(state: ReplayState, row: Resolved, tick: Callable[[], None] | None) -> RunResult:
    """A tree controller on the tree replay engine after its ``prepare``, or the tree oracle's plan; trees drafted
    by the head (``TREE_SPEC@head``) on the head's engine (:func:`tree_engine_for`)."""
    rp = state.replay
    drafter = None if row.controller is None else row.controller.drafter
    engine = tree_engine_for(state, row.spec, drafter)
    if row.controller is None:
        result = run_tree_oracle(engine, rp.requests, row.spec)
    elif drafter is not None and fits_itself(row.controller) and not getattr(row.controller, "fits_on_drafter", False):
        raise SpecgymError(f"{row.spec}: a tree rule fitted on the draft model's columns cannot replay "
                           f"{drafter}-drafted trees (the recording holds the {drafter}'s ranks, not what it fits on): "
                           f"run it live")
    else:
        try:  # the notes it returns, on how it fitted this workload, go in the row's notes
            notes = list(row.controller.prepare(rp.workload, rp.profile))
        except SpecgymError as exc:  # name the row: a tree controller prepares on the train split
            why = " (it fits itself on the train split before it runs)" if "'train'" in str(exc) else ""
            raise SpecgymError(f"{row.spec}: {exc}{why}") from None
        result = run_tree_controller(engine, rp.requests, row.controller)
        note = getattr(row.controller, "signal_note", None)
        result.notes = notes + ([note] if note else [])
    state.ticks(tick)
    return result


def replay_runner(kind: KindName) -> Callable[[ReplayState, Resolved, Callable[[], None] | None], RunResult] | None:
    """The replay runner its kind's row names (:attr:`~specgym.envs.core.kinds.DecisionKind.replay_runner`), or None
    for a kind ``specgym eval`` does not run."""
    return load_runner(kind_row(kind).replay_runner)


def evaluate(cfg: EvalConfig, progress: Callable[[str, int], Callable[[], None]] | None = None) -> dict[str, Any]:
    """Run the evaluation; returns the report dict (see :func:`specgym.eval.report.write_report`).

    Args:
        cfg: What to evaluate.
        progress: ``progress(controller_name, n_requests)`` returns a per-request callback (progress bars).
    """
    replay = open_replay(cfg.workload, cfg.split, cfg.seed, cfg.k_max, cfg.profile, cfg.max_requests)
    named = resolve_controllers(cfg.controllers, cfg.k_max, replay.workload)  # fail fast on bad specs
    traced = _traced_requests(replay.workload, replay.requests)
    refs = references(replay.engine, replay.requests, trace=traced.values())
    results = run_controllers(replay, named, refs, trace=list(traced.values()), progress=progress)
    return assemble_report(cfg, replay, named, results, refs, traced)


@dataclass
class KindReferences:
    """What one decision kind adds to an evaluation's report: its row's ``references`` function
    (:attr:`~specgym.envs.core.kinds.DecisionKind.references`) returns it, so the report asks the kind instead of
    naming it.

    Attributes:
        ratios: ``column -> run`` that every row is compared with: each row gets ``column`` (the run's total time
            over the row's) and its paired 95% interval in ``ci95``, in this order.
        fields: Top-level report fields naming those runs (None where none ran: every report has the keys).
        finish: Called last with the assembled report: a kind whose limit is not the chain oracle measures the rows
            (and the oracle rows) against its own (the drafter kind's clairvoyant drafter choice).
    """

    ratios: dict[str, RunResult] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    finish: Callable[[dict[str, Any]], None] | None = None


def kind_references(replay: Replay, named: Resolution, results: list[RunResult],
                    refs: References) -> list[KindReferences]:
    """The references of every kind ``specgym eval`` runs that names a ``references`` function, in table order."""
    out = []
    for kind in EVAL_KINDS:
        make = load_runner(kind_row(kind).references)
        if make is not None:
            out.append(make(replay, named, results, refs))
    return out


def tree_references(replay: Replay, named: Resolution, results: list[RunResult], refs: References) -> KindReferences:
    """The tree kind's reference: the fastest exact static tree of the evaluation (Sequoia's included), if any ran."""
    static = [r for r, row in zip(results, named) if kind_row(row.kind).drafts_trees and row.controller is not None
              and row.controller.static_shape() is not None]
    best = min(static, key=lambda r: float(r.time_ms.sum())) if static else None
    return KindReferences({} if best is None else {"speedup_vs_best_static_tree": best},
                          {"best_static_tree": None if best is None else best.name})


#: The two-line rules a drafter-choice row is compared with, the strongest first: the fitted lookup switch, then
#: the lookup rule at its fixed caps (``speedup_vs_lookup_rule`` is the ratio to the first of them the run holds).
LOOKUP_RULES = ("lookup-switch", "lookup-rule")


def drafter_references(replay: Replay, named: Resolution, results: list[RunResult],
                       refs: References) -> KindReferences:
    """The drafter kind's references: the fastest single drafter at a fixed K (the default drafter's fixed K
    references and every ``fixed:K@DRAFTER`` row) when some drafter-choice row ran, the strongest lookup rule of the
    run (:data:`LOOKUP_RULES`), and in place of the chain oracle its limit, the clairvoyant drafter choice over every
    drafter of the workload (the run's own ``drafter-oracle`` row when it has one)."""
    best = None
    if any(kind_row(row.kind).chooses_drafter for row in named):
        fixed = [r for r, row in zip(results, named) if kind_row(row.kind).chooses_drafter and row.family == "fixed"]
        best = min(fixed + [refs.fixed[k] for k in refs.fixed if k > 0], key=lambda r: float(r.time_ms.sum()))
    rule = next(((row.spec, r) for name in LOOKUP_RULES for r, row in zip(results, named)
                 if row.entry.prefix == name), None)
    ratios = {} if best is None else {"speedup_vs_best_single_drafter": best}
    if rule is not None:
        ratios["speedup_vs_lookup_rule"] = rule[1]
    fields = {"best_single_drafter": None if best is None else best.name,
              "lookup_rule": None if rule is None else rule[0], "drafter_oracle": None}
    if best is None:
        return KindReferences(ratios, fields)
    ran = next((r for r, row in zip(results, named) if row.spec == "drafter-oracle"), None)
    limit = ran if ran is not None else run_drafter_oracle(replay.engine, replay.requests, "drafter-oracle")
    return KindReferences(ratios, fields, lambda report: _against_drafter_limit(report, limit, best, refs, replay))


def _against_drafter_limit(report: dict[str, Any], limit: RunResult, best_single: RunResult, refs: References,
                           replay: Replay) -> None:
    """Measure a drafter-choice evaluation's rows against its limit, the clairvoyant drafter choice (its row is
    ``drafter_oracle``): the oracle ratio to it and the share of the best single drafter's gap to it closed; the
    informed oracle's columns are left out (it knows the default drafter's acceptance alone)."""
    limit_row = {**figures(limit, refs).to_dict(), "spec": limit.name, "family": "oracle",
                 "drafters": list(replay.workload.drafter_names)}
    t_limit, t_best = float(limit.time_ms.sum()), float(best_single.time_ms.sum())
    for row in [*report["rows"], report["oracle"], report["informed_oracle"], limit_row]:
        row["oracle_ratio"] = t_limit / row["total_time_ms"]
        row["headroom_closed"] = headroom_closed(t_best, row["total_time_ms"], t_limit)
        row["headroom_closed_informed"] = row["prediction_decision_tok_s"] = None
    report["drafter_oracle"] = limit_row


def _report_row(r: RunResult, resolved: Resolved, refs: References, compared: dict[str, RunResult],
                ratio_refs: dict[str, np.ndarray], boot: PairedBootstrap, categories: np.ndarray) -> dict[str, Any]:
    """One controller's row: its figures, its ratio to every kind reference run (``compared``), its kind and family,
    its guard, tree and per-category figures, and the paired interval of every ratio."""
    row = figures(r, refs).to_dict()
    for key, run in compared.items():
        row[key] = float(run.time_ms.sum() / r.time_ms.sum())
    row["spec"] = resolved.spec
    row["token_level"] = resolved.token_level
    row["kind"], row["family"] = resolved.kind, resolved.family
    guard = getattr(resolved.controller, "guard_stats", None)
    if callable(guard) and (stats := guard()) is not None:
        row["guard"] = stats  # a learned policy's decisions handed to its teacher outside its training range
    if kind_row(resolved.kind).drafts_trees:
        row["tree"] = True
        row["approximate"] = bool(getattr(resolved.controller, "approximate", False))
    row["categories"] = category_metrics(r, categories)
    row["ci95"] = {key: boot.ratio_ci(ref, r.time_ms) for key, ref in ratio_refs.items()}
    return row


def without_loops(replay: Replay, named: Resolution, results: list[RunResult], ratio_refs: dict[str, np.ndarray],
                  resamples: int) -> dict[str, Any] | None:
    """Every row's ratios again on the requests whose answer does not end in a repetition loop
    (:meth:`Workload.looped`): a looping greedy answer is easy to draft, so a gain that lives in the loops shows
    here. None for a trace without token ids or with no looping request in the evaluated split."""
    flags = replay.workload.looped()
    if flags is None:
        return None
    looped = flags[replay.requests]
    keep = ~looped
    if not looped.any() or not keep.any():
        return None
    boot = PairedBootstrap(int(keep.sum()), resamples, seed=0)
    rows = {}
    for r, resolved in zip(results, named):
        t = r.time_ms[keep]
        rows[resolved.spec] = {**{key: float(ref[keep].sum() / t.sum()) for key, ref in ratio_refs.items()},
                               "ci95": {key: boot.ratio_ci(ref[keep], t) for key, ref in ratio_refs.items()}}
    return {"looped_requests": int(looped.sum()), "requests": int(keep.sum()),
            "looped_ids": replay.workload.request_id[replay.requests][looped].tolist(), "rows": rows}


def _traces(replay: Replay, results: list[RunResult], refs: References, traced: dict[str, int]) -> dict[str, Any]:
    """The round-by-round choices on the first request of each category (the K-over-time plot)."""
    wl = replay.workload
    return {cat: {"request_id": str(wl.request_id[req]), "length": int(wl.lengths[req]), **refs.traces.get(req, {}),
                  "controllers": {res.name: res.traces[req] for res in results if req in res.traces}}
            for cat, req in traced.items()}


def _p_accept_by_category(replay: Replay) -> dict[str, float | None]:
    """The mean acceptance probability of each category's served positions (None in a per-start trace, format v3:
    runs, no per-position acceptance)."""
    wl, requests = replay.workload, replay.requests
    served = np.zeros(wl.n_requests, bool)
    served[requests] = True
    pos_served = np.repeat(served, wl.lengths)
    pos_category = np.repeat(wl.category, wl.lengths)
    p_accept = wl.p_accept
    return {cat: None if p_accept is None else float(p_accept[pos_served & (pos_category == cat)].mean())
            for cat in dict.fromkeys(wl.category[requests].tolist())}


def assemble_report(cfg: EvalConfig, replay: Replay, named: Resolution, results: list[RunResult],
                    refs: References, traced: dict[str, int]) -> dict[str, Any]:
    """The JSON-ready report of an evaluation: rows by throughput, the oracles, each evaluated kind's references
    (:func:`kind_references`), the headroom split, K traces."""
    wl, requests = replay.workload, replay.requests
    categories = wl.category[requests]
    boot = PairedBootstrap(len(requests), cfg.bootstrap, seed=0)  # fixed: reports are reproducible
    kinds = kind_references(replay, named, results, refs)
    compared = {key: run for k in kinds for key, run in k.ratios.items()}  # every row's paired ratio to each
    ratio_refs = {**refs.ratio_references(), **{key: run.time_ms for key, run in compared.items()}}
    rows = sorted((_report_row(r, resolved, refs, compared, ratio_refs, boot, categories)
                   for r, resolved in zip(results, named)), key=lambda row: -row["throughput_tok_s"])
    informed_row = figures(refs.informed, refs).to_dict()
    informed_row.update(spec=INFORMED, token_level=False, categories=category_metrics(refs.informed, categories),
                        expected_time_ms=refs.informed_expected_ms,
                        ci95={key: boot.ratio_ci(ref, refs.informed.time_ms) for key, ref in ratio_refs.items()})
    report: dict[str, Any] = {
        "specgym_version": __version__,
        "workload": {
            "name": wl.name, "label": wl.label, "synthetic": wl.is_synthetic, "path": replay.path,
            "sha256": replay.sha256, "source": wl.source, "split": cfg.split, "requests": int(len(requests)),
            "tokens": refs.tokens, "mean_p_accept_by_category": _p_accept_by_category(replay),
        },
        "profile": replay.profile.to_dict(),
        "seed": cfg.seed,
        "k_max": cfg.k_max,
        "controllers": [row.spec for row in named],
        "left_out": list(getattr(named, "notes", [])),
        **{name: value for k in kinds for name, value in k.fields.items()},
        "max_requests": cfg.max_requests,
        "reference": {"t_ar_ms": refs.t_ar_ms, "best_fixed_k": refs.best_k,
                      "fixed_time_ms": {str(k): refs.t_fixed(k) for k in refs.fixed}},
        "oracle": oracle_figures(refs).to_dict(),
        "informed_oracle": informed_row,
        "headroom": headroom_split(refs),
        "rows": rows,
        "traces": _traces(replay, results, refs, traced),
        "bootstrap": {"resamples": cfg.bootstrap, "level": 0.95, "seed": 0, "unit": "request"},
        "notes": replay.profile.pricing_notes([(d["name"], d["kind"]) for d in replay.workload.drafters or []])
        + grouped_notes(results),
    }
    for k in kinds:
        if k.finish is not None:
            k.finish(report)
    loops = without_loops(replay, named, results, ratio_refs, cfg.bootstrap)
    if loops is not None:
        report["without_loops"] = loops
    bound = censored_bound(replay.engine, requests, float(refs.oracle_ms.sum()))
    if bound is not None:  # an imported vLLM-metrics trace: the oracle on the optimistic runs
        report["censored_oracle"] = bound
        report["notes"].append(bound_note(bound))
    if cfg.per_request:
        times = {row.spec: res.time_ms for row, res in zip(named, results)}
        times.update({f"fixed:{k}": f.time_ms for k, f in refs.fixed.items()})
        times["oracle"] = refs.oracle_ms
        times[INFORMED] = refs.informed.time_ms
        report["per_request_time_ms"] = times
    return report

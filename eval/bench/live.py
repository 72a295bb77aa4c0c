"""Live-engine benchmark (``specgym bench live``): sim-to-real for every controller on a real pair.

On test prompts of a workload recorded from the pair (the same requests the replay harness evaluates), every
controller decodes live, with the pair on this machine. What makes the figures trustworthy:

* **the fastest plain path**: the pair loads with each linear layer's kernel chosen by measurement for each row count
  (:mod:`specgym.envs.engines.fast_linear`; printed), and the bench prints the target's one- and two-token forwards
  through the engine, so every speedup is against plain decoding at its best on this machine;
* **a profile of this machine, fitted to the engine's own rounds** (:mod:`specgym.envs.engines.calibration`, on
  train-split prompts, never the measured ones) unless ``profile`` names one; the micro-benchmarked profile
  (:func:`~specgym.envs.engines.profiler.measure_profile`) is measured too and its prediction printed beside, as a
  cross-check. Controllers see the profile in use, and the replay prediction prices their rounds with it;
* **paired statistics**: per prompt, every controller runs back to back (order rotated per prompt and repeat, so a
  drifting machine slows all alike), ``repeats`` times; a prompt's time is the median of its repeats; each
  controller's speedup over the best fixed K (and over plain decoding) carries a paired bootstrap 95% interval over
  prompts (:class:`~specgym.eval.stats.PairedBootstrap`), and a row whose interval contains 1 is a **tie**;
* whether every greedy output equals plain decoding, token for token;
* once through transformers' ``generate(assistant_model=...)`` (:func:`generate_with_controller`) with the best
  chain controller, against transformers' own plain ``generate()``.

**Drafter-choice controllers** (the ``drafter`` kind: ``fixed:K@DRAFTER``, ``lookup-rule[:N]``,
``drafter-marginal``, drafter policies) choose each round between the draft model (``draft``), the engine's
prompt-lookup drafter (``ngram``, :mod:`~specgym.envs.core.ngram_proposer`) and, for a pair with one, its draft head
(``head``), greedy or sampled, in the same rotation; the workload gains those drafters' per-start runs where it
lacks them (recomputed per request as the recorder stores them,
:func:`~specgym.envs.engines.recorder.with_drafter_runs`), which the fitting rules fit on and the replay prediction
reads.

**Tree controllers** (specs starting with ``tree``: ``tree-static:W1-W2-..``, ``tree-sequoia[:BUDGET]``,
``tree-eagle[:DEPTH:BEAM:M]`` (exact live; its replay prediction is approximate), ``tree-chain:SPEC``; greedy
workloads) decode through live tree verification (:mod:`~specgym.envs.engines.live_tree`)
in the same rotation, so their rows carry the same paired intervals against the best fixed K, and a ``tree vs chain``
line compares the fastest tree row (``tree-chain:SPEC`` rows are width-1 trees, i.e. chains, and do not count) with
the fastest chain row (paired interval over prompts), whatever the answer.
Their prices need verify cost by node count: the micro-benchmarked profile then measures tree verification up to
:data:`~specgym.envs.core.cost.TREE_NODE_LIMIT` nodes, and the profiles controllers see and the prediction uses gain
those costs (:func:`~specgym.envs.engines.profiler.extend_tree_verify`; the fitted ones come from chain rounds).
The prediction of a tree row is the tree replay (:mod:`~specgym.envs.engines.tree_engine`) of the same requests;
``tree-chain:SPEC`` is predicted as SPEC (the width-1 tree is the chain round). ``acceptance`` of a tree row is
accepted tokens per verified node.

One torch thread. Results are printed and written as JSON (``--json``); the live table of
docs/results/live-midpair.md comes from here.
"""

from __future__ import annotations

import time
from dataclasses import asdict, astuple, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

import specgym.catalogue as catalogue
from specgym.agents.artifact import list_policies
from specgym.agents.specs import EVAL_KINDS, Traits, all_specs, build, expand, make, row_of, usage_line
from specgym.baselines.tree_chain import ChainAsTree
from specgym.baselines.tree_static import StaticTree
from specgym.console import make_progress
from specgym.envs.core.acceptance_predictor import SignalSource, bind_signals, model_signature
from specgym.envs.core.cost import TREE_NODE_LIMIT
from specgym.envs.core.kinds import kind_row
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.calibration import (
    RoundSample,
    calibrate,
    cycled_rounds,
    fit_head_cost,
    fit_profile,
    with_drafters,
)
from specgym.envs.engines.clock import syncer, timed
from specgym.envs.engines.draft_head import HEAD_DRAFTER
from specgym.envs.engines.live_engine import LiveEngine
from specgym.envs.engines.live_runners import LiveCall, run_live
from specgym.envs.engines.model_loading import encode_prompt, load_pair
from specgym.envs.engines.profiler import extend_tree_verify, hardware_description, interleaved_ms, measure_profile
from specgym.envs.engines.recorder import with_drafter_runs
from specgym.envs.engines.trace_engine import TraceEngine
from specgym.envs.engines.tree_engine import TreeEngine, check_tree_workload
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.errors import SpecgymError
from specgym.eval.drafter_runner import run_drafter_controller
from specgym.eval.runner import run_controller
from specgym.eval.stats import PairedBootstrap
from specgym.eval.tree_runner import run_tree_controller
from specgym.paths import DATA_DIR, MODEL_ROOTS, default_pair_name, portable_name

#: Defaults sized for about +-2% intervals in ~15 minutes on a 2-core CI-class machine
#: (see docs/results/live-midpair.md).
DEFAULT_PER_CATEGORY = 10
DEFAULT_REPEATS = 3
DEFAULT_CALIBRATION_PROMPTS = 3  # per category, from the train split


def _policies() -> list[str]:
    return [f"ppo:{p}" for p in list_policies(kind="chain")]


def controller_specs(traits: Traits, k_fixed: int = 6) -> list[str]:
    """What the default live bench runs: plain decoding, fixed K = 1..``k_fixed``, the live-capable rows of
    ``all`` for the workload (every baseline, its pair's predictor rows, the tree rows on a greedy trace with ranks)
    and every shipped chain policy."""
    chain, _ = all_specs(traits, DEFAULT_K_MAX, ("chain",), live=True)
    trees, _ = all_specs(traits, DEFAULT_K_MAX, ("tree",), live=True)
    fixed = [f"fixed:{k}" for k in range(1, k_fixed + 1)]
    return ["fixed:0", *fixed, *(s for s in chain if row_of(s, ("chain",)).family != "fixed"),
            *_policies(), *trees]


def _fixed_draft_cap(spec: str) -> bool:
    """A fixed draft cap (``fixed:K`` of one drafter or of the default one): a fixed row that is not a tree shape."""
    row = row_of(spec)
    return row.family == "fixed" and not kind_row(row.kind).drafts_trees


def check_live_specs(specs: str) -> list[str]:
    """Validate a comma-separated ``bench live --controllers`` list (chain and tree specs): each must name a row a live
    engine can run, and build; returns the specs."""
    items, _ = expand(specs, DEFAULT_K_MAX, Traits.anything(), EVAL_KINDS, live=True)
    for x in items:
        row = build(x)
        if kind_row(row.kind).drafts_trees and row.controller is not None:
            row.controller.check_live()  # a controller's own reason first
        if not row.entry.live:
            raise SpecgymError(f"{x}: replay only ({row.entry.usage}); the live bench runs: "
                               f"{usage_line(EVAL_KINDS, live=True).removeprefix('valid: ')}")
    return items


@dataclass
class LiveRow:
    """One controller's live figures.

    Attributes:
        controller: Its spec.
        tok_s: Live tokens/s (sum of per-prompt median times).
        speedup: Over plain decoding, with its paired 95% interval ``speedup_ci``.
        vs_best_fixed: Over the best fixed K, with ``vs_best_fixed_ci``; ``verdict`` is ``faster``, ``slower`` or
            ``tie`` (the interval contains 1).
        predicted_tok_s: The replay prediction: the controller's replayed rounds (decided under the profile
            controllers see) priced by the profile fitted to calibration rounds interleaved with the measurement
            (with drafter rows, the draft head's cost too, from head rounds interleaved the same way);
            ``measured_over_predicted`` = live tok/s / predicted (1 = exact). ``upfront_measured_over_predicted`` and
            ``micro_measured_over_predicted``: the same priced by the up-front fit and by the micro-benchmarks.
        acceptance: Accepted / drafted tokens (first repeat).
        greedy_identical: Every output equals plain decoding (greedy workloads; ``None`` when sampling, where
            outputs are equal in distribution only).
    """

    controller: str
    tok_s: float
    speedup: float
    speedup_ci: tuple[float, float] | None
    vs_best_fixed: float
    vs_best_fixed_ci: tuple[float, float] | None
    verdict: str
    predicted_tok_s: float
    measured_over_predicted: float
    micro_measured_over_predicted: float | None
    upfront_measured_over_predicted: float | None
    acceptance: float
    greedy_identical: bool | None


def verdict(ci: tuple[float, float] | None, point: float) -> str:
    """``faster`` / ``slower`` when the interval clears 1, else ``tie`` (no interval: by the point estimate)."""
    lo, hi = ci if ci is not None else (point, point)
    return "faster" if lo > 1.0 else "slower" if hi < 1.0 else "tie"


def engine_forward_ms(engine: Any, model: Any, rows: tuple[int, ...] = (1, 2), context: int = 64,
                      repeats: int = 40) -> dict[int, float]:
    """Median ms of the engine's cached forward of ``model`` over each row count (interleaved; the cache is cropped
    back after each call, so every call sees the same context)."""
    import torch

    with torch.inference_mode():
        cache = engine.new_cache(model)
        engine.forward(model, [(5 * t) % (engine.vocab - 1) + 1 for t in range(context)], cache)

        def call(r: int):
            ids = [(3 * t) % (engine.vocab - 1) + 1 for t in range(r)]
            return lambda: (engine.forward(model, ids, cache), cache.crop(-r))

        ms = interleaved_ms([call(r) for r in rows], repeats, 4, syncer(engine.device))
    return dict(zip(rows, ms))


def _pick(wl: Any, split: str, per_category: int) -> np.ndarray:
    idx = wl.split_indices(split)
    chosen: list[int] = []
    for cat in wl.categories():
        chosen += [int(r) for r in idx if wl.category[r] == cat][:per_category]
    return np.asarray(chosen, dtype=np.int64)


def recorded_pair(wl: Any) -> tuple[str, str] | None:
    """The draft and target folders a recorded workload names (shipped models resolved in this install), or
    ``None`` when it names none; named models that are not here raise one line saying how to pass them."""
    src = getattr(wl, "source", None) or {}
    draft, target = src.get("draft_model"), src.get("target_model")
    if not draft or not target:
        return None
    found = []
    for name in (draft, target):
        shipped = DATA_DIR / name
        if (shipped / "config.json").exists():
            found.append(str(shipped))
        elif (Path(name) / "config.json").exists() or catalogue.external_target(name) is not None:
            found.append(str(name))  # a folder, or a shipped pair's package-provided target (smollm2)
        else:
            raise SpecgymError(f"live bench: workload {wl.name} was recorded from draft {draft} and target {target}; "
                               f"{name} is not here: pass the pair with --draft and --target")
    return found[0], found[1]


def run_live_bench(console: Any, pair_name: str | None = None, workload: str | None = None,
                   per_category: int = DEFAULT_PER_CATEGORY, repeats: int = DEFAULT_REPEATS,
                   specs: list[str] | None = None, threads: int = 1, max_new_tokens: int | None = None,
                   profile: str | None = None, calibration_prompts: int = DEFAULT_CALIBRATION_PROMPTS,
                   resamples: int = 2000, hf_generate: bool = True, micro_repeats: int = 40,
                   draft: str | None = None, target: str | None = None, device: str = "cpu") -> dict[str, Any]:
    """Run the live benchmark; returns every figure (also printed as a table).

    Args:
        console: A rich console.
        pair_name: Shipped pair (default: the pair ``workload`` was recorded from, else the default pair).
        workload: Workload recorded from the pair (default ``PAIR-greedy``).
        draft, target: A user's pair (model folders or hub names), instead of the one the workload names.
        device: Where the pair runs (``cpu``, ``cuda``, ``cuda:1`` ...; rounds are timed device-synchronised).
        per_category: Test prompts per category.
        repeats: Times each (prompt, controller) runs; a prompt's time is the median.
        specs: Controller specs (default: plain, fixed K = 1..6, every baseline and shipped policy).
        threads: torch threads.
        max_new_tokens: Completion length (default: each request's recorded length).
        profile: Cost profile name or path; ``None`` = fit one to the engine's rounds on this machine now.
        calibration_prompts: Train-split prompts per category for the fit.
        resamples: Bootstrap resamples of the paired intervals.
        hf_generate: Also time transformers' ``generate()`` plain and assisted.
        micro_repeats: Timed calls per figure of the micro-benchmarked profile.
    """
    if specs is not None:  # a replay-only controller is refused before anything loads or calibrates
        check_live_specs(",".join(specs))
    import torch
    import transformers
    torch.set_num_threads(threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t_start = time.perf_counter()
    if (draft is None) != (target is None):
        raise SpecgymError("live bench: give both --draft and --target, or neither")
    if workload is None:
        pair_name = pair_name or default_pair_name()
        workload = f"{pair_name}-greedy"
    wl = cached_workload(workload)
    if draft is None and target is None:
        if pair_name is not None:
            draft_dir, target_dir = catalogue.pair_models(pair_name)
            draft, target = str(draft_dir), str(target_dir)
        else:  # the pair the trace was recorded from: a user's trace is never decoded with the shipped pair
            draft, target = recorded_pair(wl) or tuple(str(p) for p in catalogue.pair_models(default_pair_name()))
    pair_name = pair_name or Path(str(target)).parent.name or str(target)
    pair = load_pair(str(draft), str(target), device=device)
    console.print(f"pair: draft {portable_name(pair.draft_name)}, target {portable_name(pair.target_name)}",
                  highlight=False)
    console.print(pair.kernel_summary(), highlight=False)
    k_max = DEFAULT_K_MAX
    texts = wl.prompt_text or []
    if not texts:
        raise SpecgymError(f"live bench: workload {wl.name} stores no prompt texts (pick a workload recorded from the "
                           f"pair with specgym record, e.g. --workload {pair_name}-greedy)")

    def encode(rows: np.ndarray) -> tuple[list[list[int]], list[int]]:
        ids = [encode_prompt(pair.tokenizer, texts[r]) for r in rows]
        return ids, [int(wl.lengths[r]) if max_new_tokens is None else max_new_tokens for r in rows]

    requests = _pick(wl, "test", per_category)
    prompts, lengths = encode(requests)
    greedy = bool(np.all(wl.temperature[requests] == 0))
    if specs is None:
        specs = controller_specs(Traits.of(wl))
    kind = {s: build(s, k_max).entry.kind for s in specs}  # built: a learned row's kind is its policy's mode
    tree_specs = [s for s in specs if kind_row(kind[s]).drafts_trees]
    if tree_specs:
        check_tree_workload(wl)  # greedy, with ranks: the tree rows' prediction is the tree replay
    drafter_specs = [s for s in specs if kind_row(kind[s]).chooses_drafter]
    if drafter_specs:  # the other drafters' runs: what drafter-choice rows fit on and are predicted with
        wl = with_drafter_runs(wl, pair)
    probe = LiveEngine.from_pair(pair, k_max=k_max, timing="wall")
    fwd = engine_forward_ms(probe, pair.target)
    console.print(f"target forward through the engine: 1 token {fwd[1]:.3f} ms, 2 tokens {fwd[2]:.3f} ms "
                  f"({'ok: one token is not slower' if fwd[1] <= fwd[2] else 'ONE TOKEN IS SLOWER'})", highlight=False)
    micro = measure_profile(pair, k_max=k_max, name=f"micro-{pair_name}", repeats=micro_repeats,
                            tree_nodes=TREE_NODE_LIMIT if tree_specs else 0)
    fit_summary = None
    cal_ids, cal_len = encode(_pick(wl, "train", calibration_prompts))
    cal_temp = float(np.median(wl.temperature[requests]))
    if profile is not None:
        prof = load_profile(profile)
        prof_note = f"profile {prof.name} (given: {profile})"
    else:
        fit = calibrate(probe, cal_ids, cal_len, k_max, name=f"fitted-{pair_name}", temperature=cal_temp,
                        hardware=hardware_description(str(pair.target.device), pair.dtypes))
        prof, fit_summary = fit.profile, fit.summary()
        prof_note = f"profile fitted on this machine now (controllers decide with it): {fit_summary}"
    if tree_specs:
        prof = extend_tree_verify(prof, micro)
        prof_note += f"; tree verify by node count measured up to {TREE_NODE_LIMIT} nodes (micro-benchmarks)"
    console.print(prof_note, highlight=False)
    console.print(f"cross-check, micro-benchmarked profile: t_AR {micro.t_ar_ms:.2f} ms, round(1) "
                  f"{micro.round_time(1):.2f} ms, round({k_max}) {micro.round_time(k_max):.2f} ms", highlight=False)

    if "fixed:0" not in specs:
        specs = ["fixed:0", *specs]
    if not any(s != "fixed:0" and _fixed_draft_cap(s) for s in specs):  # every row is compared with a fixed K
        specs = [*specs, "fixed:1"]
        console.print("no fixed K named: fixed:1 added as the reference of the 'vs best fixed' column",
                      highlight=False)
    kind.update({s: row_of(s).kind for s in specs if s not in kind})  # the added references: chain rows
    # the engine computes the workload's hidden sketch too, so a predictor reading it sees in live what it was
    # trained on (a controller without one ignores it)
    eng = LiveEngine.from_pair(pair, k_max=k_max, profile=prof, timing="wall", sketch=wl.sketch_projection())

    live_source = SignalSource.of_engine(f"the live engine on {pair_name}", portable_name(pair.draft_name),
                                         portable_name(pair.target_name), eng.signals, eng.sketch,
                                         (wl.signal_meta.get("hidden_sketch") or {}).get("seed"),
                                         (model_signature(pair.draft.config), model_signature(pair.target.config)),
                                         MODEL_ROOTS)
    notes: set[str] = set()

    def _make(spec: str) -> Any:
        """A chain controller (fitted to the engine's signals), or a tree controller prepared on the workload's
        train split under ``prof``; a predictor's fallback is printed once."""
        row = build(spec, k_max)
        ctrl = row.controller
        if kind_row(row.kind).fitted:  # on the workload's fit split (a tree's shape, a run predictor), priced by prof
            fresh = [f"{spec}: {note}" for note in ctrl.prepare(wl, prof)]
            note = getattr(ctrl, "signal_note", None)
            fresh += [f"{spec}: {note}"] if note else []
        else:
            fresh = bind_signals([(spec, ctrl)], live_source)
        for line in fresh:
            if line not in notes:
                notes.add(line)
                console.print(f"note: {line}", style="yellow", highlight=False, markup=False)
        return ctrl
    eng.run_request(prompts[0], None, 16)  # warm-up both models
    eng.run_request(prompts[0], 3, 16)
    n_p = len(prompts)
    times = np.zeros((len(specs), n_p, repeats))
    accepted = np.zeros((len(specs), 2), dtype=np.int64)
    identical = np.ones(len(specs), dtype=bool)
    plain_tokens: list[list[int]] = [[] for _ in range(n_p)]
    cal_samples: list[RoundSample] = []  # calibration rounds interleaved with the measurement (pricing)
    head_samples: list[RoundSample] = []  # and the draft head's, when drafter rows run (its cost on this machine)
    time_head = eng.head is not None and bool(drafter_specs)
    slot = 0
    # every prompt x row x repeat, with the time left (a live bench runs for tens of minutes)
    with make_progress(console=console) as bar:
        task = bar.add_task("live bench: prompts x rows", total=repeats * n_p * len(specs))
        for rep in range(repeats):
            controllers = [_make(s) for s in specs]  # fresh per repeat, reused across its prompts
            for p, (ids, n) in enumerate(zip(prompts, lengths)):
                shift = (rep * n_p + p) % len(specs)
                order = list(range(len(specs)))
                order = order[shift:] + order[:shift]
                if rep == 0:  # plain decoding first: greedy exactness is checked against it
                    order.remove(specs.index("fixed:0"))
                    order.insert(0, specs.index("fixed:0"))
                for s in order:
                    call = LiveCall(ids, n, float(wl.temperature[requests[p]]), int(requests[p]),
                                    request_id=str(wl.request_id[requests[p]]), category=str(wl.category[requests[p]]))
                    res = run_live(eng, kind[specs[s]], controllers[s] if specs[s] != "fixed:0" else None, call)
                    times[s, p, rep] = res.time_ms
                    bar.advance(task)
                    if rep == 0:
                        accepted[s] += (res.accepted, res.drafted)
                        if specs[s] == "fixed:0":
                            plain_tokens[p] = res.tokens
                        identical[s] &= res.tokens == plain_tokens[p]
                # one calibration request after each prompt (the train prompts in turn), its cap cycling 0..k_max round
                # by round, so the fit that prices the replay sees every K in the machine's state of the moment, as the
                # controllers it predicts did
                c = slot % len(cal_ids)
                slot += 1
                cal_samples += cycled_rounds(eng, cal_ids[c], cal_len[c], range(k_max + 1), cal_temp, seed=c)
                if time_head:  # and one drafted by the head, its cap cycling 1..k_max
                    head_samples += cycled_rounds(eng, cal_ids[c], cal_len[c], range(1, k_max + 1), cal_temp, seed=c,
                                                  drafter=HEAD_DRAFTER)
            done = (rep + 1) / repeats
            console.print(f"  repeat {rep + 1}/{repeats} done ({time.perf_counter() - t_start:.0f} s; "
                          f"{100 * done:.0f}%)", highlight=False)
    per_prompt = np.median(times, axis=2)  # (specs, prompts)
    totals = per_prompt.sum(axis=1)
    n_tok = sum(lengths)
    plain = specs.index("fixed:0")
    fixed_ix = [i for i, s in enumerate(specs) if i != plain and _fixed_draft_cap(s)]
    best_fixed = min(fixed_ix, key=lambda i: totals[i])
    boot = PairedBootstrap(n_p, resamples, seed=0)
    replay = TraceEngine(wl, prof, k_max, seed=0)
    replay_micro = TraceEngine(wl, micro, k_max, seed=0)
    covered = {smp.drafted for smp in cal_samples}
    interleaved = fit_profile(cal_samples, k_max, name=f"interleaved-{pair_name}", verify_samples=head_samples) \
        if covered >= set(range(k_max + 1)) else None
    pricing = prof if interleaved is None else interleaved.profile
    if interleaved is not None:
        console.print(f"interleaved calibration: {interleaved.summary()}", highlight=False)
    # the interleaved rounds and the micro-benchmarks time the draft model: the other drafters keep prof's costs,
    # but for the head's when its interleaved rounds timed it
    pricing, micro = (with_drafters(p, prof.drafters[1:]) if prof.drafters[1:] and p is not prof else p
                      for p in (pricing, micro))
    if pricing is not prof and len({smp.drafted for smp in head_samples}) >= 2:
        pricing = with_drafters(pricing, ((HEAD_DRAFTER, fit_head_cost(head_samples)),))
        hc = pricing.draft_cost(HEAD_DRAFTER)
        console.print(f"draft head timed in {len(head_samples)} interleaved rounds: {hc.fixed_ms:.3f} ms + "
                      f"{hc.per_token_ms:.3f} ms per token", highlight=False)
    source = (f"fitted to {len(cal_samples)} calibration rounds interleaved with the measurement"
              if pricing is not prof else prof.name)
    console.print(f"pricing profile: {source}: t_AR {pricing.t_ar_ms:.2f} ms, round(1) {pricing.round_time(1):.2f} "
                  f"ms, round({k_max}) {pricing.round_time(k_max):.2f} ms", highlight=False)

    tree_replays: dict[str, Any] = {}
    if tree_specs:
        pricing = extend_tree_verify(pricing, micro)
        tree_replays = {p.name: TreeEngine(wl, p, k_max) for p in (prof, pricing, micro)}

    def predicted_ms(spec: str) -> tuple[float, float, float]:
        """Replay time of ``spec`` on the measured requests, decisions under ``prof``, priced by ``prof``, by
        ``pricing`` (the same rounds: controllers decide as they did live) and by the micro-benchmarks."""
        if spec in drafter_specs:  # the replay of the same decisions kind: every drafter's runs, each engine's costs
            up, pr, mi = (float(run_drafter_controller(TraceEngine(wl, p, k_max, seed=0), requests,
                                                       _make(spec)).time_ms.sum()) for p in (prof, pricing, micro))
            return up, pr, mi
        if spec in tree_specs:
            ctrl = _make(spec)
            if isinstance(ctrl, ChainAsTree):  # the width-1 tree is the chain round: predicted as the chain
                return predicted_ms(spec.partition(":")[2])
            up, pr, mi = (float(run_tree_controller(tree_replays[p.name], requests, ctrl).time_ms.sum())
                          for p in (prof, pricing, micro))
            return up, pr, mi
        res = run_controller(replay, requests, make(spec, k_max), trace=requests.tolist())
        repriced = sum(pricing.round_time(d) for rounds in res.traces.values() for _, _, d, _ in rounds)
        micro_ms = float(run_controller(replay_micro, requests, make(spec, k_max)).time_ms.sum())
        return float(res.time_ms.sum()), float(repriced), micro_ms
    rows: list[LiveRow] = []
    for i, spec in enumerate(specs):
        upfront_ms, pred_ms, micro_ms = predicted_ms(spec)
        vs_best = totals[best_fixed] / totals[i]
        vs_ci = boot.ratio_ci(per_prompt[best_fixed], per_prompt[i])
        rows.append(LiveRow(
            controller=spec, tok_s=n_tok / totals[i] * 1000.0, speedup=totals[plain] / totals[i],
            speedup_ci=boot.ratio_ci(per_prompt[plain], per_prompt[i]), vs_best_fixed=vs_best,
            vs_best_fixed_ci=vs_ci, verdict="reference" if i == best_fixed else verdict(vs_ci, vs_best),
            predicted_tok_s=n_tok / pred_ms * 1000.0, measured_over_predicted=pred_ms / totals[i],
            micro_measured_over_predicted=micro_ms / totals[i],
            upfront_measured_over_predicted=upfront_ms / totals[i],
            acceptance=accepted[i, 0] / max(accepted[i, 1], 1),
            greedy_identical=bool(identical[i]) if greedy else None))
    errors = [abs(r.measured_over_predicted - 1.0) for r in rows]
    micro_errors = [abs((r.micro_measured_over_predicted or 1.0) - 1.0) for r in rows]
    upfront_errors = [abs((r.upfront_measured_over_predicted or 1.0) - 1.0) for r in rows]
    best = max(rows, key=lambda r: r.tok_s)
    chain_rows = [r for r in rows if r.controller not in tree_specs and r.controller not in drafter_specs]
    best_chain = max(chain_rows, key=lambda r: r.tok_s)
    tree_vs_chain: dict[str, Any] | None = None
    trees = [r for r in rows if r.controller in tree_specs and not isinstance(_make(r.controller), ChainAsTree)]
    shapes = {s: f"{c.tree.name} ({c.tree.nodes} nodes, depth {c.tree.depth})" for s in tree_specs
              if isinstance(c := _make(s), StaticTree)}
    approx = [s for s in tree_specs if _make(s).approximate]
    if trees:  # tree-chain:SPEC rows are width-1 trees, i.e. chains: the tree side is the wider trees
        best_tree = max(trees, key=lambda r: r.tok_s)
        bt, bc = specs.index(best_tree.controller), specs.index(best_chain.controller)
        ci = boot.ratio_ci(per_prompt[bc], per_prompt[bt])
        ratio = totals[bc] / totals[bt]
        tree_vs_chain = {"tree": best_tree.controller, "chain": best_chain.controller, "ratio": float(ratio),
                         "ci": ci, "verdict": verdict(ci, ratio)}
    drafter_choice: dict[str, Any] | None = None
    choosers = [r for r in rows if r.controller in drafter_specs and row_of(r.controller).family != "fixed"]
    if choosers:  # the best single drafter at a fixed K: every fixed row, either drafter (fixed:K, fixed:K@ngram)
        best_choice = max(choosers, key=lambda r: r.tok_s)
        bd = specs.index(best_choice.controller)
        ci = boot.ratio_ci(per_prompt[best_fixed], per_prompt[bd])
        ratio = totals[best_fixed] / totals[bd]
        drafter_choice = {"controller": best_choice.controller, "reference": specs[best_fixed], "ratio": float(ratio),
                          "ci": ci, "verdict": verdict(ci, ratio)}
    hf = None
    if hf_generate:  # transformers' assisted generation drafts chains: the best chain controller
        hf = _hf_generate(pair, prompts[:6], lengths[:6], make(best_chain.controller, k_max), prof)
    result = {
        "pair": pair_name, "draft": portable_name(pair.draft_name), "target": portable_name(pair.target_name),
        "dtypes": pair.dtypes, "packed_linears": pair.packed,
        "kernels": {role: plan.to_dict() for role, plan in pair.kernels.items()},
        "target_forward_ms": {"1": fwd[1], "2": fwd[2]},
        "profile": prof.to_dict(), "profile_note": prof_note, "micro_profile": micro.to_dict(),
        "pricing_profile": pricing.to_dict(),
        "workload": wl.name, "prompts": n_p, "tokens": n_tok, "repeats": repeats, "clock": "wall",
        "threads": torch.get_num_threads(), "plain_tok_s": n_tok / totals[plain] * 1000.0,
        "rows": [asdict(r) for r in rows], "best_fixed_k": int(specs[best_fixed].split(":")[1].partition("@")[0]),
        "best_fixed": specs[best_fixed], "drafter_choice": drafter_choice,
        "best_fixed_speedup": totals[plain] / totals[best_fixed], "best_controller": best.controller,
        "best_speedup": best.speedup, "prediction_error": {"median": float(np.median(errors)),
                                                           "max": float(np.max(errors)),
                                                           "upfront_median": float(np.median(upfront_errors)),
                                                           "upfront_max": float(np.max(upfront_errors)),
                                                           "micro_median": float(np.median(micro_errors)),
                                                           "micro_max": float(np.max(micro_errors))},
        "tree_vs_chain": tree_vs_chain, "tree_shapes": shapes, "approximate_predictions": approx, "hf_generate": hf,
        "bootstrap": {"resamples": resamples, "level": 0.95, "unit": "prompt"},
        "max_new_tokens": max_new_tokens or f"recorded lengths (mean {n_tok / n_p:.0f})",
        "times_ms": {s: times[i].tolist() for i, s in enumerate(specs)},
        # every interleaved calibration round, (drafted, context, drafting phase ms, round ms): a refit reprices offline
        "calibration_rounds": {"draft": [astuple(x) for x in cal_samples], "head": [astuple(x) for x in head_samples]},
        "wall_s": time.perf_counter() - t_start,
    }
    table = Table(title=f"live, {pair_name} ({pair.dtypes}), {n_p} test prompts of {wl.name}, {n_tok} tokens, "
                        f"median of {repeats} per prompt, wall clock, {torch.get_num_threads()} thread(s)")
    for col in ("controller", "live tok/s", "vs plain", f"vs best fixed ({result['best_fixed']}) [95% CI]",
                "verdict", "replay prediction tok/s", "live / predicted", "(up-front fit)", "(micro profile)",
                "acceptance",
                "greedy = plain"):
        table.add_column(col, justify="right")
    for r in sorted(rows, key=lambda r: -r.tok_s):
        ci = r.vs_best_fixed_ci
        table.add_row(r.controller, f"{r.tok_s:.1f}", f"{r.speedup:.3f}x",
                      f"{r.vs_best_fixed:.3f}x" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""), r.verdict,
                      f"{r.predicted_tok_s:.1f}", f"{r.measured_over_predicted:.3f}",
                      f"{r.upfront_measured_over_predicted:.3f}", f"{r.micro_measured_over_predicted:.3f}",
                      f"{r.acceptance:.2f}",
                      "n/a (sampling)" if r.greedy_identical is None else str(r.greedy_identical))
    console.print(table)
    console.print(f"plain decoding {result['plain_tok_s']:.1f} tok/s; best fixed {result['best_fixed']}: "
                  f"{result['best_fixed_speedup']:.3f}x plain; best controller {best.controller}: "
                  f"{best.speedup:.3f}x; replay prediction error |live/predicted - 1|: median "
                  f"{100 * np.median(errors):.1f}%, max {100 * np.max(errors):.1f}% (up-front fit: median "
                  f"{100 * np.median(upfront_errors):.1f}%, max {100 * np.max(upfront_errors):.1f}%; "
                  f"micro-benchmarked profile: median {100 * np.median(micro_errors):.1f}%, max "
                  f"{100 * np.max(micro_errors):.1f}%)", highlight=False)
    if approx:
        console.print(f"{', '.join(approx)}: live rounds exact; replay prediction approximate (off-path scores "
                      "modelled from draft_topk)", highlight=False)
    if shapes:
        console.print("static trees: " + "; ".join(f"{k} = {v}" for k, v in shapes.items()), highlight=False)
    if drafter_choice is not None:
        dci = drafter_choice["ci"]
        console.print(f"drafter choice (live, this machine): fastest drafter-choice row {drafter_choice['controller']} "
                      f"runs {drafter_choice['ratio']:.3f}x the best single drafter at a fixed K "
                      f"({drafter_choice['reference']})" + (f" [95% CI {dci[0]:.3f}, {dci[1]:.3f}]" if dci else "")
                      + f": {drafter_choice['verdict']}", highlight=False)
    if tree_vs_chain is not None:
        tci = tree_vs_chain["ci"]
        console.print(f"tree vs chain (live, this machine): fastest tree {tree_vs_chain['tree']} runs "
                      f"{tree_vs_chain['ratio']:.3f}x the fastest chain {tree_vs_chain['chain']}"
                      + (f" [95% CI {tci[0]:.3f}, {tci[1]:.3f}]" if tci else "") + f": {tree_vs_chain['verdict']}",
                      highlight=False)
    if hf is not None:
        console.print(f"transformers generate(assistant_model=...) with {hf['controller']}: "
                      f"{hf['assisted_tok_s']:.1f} tok/s vs plain generate() {hf['plain_tok_s']:.1f} tok/s "
                      f"({hf['assisted_tok_s'] / hf['plain_tok_s']:.3f}x), outputs identical: {hf['identical']}",
                      highlight=False)
    return result


def _hf_generate(pair: Any, prompts: list[list[int]], lengths: list[int], controller: Any, profile: Any) -> dict:
    """transformers' generate(): plain, and assisted with ``controller`` choosing K (wall clock, greedy)."""
    import torch

    from specgym.agents.hf_generate import generate_with_controller

    plain_ms = assisted_ms = 0.0
    identical = True
    for ids, n in zip(prompts, lengths):
        x = torch.tensor([ids], device=pair.target.device)
        kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                  eos_token_id=None, pad_token_id=pair.tokenizer.pad_token_id)
        dev = pair.target.device
        t0 = timed(dev)
        ref = pair.target.generate(x, **kw)
        plain_ms += (timed(dev) - t0) * 1000
        draft_eos = pair.draft.generation_config.eos_token_id
        pair.draft.generation_config.eos_token_id = None  # the assistant would stop at its own EOS
        try:
            t0 = timed(dev)
            out = generate_with_controller(pair.target, pair.draft, x, controller, profile=profile, **kw)
            assisted_ms += (timed(dev) - t0) * 1000
        finally:
            pair.draft.generation_config.eos_token_id = draft_eos
        identical &= bool(torch.equal(out, ref))
    n_tok = sum(lengths)
    return {"prompts": len(prompts), "plain_tok_s": n_tok / plain_ms * 1000, "assisted_tok_s": n_tok / assisted_ms
            * 1000, "identical": identical, "controller": controller.name}


def live_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``live``: the sim-to-real benchmark on the test prompts of ``workload``, decoded by the pair it was recorded
    from (or ``--draft``/``--target``; skipped without torch/transformers)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        console.print(f"[yellow]live section skipped: {exc}[/yellow]")
        return {}
    specs = getattr(args, "live_controllers", None)
    r = run_live_bench(console, workload=workload, repeats=getattr(args, "live_repeats", DEFAULT_REPEATS),
                       per_category=getattr(args, "live_prompts", DEFAULT_PER_CATEGORY),
                       profile=getattr(args, "live_profile", None),
                       specs=check_live_specs(specs) if specs else None,
                       draft=getattr(args, "live_draft", None), target=getattr(args, "live_target", None),
                       device=getattr(args, "live_device", None) or "cpu")
    return {"live": r}

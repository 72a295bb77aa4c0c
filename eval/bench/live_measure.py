"""The live bench's first phase: load the pair and the workload, price this machine (:func:`open_bench`), build and
prepare every row's controller once (:class:`LiveControllers`), and time every controller on every test prompt
(:func:`measure`). The module docstring of :mod:`specgym.eval.bench.live` says what each figure means.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specgym.agents.specs import Traits, build, row_of
from specgym.console import make_progress
from specgym.envs.core.acceptance_predictor import SignalSource, bind_signals, model_signature
from specgym.envs.core.cost import TREE_NODE_LIMIT, CostProfile
from specgym.envs.core.kinds import HEAD_DRAFTER, kind_row
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.live.calibration import RoundSample, calibrate, cycled_rounds
from specgym.envs.engines.live.clock import syncer
from specgym.envs.engines.live.engine import LiveEngine
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair
from specgym.envs.engines.live.pairs import resolve_pair
from specgym.envs.engines.live.profiler import extend_tree_verify, hardware_description, interleaved_ms, measure_profile
from specgym.envs.engines.live.recorder import with_drafter_runs
from specgym.envs.engines.live.runners import LiveCall, run_live
from specgym.envs.engines.replay.tree_engine import check_tree_workload
from specgym.envs.profiles import load_profile
from specgym.envs.workloads.trace_format import cached_workload
from specgym.envs.workloads.workload import Workload
from specgym.errors import SpecgymError
from specgym.eval.bench.live_config import BENCH_FLAGS, LiveBenchConfig, controller_specs, fixed_draft_cap
from specgym.paths import MODEL_ROOTS, default_pair_name, portable_name

PLAIN = "fixed:0"


@dataclass
class LiveSetup:
    """What the measurement runs on: the loaded pair, the test and calibration prompts, the rows, the profiles.

    Attributes:
        pair: The loaded pair (:class:`~specgym.envs.engines.live.model_loading.LivePair`).
        pair_name: Its name in the report.
        wl: The workload (with the other drafters' runs when drafter rows run).
        requests: The measured (test-split) requests.
        prompts: Their token ids; ``lengths``: their completion lengths.
        cal_ids: The calibration (train-split) prompts; ``cal_len`` their lengths, ``cal_temp`` their temperature.
        specs: Every row, plain decoding and a fixed K included; ``kinds``: each row's built decision kind.
        tree_specs: The rows that draft trees; ``drafter_specs``: the rows that choose drafters.
        fwd: The target's one- and two-token forward through the engine (ms).
        micro: The micro-benchmarked profile; ``prof``: the profile controllers see (``prof_note`` says which).
        engine: The live engine every row decodes with.
        t_start: When the bench started (``time.perf_counter``).
    """

    pair: Any
    pair_name: str
    wl: Workload
    requests: np.ndarray
    prompts: list[list[int]]
    lengths: list[int]
    cal_ids: list[list[int]]
    cal_len: list[int]
    cal_temp: float
    specs: list[str]
    kinds: dict[str, str]
    tree_specs: list[str]
    drafter_specs: list[str]
    fwd: dict[int, float]
    micro: CostProfile
    prof: CostProfile
    prof_note: str
    engine: Any
    t_start: float
    k_max: int = DEFAULT_K_MAX

    @property
    def greedy(self) -> bool:
        """Every measured request is greedy (outputs must then equal plain decoding token for token)."""
        return bool(np.all(self.wl.temperature[self.requests] == 0))

    @property
    def n_tok(self) -> int:
        """Tokens decoded per controller and repeat."""
        return sum(self.lengths)


def engine_forward_ms(engine: Any, model: Any, rows: tuple[int, ...] = (1, 2), context: int = 64,
                      repeats: int = 40) -> dict[int, float]:
    """Median ms of the engine's cached forward of ``model`` over each row count (interleaved; the cache is cropped
    back after each call, so every call sees the same context)."""
    import torch

    with torch.inference_mode():
        cache = engine.new_cache(model)
        engine.forward(model, [(5 * t) % (engine.vocab - 1) + 1 for t in range(context)], cache)
        calls = [_cropped_forward(engine, model, cache, r) for r in rows]
        ms = interleaved_ms(calls, repeats, 4, syncer(engine.device))
    return dict(zip(rows, ms))


def _cropped_forward(engine: Any, model: Any, cache: Any, r: int) -> Any:
    """One timed call of :func:`engine_forward_ms`: an ``r``-token forward, then the cache cropped back."""
    ids = [(3 * t) % (engine.vocab - 1) + 1 for t in range(r)]
    return lambda: (engine.forward(model, ids, cache), cache.crop(-r))


def _pick(wl: Any, split: str, per_category: int) -> np.ndarray:
    idx = wl.split_indices(split)
    chosen: list[int] = []
    for cat in wl.categories():
        chosen += [int(r) for r in idx if wl.category[r] == cat][:per_category]
    return np.asarray(chosen, dtype=np.int64)


def _encode(pair: Any, wl: Workload, rows: np.ndarray, max_new_tokens: int | None) -> tuple[list[list[int]], list[int]]:
    """The prompts of ``rows`` as token ids, and their completion lengths (recorded, unless one is given)."""
    texts = wl.prompt_text or []
    ids = [encode_prompt(pair.tokenizer, texts[r]) for r in rows]
    return ids, [int(wl.lengths[r]) if max_new_tokens is None else max_new_tokens for r in rows]


def _load(console: Any, cfg: LiveBenchConfig) -> tuple[Any, str, Workload]:
    """The workload and the pair (:func:`~specgym.envs.engines.live.pairs.resolve_pair`: the one named, else the
    user's two models, else the pair the workload was recorded from: a user's trace is never decoded with the
    shipped pair), loaded."""
    name = cfg.pair_name
    if cfg.workload is None and cfg.draft is None:
        name = name or default_pair_name()
    wl = cached_workload(cfg.workload or f"{name}-greedy")
    paths = resolve_pair(name, cfg.draft, cfg.target, recorded=wl, flags=BENCH_FLAGS)
    pair = load_pair(paths.draft, paths.target, device=cfg.device)
    console.print(f"pair: draft {portable_name(pair.draft_name)}, target {portable_name(pair.target_name)}",
                  highlight=False)
    console.print(pair.kernel_summary(), highlight=False)
    if not wl.prompt_text:
        raise SpecgymError(f"live bench: workload {wl.name} stores no prompt texts (pick a workload recorded from the "
                           f"pair with specgym record, e.g. --workload {paths.name}-greedy)")
    return pair, paths.name, wl


def _profile(console: Any, cfg: LiveBenchConfig, probe: Any, pair: Any, pair_name: str,
             calibration: tuple[list[list[int]], list[int], float], micro: CostProfile,
             trees: bool) -> tuple[CostProfile, str]:
    """The profile controllers see: the one given, else one fitted to the engine's rounds on the calibration
    prompts now; with tree rows, tree verify by node count from the micro-benchmarks. Printed with the cross-check."""
    cal_ids, cal_len, cal_temp = calibration
    if cfg.profile is not None:
        prof = load_profile(cfg.profile)
        prof_note = f"profile {prof.name} (given: {cfg.profile})"
    else:
        fit = calibrate(probe, cal_ids, cal_len, DEFAULT_K_MAX, name=f"fitted-{pair_name}", temperature=cal_temp,
                        hardware=hardware_description(str(pair.target.device), pair.dtypes))
        prof = fit.profile
        prof_note = f"profile fitted on this machine now (controllers decide with it): {fit.summary()}"
    if trees:
        prof = extend_tree_verify(prof, micro)
        prof_note += f"; tree verify by node count measured up to {TREE_NODE_LIMIT} nodes (micro-benchmarks)"
    console.print(prof_note, highlight=False)
    k_max = DEFAULT_K_MAX
    console.print(f"cross-check, micro-benchmarked profile: t_AR {micro.t_ar_ms:.2f} ms, round(1) "
                  f"{micro.round_time(1):.2f} ms, round({k_max}) {micro.round_time(k_max):.2f} ms", highlight=False)
    return prof, prof_note


def _with_references(console: Any, specs: list[str], kinds: dict[str, str]) -> list[str]:
    """``specs`` with plain decoding, and ``fixed:1`` where no fixed K is named (every row is compared with one)."""
    if PLAIN not in specs:
        specs = [PLAIN, *specs]
    if not any(s != PLAIN and fixed_draft_cap(s) for s in specs):
        specs = [*specs, "fixed:1"]
        console.print("no fixed K named: fixed:1 added as the reference of the 'vs best fixed' column",
                      highlight=False)
    kinds.update({s: row_of(s).kind for s in specs if s not in kinds})  # the added references: chain rows
    return specs


def open_bench(console: Any, cfg: LiveBenchConfig) -> LiveSetup:
    """Load the pair and the workload, pick the prompts, time the target's forwards, and price this machine."""
    import torch
    import transformers

    torch.set_num_threads(cfg.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t_start = time.perf_counter()
    pair, pair_name, wl = _load(console, cfg)
    requests = _pick(wl, "test", cfg.per_category)
    prompts, lengths = _encode(pair, wl, requests, cfg.max_new_tokens)
    specs = list(cfg.specs) if cfg.specs is not None else controller_specs(Traits.of(wl))
    # built: a learned row's kind is its policy's mode
    kinds: dict[str, str] = {s: build(s, DEFAULT_K_MAX).entry.kind for s in specs}
    tree_specs = [s for s in specs if kind_row(kinds[s]).drafts_trees]
    if tree_specs:
        check_tree_workload(wl)  # greedy, with ranks: the tree rows' prediction is the tree replay
    drafter_specs = [s for s in specs if kind_row(kinds[s]).chooses_drafter]
    if drafter_specs:  # the other drafters' runs: what drafter-choice rows fit on and are predicted with
        wl = with_drafter_runs(wl, pair)
    probe = LiveEngine.from_pair(pair, k_max=DEFAULT_K_MAX, timing="wall")
    fwd = engine_forward_ms(probe, pair.target)
    console.print(f"target forward through the engine: 1 token {fwd[1]:.3f} ms, 2 tokens {fwd[2]:.3f} ms "
                  f"({'ok: one token is not slower' if fwd[1] <= fwd[2] else 'ONE TOKEN IS SLOWER'})", highlight=False)
    micro = measure_profile(pair, k_max=DEFAULT_K_MAX, name=f"micro-{pair_name}", repeats=cfg.micro_repeats,
                            tree_nodes=TREE_NODE_LIMIT if tree_specs else 0)
    # calibrate on train prompts; an evaluation set (val and test prompts only) on val, where its learners fit
    cal_split = "train" if (wl.split == "train").any() else wl.fit_split
    cal_ids, cal_len = _encode(pair, wl, _pick(wl, cal_split, cfg.calibration_prompts), cfg.max_new_tokens)
    cal_temp = float(np.median(wl.temperature[requests]))
    prof, prof_note = _profile(console, cfg, probe, pair, pair_name, (cal_ids, cal_len, cal_temp), micro,
                               bool(tree_specs))
    specs = _with_references(console, specs, kinds)
    # the engine computes the workload's hidden sketch too, so a predictor reading it sees in live what it was
    # trained on (a controller without one ignores it)
    eng = LiveEngine.from_pair(pair, k_max=DEFAULT_K_MAX, profile=prof, timing="wall", sketch=wl.sketch_projection())
    return LiveSetup(pair, pair_name, wl, requests, prompts, lengths, cal_ids, cal_len, cal_temp, specs, kinds,
                     tree_specs, drafter_specs, fwd, micro, prof, prof_note, eng, t_start)


@dataclass
class LiveControllers:
    """Every row's controller, built and prepared once (:meth:`open`); each run gets a fresh copy, so a controller
    that learns across requests starts every repeat, and every replay, as it was built.

    Attributes:
        protos: Spec -> its controller as built (a fitted kind's prepared on the workload's fit split under the
            profile controllers see): what the replay and transformers' ``generate()`` run (:meth:`fresh`).
        live: Spec -> the same fitted to the live engine's signals (a fitted kind's is its prepared one): what the
            live engine runs (:meth:`fresh_live`).
        shared: What copies share, never copied (the workload, the profile).
        k_max: The engine's cap (a spec built on demand is built with it).
    """

    protos: dict[str, Any]
    live: dict[str, Any]
    shared: dict[int, Any]
    k_max: int = DEFAULT_K_MAX

    @classmethod
    def open(cls, console: Any, setup: LiveSetup) -> LiveControllers:
        """Build and prepare every row of ``setup`` in turn; a note (a fit, a predictor's fallback) printed once."""
        eng, pair = setup.engine, setup.pair
        source = SignalSource.of_engine(f"the live engine on {setup.pair_name}", portable_name(pair.draft_name),
                                        portable_name(pair.target_name), eng.signals, eng.sketch,
                                        (setup.wl.signal_meta.get("hidden_sketch") or {}).get("seed"),
                                        (model_signature(pair.draft.config), model_signature(pair.target.config)),
                                        MODEL_ROOTS)
        ctrls = cls({}, {}, {id(setup.wl): setup.wl, id(setup.prof): setup.prof}, setup.k_max)
        notes: list[str] = []
        for spec in setup.specs:
            row = build(spec, setup.k_max)
            ctrl = ctrls.protos[spec] = row.controller
            if kind_row(row.kind).fitted:  # on the workload's fit split (a tree's shape, a run predictor), by prof
                fresh = [f"{spec}: {note}" for note in ctrl.prepare(setup.wl, setup.prof)]
                note = getattr(ctrl, "signal_note", None)
                fresh += [f"{spec}: {note}"] if note else []
                ctrls.live[spec] = ctrl
            else:  # a chain controller reads the live engine's signals (another pair's predictor: refused)
                ctrls.live[spec] = ctrls.fresh(spec)
                fresh = bind_signals([(spec, ctrls.live[spec])], source)
            for line in fresh:
                if line not in notes:
                    notes.append(line)
                    console.print(f"note: {line}", style="yellow", highlight=False, markup=False)
        return ctrls

    def fresh(self, spec: str) -> Any:
        """A copy of ``spec``'s controller as built and prepared (a spec not among the rows, e.g. the chain inside
        ``tree-chain:SPEC``, is built on first use, as :func:`~specgym.agents.specs.make` builds it)."""
        if spec not in self.protos:
            self.protos[spec] = build(spec, self.k_max).controller
        return copy.deepcopy(self.protos[spec], dict(self.shared))

    def fresh_live(self, spec: str) -> Any:
        """A copy of ``spec``'s controller as the live engine runs it."""
        return copy.deepcopy(self.live[spec], dict(self.shared))


@dataclass
class Measurement:
    """What the live runs measured.

    Attributes:
        times: ms of every (row, prompt, repeat).
        accepted: Per row, accepted and drafted tokens of the first repeat.
        identical: Per row, every output of the first repeat equals plain decoding.
        cal_samples: The calibration rounds interleaved with the measurement (the pricing fit's).
        head_samples: The draft head's, when drafter rows run (its cost on this machine).
    """

    times: np.ndarray
    accepted: np.ndarray
    identical: np.ndarray
    cal_samples: list[RoundSample] = field(default_factory=list)
    head_samples: list[RoundSample] = field(default_factory=list)

    @property
    def per_prompt(self) -> np.ndarray:
        """``(rows, prompts)``: each prompt's median over its repeats."""
        return np.median(self.times, axis=2)

    @property
    def totals(self) -> np.ndarray:
        """Per row, the sum of its per-prompt medians (ms)."""
        return self.per_prompt.sum(axis=1)


def measure(console: Any, cfg: LiveBenchConfig, setup: LiveSetup, ctrls: LiveControllers) -> Measurement:
    """Every prompt x row x repeat, back to back in a rotating order (plain decoding first in the first repeat:
    greedy exactness is checked against it), with one calibration request after each prompt; a progress bar with the
    time left (a live bench runs for tens of minutes)."""
    eng, specs, n_p = setup.engine, setup.specs, len(setup.prompts)
    eng.run_request(setup.prompts[0], None, 16)  # warm-up both models
    eng.run_request(setup.prompts[0], 3, 16)
    m = Measurement(np.zeros((len(specs), n_p, cfg.repeats)), np.zeros((len(specs), 2), dtype=np.int64),
                    np.ones(len(specs), dtype=bool))
    plain_tokens: list[list[int]] = [[] for _ in range(n_p)]
    with make_progress(console=console) as bar:
        task = bar.add_task("live bench: prompts x rows", total=cfg.repeats * n_p * len(specs))
        for rep in range(cfg.repeats):
            controllers = [ctrls.fresh_live(s) for s in specs]  # fresh per repeat, reused across its prompts
            for p in range(n_p):
                for s in _order(len(specs), specs.index(PLAIN), rep, rep * n_p + p):
                    _run_row(setup, m, controllers, (s, p, rep), plain_tokens)
                    bar.advance(task)
                _calibration_rounds(setup, m, rep * n_p + p)
            console.print(f"  repeat {rep + 1}/{cfg.repeats} done ({time.perf_counter() - setup.t_start:.0f} s; "
                          f"{100 * (rep + 1) / cfg.repeats:.0f}%)", highlight=False)
    return m


def _order(n: int, plain: int, rep: int, shift: int) -> list[int]:
    """The rows' order on one prompt: rotated per prompt and repeat (a drifting machine slows all alike), plain
    decoding first in the first repeat."""
    shift %= n
    order = list(range(n))
    order = order[shift:] + order[:shift]
    if rep == 0:
        order.remove(plain)
        order.insert(0, plain)
    return order


def _run_row(setup: LiveSetup, m: Measurement, controllers: list[Any], at: tuple[int, int, int],
             plain_tokens: list[list[int]]) -> None:
    """Decode prompt ``p`` with row ``s`` (repeat ``rep``; ``at = (s, p, rep)``) and record its time; in the first
    repeat also its acceptance and whether its output equals plain decoding's."""
    s, p, rep = at
    wl, r, spec = setup.wl, int(setup.requests[p]), setup.specs[s]
    call = LiveCall(setup.prompts[p], setup.lengths[p], float(wl.temperature[r]), r, request_id=str(wl.request_id[r]),
                    category=str(wl.category[r]))
    res = run_live(setup.engine, setup.kinds[spec], controllers[s] if spec != PLAIN else None, call)
    m.times[s, p, rep] = res.time_ms
    if rep == 0:
        m.accepted[s] += (res.accepted, res.drafted)
        if spec == PLAIN:
            plain_tokens[p] = res.tokens
        m.identical[s] &= res.tokens == plain_tokens[p]


def _calibration_rounds(setup: LiveSetup, m: Measurement, slot: int) -> None:
    """One calibration request after each prompt (the train prompts in turn), its cap cycling 0..k_max round by
    round, so the fit that prices the replay sees every K in the machine's state of the moment, as the controllers it
    predicts did; with drafter rows and a draft head, one more drafted by the head, its cap cycling 1..k_max."""
    c = slot % len(setup.cal_ids)
    eng, ids, n, temp = setup.engine, setup.cal_ids[c], setup.cal_len[c], setup.cal_temp
    m.cal_samples += cycled_rounds(eng, ids, n, range(setup.k_max + 1), temp, seed=c)
    if eng.head is not None and setup.drafter_specs:
        m.head_samples += cycled_rounds(eng, ids, n, range(1, setup.k_max + 1), temp, seed=c, drafter=HEAD_DRAFTER)

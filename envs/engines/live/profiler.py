"""Measure a cost profile for a real pair on this machine (``specgym profile``).

What is measured (medians after warm-up; CUDA-synchronised on GPU), at a fixed context length:

* ``draft_ms``: one cached draft forward over one new token;
* ``verify_ms[n]`` for n = 2..k_max+1: one cached target forward over ``n`` new tokens (the cache is cropped back
  after each call, so every call sees the same context);
* ``verify_ms[1]`` (= t_AR): one plain autoregressive step of the live engine (K = 0 round: forward, argmax, cache
  bookkeeping), so that plain decoding is priced exactly as it runs;
* ``round_overhead_ms``: the median of (measured - priced) time of real speculative rounds (fixed K = 2 and 4),
  i.e. sampling/argmax, draft catch-up and cache rollback, clipped at 0;
* with ``tree_nodes`` (``specgym profile --tree-nodes``, default 64): ``verify_ms[n]`` for n = k_max+2 ..
  tree_nodes+1 is one target forward over ``n`` tree tokens with a **tree attention mask** (the root and a binary
  tree of ``n - 1`` nodes, positions by depth: :func:`tree_verify_call`), what a live tree round verifies
  (:mod:`~specgym.envs.engines.live.tree`), so :meth:`CostProfile.verify_nodes` prices trees as measured.
  Models the lean forward does not run get a causal ``n``-token forward there (the description says so).

``clock="cpu"`` measures thread CPU time instead of wall time (CPU only): on a machine shared with other jobs it
excludes preemption, which otherwise inflates every figure unpredictably. The result is a :class:`CostProfile`
with ``source="measured"`` and a hardware description (which records the clock).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.cost import TREE_NODE_LIMIT, CostProfile
from specgym.envs.core.tree import TreeShape
from specgym.envs.engines.live.clock import syncer
from specgym.envs.engines.live.draft_stats import draft_stats
from specgym.envs.engines.live.engine import LiveEngine
from specgym.envs.engines.live.model_loading import LivePair
from specgym.envs.engines.live.tree import ancestor_matrix, tree_mask, tree_parents
from specgym.errors import SpecgymError
from specgym.paths import portable_name


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_description(device: str = "cpu", dtype: str = "float32") -> dict[str, Any]:
    """CPU model, cores, torch threads, GPU name: what a reader needs to compare profiles."""
    import torch

    hw: dict[str, Any] = {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                          "device": device, "dtype": dtype, "torch": torch.__version__,
                          "platform": platform.platform()}
    try:
        import transformers

        hw["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        hw["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return hw


#: Draft tokens per timed draft call (a typical round's worth), so its first token's cold caches are averaged in.
DRAFT_RUN = 4


def interleaved_ms(fns: list, repeats: int, warmup: int, sync, clock=time.perf_counter,
                   progress: Callable[[float], None] | None = None) -> list[float]:
    """Median time of each call in ms, measured round-robin: on a shared machine whose speed drifts over seconds,
    drift then hits every call alike, so ratios between them (verify(n) / verify(1)) stay consistent.
    ``progress(fraction_done)`` after each round of calls."""
    times: list[list[float]] = [[] for _ in fns]
    for rep in range(warmup + repeats):
        if progress is not None:
            progress(rep / (warmup + repeats))
        for i, fn in enumerate(fns):
            sync()
            t0 = clock()
            fn()
            sync()
            if rep >= warmup:
                times[i].append((clock() - t0) * 1000.0)
    return [float(statistics.median(t)) for t in times]


def _median_ms(fn, repeats: int, warmup: int, sync, clock=time.perf_counter) -> float:
    return interleaved_ms([fn], repeats, warmup, sync, clock)[0]


def tree_verify_call(engine: LiveEngine, cache: Any, n: int, gen: Any) -> Any:
    """A timed call: one target forward over ``n`` tree tokens after ``cache``'s context (root + a binary tree of
    ``n - 1`` nodes, each row attending to the context and its ancestors, positions by depth), its argmax, and the
    cache cropped back. Without the lean forward: a causal ``n``-token forward."""
    import torch

    runner = engine._lean.get(id(engine.target))
    x = torch.randint(2, engine.vocab, (n,), generator=gen).tolist()
    counts = [min(2, max(0, n - 1 - 2 * v)) for v in range(n)]
    tree = TreeShape.from_children(counts, f"binary-{n - 1}")
    prefix = cache.get_seq_length()  # committed tokens before the root (the first of the n)
    anc = ancestor_matrix(tree_parents(tree, n - 1))
    pos = [prefix + int(d) for d in tree.depth_of]
    mask = tree_mask(anc, 0, n, prefix, engine.device)

    def call():
        if runner is not None:
            logits = runner(x, cache, positions=pos, mask=mask)[:, : engine.vocab]
        else:
            logits = engine.forward(engine.target, x, cache)
        torch.argmax(logits, -1).tolist()
        cache.crop(-n)
    return call


def extend_tree_verify(profile: CostProfile, measured: CostProfile) -> CostProfile:
    """``profile`` with ``verify_ms`` continued to ``measured``'s length: a profile fitted to chain rounds gains the
    micro-benchmarked tree verify costs.

    The continuation shifts ``measured``'s entries beyond ``profile``'s last one by the gap at the join
    (``profile.verify_ms[-1] - measured.verify_ms[m - 1]``), which keeps the measured increments. Where the fitted
    verify is so far below the micro-benchmarked one that a shifted entry would be 0 or negative (the fit and the
    micro-benchmarks disagree by more than a tree forward's cost; seen on a loaded 2-core machine), it scales them
    instead (``entry * profile.verify_ms[-1] / measured.verify_ms[m - 1]``), which keeps their ratios and stays
    positive; the profile's description says which was used. No entry is clipped to a made-up floor.
    """
    m = len(profile.verify_ms)
    if len(measured.verify_ms) <= m:
        return profile
    base, ref = profile.verify_ms[-1], measured.verify_ms[m - 1]
    extra = tuple(round(base + v - ref, 4) for v in measured.verify_ms[m:])
    how = "plus the micro-benchmarked tree-verify increments"
    if min(extra) <= 0:
        extra = tuple(round(base * v / ref, 4) for v in measured.verify_ms[m:])
        how = (f"times the micro-benchmarked tree-verify ratios (the shifted increments would go negative: fitted "
               f"{base:.3f} ms vs micro-benchmarked {ref:.3f} ms at {m} tokens)")
    return dataclasses.replace(profile, verify_ms=profile.verify_ms + extra,
                               description=f"{profile.description}; verify of {m + 1}..{len(measured.verify_ms)} "
                                           f"tree tokens: {base:.3f} ms {how} of {measured.name}")


def measure_profile(pair: LivePair, k_max: int = 8, context: int = 160, repeats: int = 40, warmup: int = 8,
                    name: str = "measured", description: str = "", clock: str = "wall",
                    tree_nodes: int = 0, progress: Callable[[float], None] | None = None) -> CostProfile:
    """Measure draft/verify/overhead costs of ``pair`` at ``context`` tokens of context (``clock`` wall or cpu);
    ``tree_nodes > k_max`` also measures tree verification up to that many draft nodes (``verify_ms`` then has
    ``tree_nodes + 1`` entries). ``progress(fraction_done)`` as the measurement advances."""
    import torch

    if clock not in ("wall", "cpu"):
        raise SpecgymError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if not 0 <= tree_nodes <= TREE_NODE_LIMIT:
        raise SpecgymError(f"tree_nodes must be in 0..{TREE_NODE_LIMIT}, got {tree_nodes}")
    engine = LiveEngine.from_pair(pair, k_max=k_max, timing=clock)
    clk = time.thread_time if clock == "cpu" else time.perf_counter
    n_verify = max(k_max + 1, tree_nodes + 1)
    if context + n_verify + 64 > engine.context:
        raise SpecgymError(
            f"k_max={k_max} / tree_nodes={tree_nodes} with a {context}-token profiling context exceeds the models' "
            f"context of {engine.context}"
        )
    dev = engine.device
    sync = syncer(dev)
    gen = torch.Generator().manual_seed(0)
    ctx_ids = torch.randint(2, engine.vocab, (1, context), generator=gen).to(dev)
    rounds: dict[int, list] = {0: [], 2: [], 4: []}
    with torch.inference_mode():  # the engine's own forward and caches (the lean path for GPT-2)
        caches = {}
        for role, model in (("draft", pair.draft), ("target", pair.target)):
            caches[role] = engine.new_cache(model)
            engine.forward(model, ctx_ids[0].tolist(), caches[role])
        calls = _profile_calls(engine, pair, caches, gen, ctx_ids[0].tolist(), rounds, k_max, n_verify)
        measured = interleaved_ms(calls, repeats, warmup, sync, clk, progress)
    draft_ms, verify = measured[0] / DRAFT_RUN, measured[1: k_max + 2]
    verify += measured[k_max + 2 + len(rounds):]
    verify[0] = float(statistics.median(r.time_ms for r in rounds[0][-repeats:]))  # t_AR: a real plain round
    resid = [r.time_ms - (r.drafted * draft_ms + verify[r.drafted])
             for k in (2, 4) for r in rounds[k][-repeats:] if r.drafted > 0]
    overhead = max(0.0, float(statistics.median(resid))) if resid else 0.0
    return CostProfile(
        name=name, draft_ms=round(draft_ms, 4), verify_ms=tuple(round(v, 4) for v in verify),
        round_overhead_ms=round(overhead, 4), source="measured",
        description=description or (f"measured by specgym profile: draft {portable_name(pair.draft_name)}, target "
                                    f"{portable_name(pair.target_name)} ({pair.dtypes}), context {context} "
                                    f"tokens, medians of {repeats} interleaved calls"
                                    + (f"; verify of {k_max + 2}..{n_verify} tokens: tree attention over a binary "
                                       f"tree" + ("" if engine.lean else " (causal: no lean forward)")
                                       if n_verify > k_max + 1 else "")),
        hardware={**hardware_description(str(dev), pair.dtypes), "clock": clock, "packed_linears": pair.packed},
    )


def _profile_calls(engine: LiveEngine, pair: LivePair, caches: dict[str, Any], gen: Any, prompt: list[int],
                   rounds: dict[int, list], k_max: int, n_verify: int) -> list[Callable[[], None]]:
    """What :func:`measure_profile` times, in one round-robin: a round's worth of draft tokens, target forwards of
    1..``k_max + 1`` tokens, real engine rounds (plain and K = each key of ``rounds``, whose results are appended
    there: t_AR and the per-round overhead) and tree verifications of ``k_max + 2``..``n_verify`` tokens."""
    live: dict[str, Any] = {"req": None}  # the request the engine rounds play, restarted when it is done
    calls = [_draft_run_call(engine, pair.draft, caches["draft"], gen)]
    calls += [_forward_call(engine, pair.target, caches["target"], n, False, gen) for n in range(1, k_max + 2)]
    calls += [_engine_round_call(engine, prompt, live, rounds, k) for k in rounds]
    calls += [tree_verify_call(engine, caches["target"], n, gen) for n in range(k_max + 2, n_verify + 1)]
    return calls


def _forward_call(engine: LiveEngine, model: Any, cache: Any, n: int, features: bool,
                  gen: Any) -> Callable[[], None]:
    """A cached forward of ``n`` random tokens, its cache cropped back after; with ``features``, what the engine
    computes per draft token (token, confidence, entropy), else the target's argmax."""
    import torch

    x = torch.randint(2, engine.vocab, (n,), generator=gen).tolist()

    def call() -> None:
        logits = engine.forward(model, x, cache)
        if features:  # what the engine does per draft token: token, conf, entropy
            st = draft_stats(logits[-1:], 0.0)
            int(st.tokens[0]), float(st.conf[0]), float(st.entropy[0])
        else:
            torch.argmax(logits, -1).tolist()
        cache.crop(-n)
    return call


def _draft_run_call(engine: LiveEngine, draft: Any, cache: Any, gen: Any) -> Callable[[], None]:
    """A round's worth of draft tokens (:data:`DRAFT_RUN` one-token forwards): the first one starts with cold
    caches, as a round's does."""
    one = _forward_call(engine, draft, cache, 1, True, gen)

    def call() -> None:
        for _ in range(DRAFT_RUN):
            one()
    return call


def _engine_round_call(engine: LiveEngine, prompt: list[int], live: dict[str, Any], rounds: dict[int, list],
                       k: int) -> Callable[[], None]:
    """One real engine round drafting ``k`` tokens (0: plain decoding) of the request in ``live`` (a new one from
    ``prompt`` when there is none or it is done); its result is appended to ``rounds[k]``."""
    def call() -> None:
        if live["req"] is None or live["req"].done:
            live["req"] = engine.start(prompt, 48)
        rounds[k].append(live["req"].play(k))
    return call


def measure_batch_profile(pair: LivePair, batch_sizes: tuple[int, ...], k_max: int = 8, context: int = 160,
                          repeats: int = 12, warmup: int = 3, name: str = "measured-batched",
                          clock: str = "wall", progress: Callable[[float], None] | None = None) -> BatchCostProfile:
    """A batched cost profile of ``pair`` on this machine: for each batch size ``b`` one cached draft forward of
    ``b`` sequences x 1 token (with the draft features) and one cached target forward of ``b`` x ``n`` tokens,
    ``n = 1..k_max+1`` (with the argmax), every sequence at ``context`` tokens of context; medians of ``repeats``.

    The per-step overhead is the single-sequence engine's (:func:`measure_profile` at batch 1) at every batch size:
    the live engine decodes one request at a time, so larger batches have no engine of their own to measure.
    """
    import torch
    from transformers import DynamicCache

    share = 1.0 / (len(batch_sizes) + 1)  # progress: the single-sequence profile, then each batch size
    tick = progress or (lambda f: None)
    single = measure_profile(pair, k_max=k_max, context=context, repeats=repeats, warmup=warmup, clock=clock,
                             progress=lambda f: tick(f * share))
    clk = time.thread_time if clock == "cpu" else time.perf_counter
    engine = LiveEngine.from_pair(pair, k_max=k_max, timing=clock)
    dev = engine.device
    sync = syncer(dev)
    gen = torch.Generator().manual_seed(0)
    drafts, verifies = [], []
    with torch.inference_mode():
        for i, b in enumerate(batch_sizes):
            tick((i + 1) * share)
            ctx_ids = torch.randint(2, engine.vocab, (b, context), generator=gen).to(dev)
            caches = {}
            for role, model in (("draft", pair.draft), ("target", pair.target)):
                cache = DynamicCache()
                model(input_ids=ctx_ids, cache=cache, use_cache=True)
                caches[role] = cache

            def step(model, cache, n, features, b=b):
                x = torch.randint(2, engine.vocab, (b, n), generator=gen).to(dev)

                def call():
                    logits = model(input_ids=x, cache=cache, use_cache=True).logits[:, :, : engine.vocab]
                    if features:
                        st = draft_stats(logits[:, -1], 0.0)
                        st.tokens.tolist(), st.conf.tolist(), st.entropy.tolist()
                    else:
                        torch.argmax(logits, -1).tolist()
                    cache.crop(-n)
                return call

            drafts.append(round(_median_ms(step(pair.draft, caches["draft"], 1, True), repeats, warmup, sync, clk),
                                4))
            verifies.append(tuple(round(_median_ms(step(pair.target, caches["target"], n, False), repeats, warmup,
                                                   sync, clk), 4) for n in range(1, k_max + 2)))
    return BatchCostProfile(
        name, tuple(batch_sizes), tuple(drafts), tuple(verifies), tuple(single.round_overhead_ms for _ in batch_sizes),
        source="measured", description=(f"measured by specgym profile --batch-sizes: draft "
                                        f"{portable_name(pair.draft_name)}, target {portable_name(pair.target_name)} "
                                        f"({pair.dtypes}), context {context} tokens per sequence, medians of "
                                        f"{repeats} calls; overhead: the single-sequence engine's"),
        hardware={**hardware_description(str(dev), pair.dtypes), "clock": clock, "packed_linears": pair.packed,
                  "target_params": sum(p.numel() for p in pair.target.parameters()),
                  "draft_params": sum(p.numel() for p in pair.draft.parameters())})

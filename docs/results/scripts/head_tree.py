"""Trees drafted by the draft head on the real pair (SmolLM2-135M-Instruct and its head), live, greedy.

1. The target's tree-verify cost by node count: one forward over the root and ``n`` draft nodes with the tree
   attention mask (``n = 0``: the plain decode step), at the context of a real prompt, the median of ``--repeats``
   (CPU time of the thread, and wall time).
2. Decoding ``--prompts`` validation prompts (the first of each category in data/workloads/smollm2-prompts.jsonl) for
   ``--tokens`` new tokens: plain decoding, the head chain ``fixed:3@head``, static head trees and EAGLE-2 on the
   head; tokens/s over the whole set (the engine's ``timing="cpu"``: the thread's CPU time, which leaves out the time
   other jobs preempted it), each row's output checked against plain decoding.

3. With ``--replay TRACE`` (a greedy recording of the pair that carries the head's per-start ranks ``ranks_head``,
   e.g. ``specgym record --pair smollm2 ...`` of the val and test prompts), instead of 1 and 2: replay against live
   on the first ``--prompts`` val requests of the trace (one per category): the head chain ``fixed:3@head``, a static
   head tree and EAGLE-2 on the head (``tree-eagle:5:3:10@head``), each decoded live (CPU time) and replayed from
   the trace (chain: ``runs_head``; trees: ``ranks_head`` / ``topk_head``, priced by the trace's profile): tokens per
   round, how many requests' rounds (position, accepted) are identical, and the speedup over plain decoding, live
   (measured) and replayed (predicted). Each live output is checked against the recorded completion.

``--add-ranks OUT`` writes such a trace without regenerating: the val and test requests of the shipped
``smollm2-greedy`` recording with the head's ranks added by the recorder's code
(:func:`~specgym.envs.engines.live.recorder.with_head_ranks`, one teacher-forced target forward per request).

One torch thread. The figures are measured on a shared machine: label them "measured while other jobs ran".

Run: ``python docs/results/scripts/head_tree.py [--prompts 4] [--tokens 64] [--repeats 15]`` (a few minutes);
``python docs/results/scripts/head_tree.py --add-ranks out/head-ranks/smollm2-valtest-greedy.parquet`` then
``python docs/results/scripts/head_tree.py --replay out/head-ranks/smollm2-valtest-greedy.parquet [--prompts 4]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch

from specgym.baselines.tree_eagle import EagleTree
from specgym.catalogue import pair_models
from specgym.envs.core.kinds import HEAD_DRAFTER
from specgym.envs.core.tree import TreeShape
from specgym.envs.engines.live.engine import LiveEngine
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair
from specgym.envs.engines.live.recorder import with_head_ranks
from specgym.envs.engines.live.tree import LiveTreeRequest, ancestor_matrix, tree_mask, tree_parents
from specgym.envs.engines.replay.trace_engine import TraceEngine
from specgym.envs.engines.replay.tree_engine import TreeEngine
from specgym.envs.workloads.prompts import read_prompts
from specgym.envs.workloads.trace_format import load_workload, save_workload
from specgym.paths import WORKLOADS_DIR

NODES = (0, 1, 2, 4, 8, 16, 32)
#: Static head trees (per-depth widths) and EAGLE-2 settings (depth, beam, budget) decoded in part 2.
SHAPES = ((1, 1, 1), (2, 2, 1), (3, 2, 1), (4, 2, 2, 1), (2, 2, 2, 2, 1))
EAGLES = ((5, 3, 10), (6, 4, 16), (6, 6, 24))


def verify_cost(eng: LiveEngine, ids: list[int], repeats: int) -> list[tuple[int, float, float]]:
    """``(nodes, cpu ms, wall ms)``: one target forward over the root and ``nodes`` tree nodes (a bushy tree, every
    node at its depth's position under the tree mask), after ``ids[:-1]`` are cached; medians of ``repeats``."""
    runner = eng.runner_of(eng.target)
    cache = runner.new_cache()
    bushy = TreeShape.from_widths((4, 4, 2))  # 4 + 16 + 32 nodes: the first n of them, breadth-first
    out = []
    with torch.inference_mode():
        runner(ids[:-1], cache, hidden=True)
        base = cache.length
        for n in NODES:
            parent = tree_parents(bushy, n)
            depth = bushy.depth_of[: n + 1].tolist()
            tokens = [ids[-1]] + [ids[(v * 7) % len(ids)] for v in range(1, n + 1)]
            kw = {} if n == 0 else {"positions": [base + d for d in depth],
                                    "mask": tree_mask(ancestor_matrix(parent), 0, n + 1, base, eng.device)}
            cpu, wall = [], []
            for r in range(repeats + 2):
                c0, w0 = time.thread_time(), time.perf_counter()
                runner(tokens, cache, hidden=True, **kw)
                c1, w1 = time.thread_time(), time.perf_counter()
                cache.crop(base)
                if r >= 2:  # two warm-up calls
                    cpu.append(1000 * (c1 - c0))
                    wall.append(1000 * (w1 - w0))
            out.append((n, statistics.median(cpu), statistics.median(wall)))
    return out


def _live_rounds(eng: LiveEngine, ids: list[int], n: int, how: tuple) -> tuple[list[int], float, list[tuple], int]:
    """One live request of plain decoding, the head chain or a head tree: ``(tokens, ms, [(position, accepted),
    ...], nodes verified)``."""
    kind, arg = how
    if kind == "plain":
        res = eng.run_plain(ids, n)
        return res.tokens, res.time_ms, [(r.position, 0) for r in res.rounds], 0
    if kind == "chain":
        req = eng.start(ids, n)
        while not req.done:
            req.play(arg, drafter=HEAD_DRAFTER)
        r = req.result
        return r.tokens, r.time_ms, [(x.position, x.accepted) for x in r.rounds], r.drafted
    treq = LiveTreeRequest(eng, ids, n, drafter=HEAD_DRAFTER)
    while not treq.done:
        if kind == "tree":
            treq.play_tree(arg)
        else:
            treq.play_eagle(*arg)
    tr = treq.tree_result
    return tr.tokens, tr.time_ms, [(x.position, x.accepted) for x in tr.rounds], tr.drafted


def decode(eng: LiveEngine, ids: list[int], n: int, how: tuple) -> tuple[list[int], float, int, int]:
    """One request: ``(tokens, ms, rounds, nodes verified)`` of plain decoding, the head chain or a head tree."""
    tokens, ms, rounds, nodes = _live_rounds(eng, ids, n, how)
    return tokens, ms, len(rounds), nodes


def _replayed_rounds(chain: TraceEngine, tree: TreeEngine, r: int, how: tuple) -> tuple[float, list[tuple]]:
    """One replayed request: ``(predicted ms, [(position, accepted), ...])``."""
    kind, arg = how
    if kind in ("plain", "chain"):
        req = chain.start(r)
        out = []
        while not req.done:
            o = req.play(0 if kind == "plain" else arg)
            out.append((o.time_ms, (o.position, o.accepted)))
    else:
        ctrl = EagleTree(*arg) if kind == "eagle" else None
        treq = tree.start(r)
        out = []
        while not treq.done:
            t = ctrl.play(treq) if ctrl is not None else treq.play(arg)
            out.append((t.time_ms, (t.position, t.accepted)))
    return sum(t for t, _ in out), [x for _, x in out]


def replay_vs_live(pair: Any, eng: LiveEngine, trace: str, prompts: int) -> None:
    """Part 3 (module docstring)."""
    wl = load_workload(trace)
    chain = TraceEngine(wl, wl.profile, 8, drafter=HEAD_DRAFTER)
    tree = TreeEngine(wl, wl.profile, 8, drafter=HEAD_DRAFTER)
    picked, seen = [], set()
    for r in range(wl.n_requests):
        if wl.split[r] == "val" and wl.category[r] not in seen and len(picked) < prompts:
            seen.add(wl.category[r])
            picked.append(r)
    rows = [("plain", ("plain", None)), ("fixed:3@head", ("chain", 3)),
            ("tree-static:2-2-1@head", ("tree", TreeShape.from_widths((2, 2, 1)))),
            ("tree-eagle:5:3:10@head", ("eagle", (5, 3, 10)))]
    tot = {name: [0, 0.0, 0.0, 0, 0, 0, True] for name, _ in rows}  # tokens, live ms, replay ms, live/replay rounds,
    for r in picked:  # same rounds, identical output; rows interleaved per prompt
        ids = encode_prompt(pair.tokenizer, wl.prompt_text[r])
        truth = wl.token_id[wl.span(r)].tolist()
        for name, how in rows:
            toks, ms, live, _ = _live_rounds(eng, ids, len(truth), how)
            pred, rep = _replayed_rounds(chain, tree, r, how)
            t = tot[name]
            t[0] += len(toks)
            t[1] += ms
            t[2] += pred
            t[3] += len(live)
            t[4] += len(rep)
            t[5] += live == rep
            t[6] = bool(t[6] and toks == truth)
    ids = ", ".join(str(wl.request_id[r]) for r in picked)
    print(f"3. replay vs live, {len(picked)} val requests of {wl.name} ({ids}), greedy; live: CPU time, measured while "
          f"other jobs ran; replay: profile {wl.profile.name}\n{'row':<24} {'live tok/rnd':>12} {'replay tok/rnd':>14} "
          f"{'same rounds':>11} {'live x plain':>12} {'replay x plain':>14} output ok")
    plain = tot["plain"]
    for name, (tok, live_ms, rep_ms, lr, rr, same, ok) in tot.items():
        print(f"{name:<24} {tok / lr:>12.2f} {tok / rr:>14.2f} {f'{same}/{len(picked)}':>11} "
              f"{plain[1] / live_ms:>12.3f} {plain[2] / rep_ms:>14.3f} {ok}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--replay", default=None, metavar="TRACE", help="part 3 only: replay vs live on this recording")
    ap.add_argument("--add-ranks", default=None, metavar="OUT",
                    help="write smollm2-greedy's val and test requests with the head's ranks to OUT, and stop")
    args = ap.parse_args()
    torch.set_num_threads(1)
    draft, target = pair_models("smollm2")
    pair = load_pair(str(draft), str(target))
    eng = LiveEngine.from_pair(pair, k_max=8, timing="cpu")
    if args.add_ranks:
        wl = load_workload("smollm2-greedy")
        sub = wl.subset(np.flatnonzero(np.isin(wl.split, ["val", "test"])))
        t0 = time.perf_counter()
        out = with_head_ranks(sub.with_columns(sub.flat_columns(), name="smollm2-valtest-greedy"), pair)
        save_workload(out, args.add_ranks, overwrite=True)
        print(f"{args.add_ranks}: {out.n_requests} requests, {out.n_positions} positions, head ranks added in "
              f"{time.perf_counter() - t0:.1f} s")
        return
    if args.replay:
        replay_vs_live(pair, eng, args.replay, args.prompts)
        return
    specs, seen = [], set()
    for p in read_prompts(WORKLOADS_DIR / "smollm2-prompts.jsonl"):
        if p.split == "val" and p.category not in seen and len(specs) < args.prompts:
            seen.add(p.category)
            specs.append(p)
    prompts = [encode_prompt(pair.tokenizer, p.text) for p in specs]
    print(f"smollm2 ({pair.dtypes}), head kernel {pair.head.kernel}, torch threads {torch.get_num_threads()}; "
          f"measured while other jobs ran")
    print(f"\n1. target forward by tree nodes (prompt {specs[0].request_id}, {len(prompts[0])} tokens cached; median "
          f"of {args.repeats})\n{'nodes':>5} {'tokens':>6} {'cpu ms':>8} {'wall ms':>8} {'x 1 token':>9}")
    cost = verify_cost(eng, prompts[0], args.repeats)
    for n, cpu, wall in cost:
        print(f"{n:>5} {n + 1:>6} {cpu:>8.2f} {wall:>8.2f} {cpu / cost[0][1]:>9.2f}")
    rows = [("plain", ("plain", None)), ("fixed:3@head (chain)", ("chain", 3))]
    rows += [(f"tree-static:{'-'.join(map(str, w))}@head", ("tree", TreeShape.from_widths(w))) for w in SHAPES]
    rows += [(f"tree-eagle:{d}:{b}:{m}@head", ("eagle", (d, b, m))) for d, b, m in EAGLES]
    totals = {name: [0, 0.0, 0, 0, True] for name, _ in rows}  # tokens, ms, rounds, nodes, identical
    for ids in prompts:  # rows interleaved per prompt: a load change hits every row alike
        ref = None
        for name, how in rows:
            toks, ms, rounds, nodes = decode(eng, ids, args.tokens, how)
            ref = toks if ref is None else ref
            t = totals[name]
            t[0] += len(toks)
            t[1] += ms
            t[2] += rounds
            t[3] += nodes
            t[4] = bool(t[4] and toks == ref)
    names = ", ".join(p.request_id for p in specs)
    print(f"\n2. decoding {len(prompts)} val prompts ({names}) x {args.tokens} tokens, greedy, CPU time\n"
          f"{'row':<28} {'tok/s':>7} {'x plain':>7} {'x chain':>7} {'tok/round':>9} "
          f"{'nodes/round':>11} identical")
    plain, chain = totals["plain"], totals["fixed:3@head (chain)"]
    for name, (tok, ms, rounds, nodes, same) in totals.items():
        rate = tok / ms * 1000
        print(f"{name:<28} {rate:>7.1f} {rate / (plain[0] / plain[1] * 1000):>7.3f} "
              f"{rate / (chain[0] / chain[1] * 1000):>7.3f} {tok / rounds:>9.2f} {nodes / rounds:>11.1f} {same}")


if __name__ == "__main__":
    main()

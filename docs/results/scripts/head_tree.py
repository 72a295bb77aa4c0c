"""Trees drafted by the draft head on the real pair (SmolLM2-135M-Instruct and its head), live, greedy.

1. The target's tree-verify cost by node count: one forward over the root and ``n`` draft nodes with the tree
   attention mask (``n = 0``: the plain decode step), at the context of a real prompt, the median of ``--repeats``
   (CPU time of the thread, and wall time).
2. Decoding ``--prompts`` validation prompts (the first of each category in data/workloads/smollm2-prompts.jsonl) for
   ``--tokens`` new tokens: plain decoding, the head chain ``fixed:3@head``, static head trees and EAGLE-2 on the
   head; tokens/s over the whole set (the engine's ``timing="cpu"``: the thread's CPU time, which leaves out the time
   other jobs preempted it), each row's output checked against plain decoding.

One torch thread. The figures are measured on a shared machine: label them "measured while other jobs ran".

Run: ``python docs/results/scripts/head_tree.py [--prompts 4] [--tokens 64] [--repeats 15]`` (a few minutes).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specgym.catalogue import pair_models
from specgym.envs.core.kinds import HEAD_DRAFTER
from specgym.envs.core.tree import TreeShape
from specgym.envs.engines.live.engine import LiveEngine
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair
from specgym.envs.engines.live.tree import LiveTreeRequest, ancestor_matrix, tree_mask, tree_parents
from specgym.envs.workloads.prompts import read_prompts
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


def decode(eng: LiveEngine, ids: list[int], n: int, how: tuple) -> tuple[list[int], float, int, int]:
    """One request: ``(tokens, ms, rounds, nodes verified)`` of plain decoding, the head chain or a head tree."""
    kind, arg = how
    if kind == "plain":
        res = eng.run_plain(ids, n)
        return res.tokens, res.time_ms, len(res.rounds), 0
    if kind == "chain":
        req = eng.start(ids, n)
        while not req.done:
            req.play(arg, drafter=HEAD_DRAFTER)
        return req.result.tokens, req.result.time_ms, len(req.result.rounds), req.result.drafted
    treq = LiveTreeRequest(eng, ids, n, drafter=HEAD_DRAFTER)
    while not treq.done:
        if kind == "tree":
            treq.play_tree(arg)
        else:
            treq.play_eagle(*arg)
    tr = treq.tree_result
    return tr.tokens, tr.time_ms, len(tr.rounds), tr.drafted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    draft, target = pair_models("smollm2")
    pair = load_pair(str(draft), str(target))
    eng = LiveEngine.from_pair(pair, k_max=8, timing="cpu")
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

"""``specgym tune vllm``: the batch-size -> K table of vLLM's Dynamic Speculative Decoding, from your traces and your
hardware profile.

vLLM's speculative config takes ``"num_speculative_tokens_per_batch_size": [[start_bs, end_bs, K], ...]``; its
authors give no defaults because the right table depends on the hardware and on the traffic's acceptance. With
every sequence in flight drafting the same K, a step at batch size ``b`` produces ``b * E_K`` tokens in
``step_time(b, K)``, where ``E_K`` (tokens per sequence-step at fixed K) comes from replaying the trace and
``step_time`` from the batched cost profile. The table picks, for every concurrency ``b``, the K with the highest
throughput ``b * E_K / step_time(b, K)`` and merges equal neighbours into ranges, so it is at least as fast as the
best static K at every concurrency by construction. A closed-loop batched replay at a few concurrencies checks the
model on the first ``check_requests`` requests (``checks`` in the result).

A profile measured from vLLM also prices an engine *without* speculation (``plain_step_ms``), which is not the
speculative engine at K = 0: vLLM 0.32 runs the drafter's forward over every verified token at every step, K = 0
included, to keep the drafter's KV cache whole (``SpecDecodeBaseProposer.propose`` in
``vllm/v1/spec_decode/llm_base_proposer.py``, called from ``GPUModelRunner.propose_draft_token_ids``). Where plain
decoding beats every K, no table can match it, so the result names those batch sizes (``plain_faster``): traffic
there is served faster by an engine without speculation.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from specgym.envs.core.batch_cost import BatchCostProfile
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.envs.engines.replay.batch_engine import BatchReplay
from specgym.envs.engines.replay.trace_engine import TraceEngine, VectorReplay
from specgym.envs.engines.serving.vllm_profile import plain_profile
from specgym.envs.workloads.trace_format import Workload
from specgym.eval.stats import geomean


def tokens_per_step(workload: Workload, requests: np.ndarray, profile: BatchCostProfile, k_max: int,
                    seed: int = 0) -> np.ndarray:
    """``E_K``: tokens per sequence-step when every step drafts K, K = 0..k_max (replay of ``requests``)."""
    engine = TraceEngine(workload, profile.at(1), k_max, seed=seed)  # the profile only prices; E_K ignores it
    out = np.ones(k_max + 1)
    for k in range(1, k_max + 1):
        v = VectorReplay(engine, requests)
        v.run_fixed(k)
        out[k] = float((v.pos - v.start).sum()) / float(v.rounds.sum())
    return out


def merge_ranges(kstar: np.ndarray) -> list[list[int]]:
    """``kstar[b - 1]`` per batch size -> ``[[start_bs, end_bs, K], ...]`` with equal neighbours merged."""
    rows: list[list[int]] = []
    for b, k in enumerate(kstar.tolist(), start=1):
        if rows and rows[-1][2] == k:
            rows[-1][1] = b
        else:
            rows.append([b, b, int(k)])
    return rows


def ranges_where(mask: np.ndarray) -> list[list[int]]:
    """Batch sizes ``b`` (1-based) with ``mask[b - 1]`` as ``[[start_bs, end_bs], ...]``."""
    return [[s, e] for s, e, on in merge_ranges(mask.astype(np.int64)) if on]


def tune_vllm(workload: Workload, profile: BatchCostProfile, max_batch: int = 512, k_max: int = DEFAULT_K_MAX,
              split: str = "all", seed: int = 0, check_batches: tuple[int, ...] = (1, 8, 64),
              check_requests: int = 256) -> dict[str, Any]:
    """The table and its predicted speedups (see the module docstring)."""
    t0 = time.perf_counter()
    profile.check_k_max(k_max)
    requests = workload.split_indices(split)
    e_k = tokens_per_step(workload, requests, profile, k_max, seed)
    bs = np.arange(1, max_batch + 1)
    times = np.array([[profile.step_time(float(b), k) for k in range(k_max + 1)] for b in bs])
    thr = bs[:, None] * e_k[None, :] / times * 1000.0  # tokens/s
    kstar = thr.argmax(1)
    table = merge_ranges(kstar)
    static_k = int(np.argmax(geomean(thr, axis=0)))  # best single K over every concurrency (geometric mean)
    best_thr = thr[np.arange(len(bs)), kstar]
    plain_thr = None  # an engine without speculation: one token per sequence-step (profiles measured from vLLM)
    if "plain_step_ms" in profile.hardware:
        plain = plain_profile(profile)
        plain_thr = bs / np.array([plain.step_time(float(b), 0) for b in bs]) * 1000.0
    ranges = []
    for start, end, k in table:
        sl = slice(start - 1, end)
        ranges.append({"start_bs": start, "end_bs": end, "k": k,
                       "speedup_vs_static": geomean(best_thr[sl] / thr[sl, static_k]),
                       "speedup_vs_no_spec": geomean(best_thr[sl] / thr[sl, 0]),
                       **({} if plain_thr is None else {"speedup_vs_plain": geomean(best_thr[sl] / plain_thr[sl])})})
    checks = []
    for b in check_batches:
        if b > max_batch:
            continue
        k = int(kstar[b - 1])
        sim = BatchReplay(workload, profile, int(b), requests=requests[:check_requests], k_max=k_max, seed=seed)
        sim.run_fixed(k)
        checks.append({"batch": int(b), "k": k, "predicted_tok_s": float(thr[b - 1, k]),
                       "simulated_tok_s": sim.throughput()})
    return {
        "workload": workload.name, "synthetic": workload.is_synthetic, "profile": profile.name,
        "profile_source": profile.source, "max_batch": max_batch, "k_max": k_max, "split": split,
        "tokens_per_step": e_k.tolist(), "table": table, "static_k": static_k, "ranges": ranges,
        "no_worse_than_static_everywhere": bool((best_thr >= thr[:, static_k] - 1e-9).all()),
        "checks": checks, "seconds": time.perf_counter() - t0,
        "plain_faster": None if plain_thr is None else ranges_where(plain_thr > best_thr),
        "vllm_fragment": f'"num_speculative_tokens_per_batch_size": {table}'.replace(" ", "").replace(":", ": ", 1),
    }


def describe(result: dict[str, Any]) -> list[str]:
    """Human-readable lines of a tuning result."""
    lines = [f"vLLM Dynamic SD table for {result['workload']}" + (" (synthetic)" if result["synthetic"] else "")
             + f" on {result['profile']} ({result['profile_source']} profile), concurrency 1..{result['max_batch']}:",
             "", result["vllm_fragment"], ""]
    same = result["static_k"] == 0  # the best static K is no speculation: one column says it all
    plain = all("speedup_vs_plain" in r for r in result["ranges"]) and bool(result["ranges"])
    k0 = ("vs K=0 (drafter on)" if plain else "vs no speculation") + (" (= the best static K)" if same else "")
    lines.append(f"{'batch sizes':>14} {'K':>3} "
                 + ("" if same else f"{'vs best static K=' + str(result['static_k']):>22} ")
                 + f"{k0:>18}"
                 + (f" {'vs plain decoding':>18}" if plain else ""))
    for r in result["ranges"]:
        lines.append(f"{r['start_bs']:>6} - {r['end_bs']:<6} {r['k']:>3} "
                     + ("" if same else f"{r['speedup_vs_static']:>21.3f}x ")
                     + f"{r['speedup_vs_no_spec']:>17.3f}x"
                     + (f" {r['speedup_vs_plain']:>17.3f}x" if plain else ""))
    lines.append("")
    for c in result["checks"]:
        lines.append(f"check at concurrency {c['batch']}: predicted {c['predicted_tok_s']:.1f} tok/s, closed-loop "
                     f"replay {c['simulated_tok_s']:.1f} tok/s ({c['simulated_tok_s'] / c['predicted_tok_s']:.3f})")
    if result.get("plain_faster"):
        where = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in result["plain_faster"])
        lines.append(f"plain decoding (an engine without speculation) is faster than every K at batch sizes {where}: "
                     "vLLM runs the drafter every step, even at K = 0, so no table matches it there; serve that "
                     "traffic without speculation")
    ok = "yes" if result["no_worse_than_static_everywhere"] else "NO"
    lines.append(f"table >= best static K at every concurrency: {ok}; computed in {result['seconds']:.1f} s")
    return lines

"""Live-engine benchmark (``specgym bench --sections live``): sim-to-real for every controller on a real pair.

On the test prompts of a workload recorded from the pair (the same requests the replay harness evaluates), every
controller decodes live, with the pair on this machine:

* plain decoding (the target alone, its fastest path) and fixed K = 1..6, every baseline and every given policy;
* live tokens/s, median of ``repeats`` repeats (controllers interleaved within each repeat, so load changes on a
  shared machine hit all of them alike), and the speedup over plain decoding;
* the **replay prediction** for the same requests: the replay engine plays the controller on the recorded trace of
  those requests and prices its rounds with the pair's cost profile; ``measured / predicted`` tells how far the cost
  model is from the machine;
* whether every greedy output equals plain decoding, token for token;
* once through transformers' ``generate(assistant_model=...)`` (:func:`generate_with_controller`) with the best
  controller, against transformers' own plain ``generate()``.

One torch thread. Results are printed and written as JSON (``--json``); the README's live table comes from here.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from specgym.paths import MODELS_DIR, default_pair_name, pair_profile


def _policies() -> list[str]:
    from specgym.agents.policy_controller import list_policies

    return [f"ppo:{p}" for p in list_policies()]


def controller_specs(k_values=range(1, 7)) -> list[str]:
    """Plain decoding, fixed K, every baseline, every shipped policy."""
    from specgym.baselines.registry import ALL_BASELINES

    return ["fixed:0", *(f"fixed:{k}" for k in k_values), *ALL_BASELINES, *_policies()]


def run_live_bench(console: Any, pair_name: str | None = None, workload: str | None = None,
                   per_category: int = 8, repeats: int = 3, specs: list[str] | None = None, threads: int = 1,
                   max_new_tokens: int | None = None) -> dict[str, Any]:
    """Run the live benchmark; returns every figure (also printed as a table)."""
    import torch
    import transformers
    from rich.table import Table

    from specgym.baselines.registry import make_controller
    from specgym.envs.core.cost import load_profile
    from specgym.envs.core.rounds import DEFAULT_K_MAX
    from specgym.envs.engines.live_engine import LiveEngine, load_pair
    from specgym.envs.engines.trace_engine import TraceEngine
    from specgym.envs.workloads.trace_format import cached_workload
    from specgym.eval.runner import run_controller

    torch.set_num_threads(threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    pair_name = pair_name or default_pair_name()
    pair = load_pair(str(MODELS_DIR / pair_name / "draft"), str(MODELS_DIR / pair_name / "target"))
    prof_path = pair_profile(pair_name)
    if prof_path is None:
        raise RuntimeError(f"no measured profile cpu-{pair_name}.json: run specgym profile first")
    prof = load_profile(prof_path)
    wl = cached_workload(workload or f"{pair_name}-greedy")
    test = wl.split_indices("test")
    chosen: list[int] = []
    for cat in wl.categories():
        chosen += [int(r) for r in test if wl.category[r] == cat][:per_category]
    requests = np.asarray(chosen, dtype=np.int64)
    texts = wl.prompt_text or []
    if not texts:
        raise RuntimeError(f"workload {wl.name} stores no prompt texts: record it with specgym record")
    prompts = [pair.tokenizer(texts[r], add_special_tokens=False)["input_ids"] for r in requests]
    lengths = [int(wl.lengths[r]) if max_new_tokens is None else max_new_tokens for r in requests]
    specs = specs or controller_specs()
    k_max = DEFAULT_K_MAX
    eng = LiveEngine.from_pair(pair, k_max=k_max, profile=prof, timing="wall")
    replay = TraceEngine(wl, prof, k_max, seed=0)
    eng.run_request(prompts[0], None, 16)  # warm-up both models
    eng.run_request(prompts[0], 3, 16)
    live_ms: dict[str, list[float]] = {s: [] for s in specs}
    accepted: dict[str, list[int]] = {s: [0, 0] for s in specs}
    identical = dict.fromkeys(specs, True)
    plain_tokens: list[list[int]] = []
    t_start = time.perf_counter()
    for rep in range(repeats):
        order = specs[rep % len(specs):] + specs[: rep % len(specs)]
        for spec in order:
            ctrl = make_controller(spec, k_max)
            total = 0.0
            for i, (ids, n) in enumerate(zip(prompts, lengths)):
                res = eng.run_request(ids, ctrl if spec != "fixed:0" else None, n, request_id=str(wl.request_id[
                    requests[i]]), category=str(wl.category[requests[i]]))
                total += res.time_ms
                if rep == 0:  # the first repeat runs plain decoding first: greedy exactness is checked on it
                    accepted[spec][0] += res.accepted
                    accepted[spec][1] += res.drafted
                    if spec == "fixed:0":
                        plain_tokens.append(res.tokens)
                    identical[spec] &= res.tokens == plain_tokens[i]
            live_ms[spec].append(total)
            console.print(f"  repeat {rep + 1}/{repeats} {spec:<22} {sum(lengths) / total * 1000:7.1f} tok/s",
                          highlight=False)
    n_tok = sum(lengths)
    plain_ms = statistics.median(live_ms["fixed:0"])
    rows: list[dict[str, Any]] = []
    for spec in specs:
        ms = statistics.median(live_ms[spec])
        pred = run_controller(replay, requests, make_controller(spec, k_max))
        pred_ms = float(pred.time_ms.sum())
        rows.append({"controller": spec, "tok_s": n_tok / ms * 1000.0, "speedup": plain_ms / ms,
                     "predicted_tok_s": n_tok / pred_ms * 1000.0, "predicted_speedup": n_tok * prof.t_ar_ms / pred_ms,
                     "measured_over_predicted": pred_ms / ms,
                     "acceptance": accepted[spec][0] / max(accepted[spec][1], 1),
                     "greedy_identical": identical[spec], "repeats_ms": live_ms[spec]})
    fixed = [r for r in rows if r["controller"].startswith("fixed:") and r["controller"] != "fixed:0"]
    best_fixed = max(fixed, key=lambda r: r["tok_s"])
    best = max(rows, key=lambda r: r["tok_s"])
    hf = _hf_generate(pair, prompts[:6], lengths[:6], make_controller(best["controller"], k_max), prof)
    result = {
        "pair": pair_name, "dtypes": pair.dtypes, "packed_linears": pair.packed, "profile": prof.name,
        "workload": wl.name, "prompts": len(prompts), "tokens": n_tok, "repeats": repeats, "clock": "wall",
        "threads": torch.get_num_threads(), "plain_tok_s": n_tok / plain_ms * 1000.0, "rows": rows,
        "best_fixed_k": int(best_fixed["controller"].split(":")[1]), "best_fixed_speedup": best_fixed["speedup"],
        "best_controller": best["controller"], "best_speedup": best["speedup"], "hf_generate": hf,
        "max_new_tokens": max_new_tokens or f"recorded lengths (mean {n_tok / len(prompts):.0f})",
        "wall_s": time.perf_counter() - t_start,
    }
    table = Table(title=f"live, {pair_name} ({pair.dtypes}), {len(prompts)} test prompts of {wl.name}, "
                        f"{n_tok} tokens, median of {repeats}, wall clock, 1 thread")
    for col in ("controller", "live tok/s", "speedup vs plain", "replay prediction tok/s", "measured / predicted",
                "acceptance", "greedy = plain"):
        table.add_column(col, justify="right")
    for r in sorted(rows, key=lambda r: -r["tok_s"]):
        table.add_row(r["controller"], f"{r['tok_s']:.1f}", f"{r['speedup']:.3f}x", f"{r['predicted_tok_s']:.1f}",
                      f"{r['measured_over_predicted']:.3f}", f"{r['acceptance']:.2f}", str(r["greedy_identical"]))
    console.print(table)
    console.print(f"best fixed K={result['best_fixed_k']}: {best_fixed['speedup']:.3f}x plain; best controller "
                  f"{best['controller']}: {best['speedup']:.3f}x; transformers generate(assistant_model=...) with it: "
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
        x = torch.tensor([ids])
        kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                  eos_token_id=None, pad_token_id=pair.tokenizer.pad_token_id)
        t0 = time.perf_counter()
        ref = pair.target.generate(x, **kw)
        plain_ms += (time.perf_counter() - t0) * 1000
        draft_eos = pair.draft.generation_config.eos_token_id
        pair.draft.generation_config.eos_token_id = None  # the assistant would stop at its own EOS
        try:
            t0 = time.perf_counter()
            out = generate_with_controller(pair.target, pair.draft, x, controller, profile=profile, **kw)
            assisted_ms += (time.perf_counter() - t0) * 1000
        finally:
            pair.draft.generation_config.eos_token_id = draft_eos
        identical &= bool(torch.equal(out, ref))
    n_tok = sum(lengths)
    return {"prompts": len(prompts), "plain_tok_s": n_tok / plain_ms * 1000, "assisted_tok_s": n_tok / assisted_ms
            * 1000, "identical": identical, "controller": controller.name}


def live_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``live``: the sim-to-real benchmark on the shipped default pair (skipped without torch/transformers)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        console.print(f"[yellow]live section skipped: {exc}[/yellow]")
        return {}
    r = run_live_bench(console, repeats=getattr(args, "live_repeats", 3),
                       per_category=getattr(args, "live_prompts", 8))
    return {"live": r}

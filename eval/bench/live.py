"""Live-engine benchmark: measured speed of speculative decoding with a real pair on this machine.

Prints (and returns) for the shipped pair (or any pair):

* plain greedy decoding tokens/s with the target alone (KV cache; the live engine's K = 0 path);
* live engine tokens/s at fixed K = 1..8, the speedup over plain decoding, and the ratio of the measured speed to
  what the cost profile predicts for the very same rounds (``sum(round_time(drafted))`` / measured time);
* transformers' own assisted generation (``generate(assistant_model=draft)``, constant K, no confidence stop) at
  the same K, and plain ``generate()``, for reference;
* recorder throughput: trace positions/s of the teacher-forced extraction.

Runs are interleaved per prompt (plain, then each K) so that load changes on a shared machine hit all variants
alike. Greedy outputs of every variant are checked against plain decoding. One torch thread.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from specgym.paths import MODELS_DIR, PROFILES_DIR, WORKLOADS_DIR

FALLBACK_PROMPTS = [
    ("code", "def parse_header(self, line):\n    \"\"\"Parse one header line.\"\"\"\n"),
    ("prose", "The import statement is used to bring a module into the current namespace. "),
    ("math", "Question: Tom has 12 apples. He buys 30 more. How many apples does Tom have now?\nAnswer:"),
]


def _prompts(tokenizer, per_category: int) -> list[tuple[str, list[int]]]:
    path = WORKLOADS_DIR / "tinypair-prompts.jsonl"
    items: list[tuple[str, str]] = []
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for cat in ("code", "prose", "math"):
            items += [(cat, r["prompt"]) for r in rows if r.get("category") == cat][-per_category:]
    if not items:
        items = FALLBACK_PROMPTS * per_category
    return [(c, tokenizer(t, add_special_tokens=False)["input_ids"]) for c, t in items]


def _hf_assisted(pair, ids, n: int, k: int | None, clock=time.perf_counter) -> tuple[float, list[int]]:
    """Wall ms and tokens of transformers' generate (assisted with constant K, or plain when k is None)."""
    import torch

    x = torch.tensor([ids])
    kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False,
              eos_token_id=None, pad_token_id=pair.tokenizer.pad_token_id)
    gc = pair.draft.generation_config
    saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold,
             gc.eos_token_id)
    if k is not None:
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = k, "constant"
        gc.assistant_confidence_threshold, gc.eos_token_id = 0.0, None
        kw["assistant_model"] = pair.draft
    try:
        t0 = clock()
        out = pair.target.generate(x, **kw)
        ms = (clock() - t0) * 1000.0
    finally:
        (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold,
         gc.eos_token_id) = saved
    return ms, out[0, len(ids):].tolist()


def run_live_bench(console, draft: str | None = None, target: str | None = None, profile: str | None = None,
                   per_category: int = 2, max_new_tokens: int = 128, k_values=tuple(range(1, 9)),
                   hf_k_values=(2, 3, 4), out_md: str | Path | None = None,
                   threads: int = 1, clock: str = "wall") -> dict[str, Any]:
    """Run the live benchmark and print a table; returns every figure in a dict.

    ``clock="cpu"`` times everything (live engine, transformers' generate, recorder) in thread CPU time, which
    excludes preemption by other jobs on a shared machine (valid with one torch thread on CPU).
    """
    import torch
    import transformers
    from rich.table import Table

    from specgym.envs.core.cost import load_profile
    from specgym.envs.engines.live_engine import LiveEngine, load_pair
    from specgym.envs.engines.profiler import measure_profile
    from specgym.envs.engines.recorder import trace_columns

    torch.set_num_threads(threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    draft = draft or str(MODELS_DIR / "tinypair" / "draft")
    target = target or str(MODELS_DIR / "tinypair" / "target")
    pair = load_pair(draft, target)
    k_max = max(max(k_values), max(hf_k_values))
    default_prof = PROFILES_DIR / "cpu-tinypair.json"
    if profile:
        prof = load_profile(profile)
    elif default_prof.exists():
        prof = load_profile(default_prof)
    else:
        prof = measure_profile(pair, k_max=k_max, clock=clock)
    clk = time.thread_time if clock == "cpu" else time.perf_counter
    eng = LiveEngine.from_pair(pair, k_max=k_max, profile=prof, timing=clock)
    prompts = _prompts(pair.tokenizer, per_category)
    # warm-up
    eng.run_plain(prompts[0][1], 16)
    eng.run_request(prompts[0][1], 4, 16)

    plain_ms = 0.0
    n_tok = 0
    live_ms = {k: 0.0 for k in k_values}
    pred_ms = {k: 0.0 for k in k_values}
    acc = {k: [0, 0] for k in k_values}
    mismatches = 0
    completions = []
    hf_ms = {k: 0.0 for k in hf_k_values}
    hf_plain_ms = 0.0
    hf_mismatch = 0
    for _cat, ids in prompts:
        base = eng.run_plain(ids, max_new_tokens)
        plain_ms += base.time_ms
        n_tok += len(base.tokens)
        completions.append((ids, base.tokens))
        for k in k_values:
            res = eng.run_request(ids, k, max_new_tokens)
            live_ms[k] += res.time_ms
            pred_ms[k] += sum(prof.round_time(r.drafted) for r in res.rounds)
            acc[k][0] += res.accepted
            acc[k][1] += res.drafted
            mismatches += res.tokens != base.tokens
        ms, toks = _hf_assisted(pair, ids, max_new_tokens, None, clk)
        hf_plain_ms += ms
        hf_mismatch += toks != base.tokens
        for k in hf_k_values:
            ms, toks = _hf_assisted(pair, ids, max_new_tokens, k, clk)
            hf_ms[k] += ms
            hf_mismatch += toks != base.tokens
    # recorder: teacher-forced trace extraction throughput
    t0 = clk()
    positions = 0
    for ids, comp in completions:
        trace_columns(pair.draft, pair.target, ids, comp, 0.0, vocab=eng.vocab)
        positions += len(comp)
    trace_s = clk() - t0

    plain_tps = n_tok / plain_ms * 1000.0
    rows = []
    for k in k_values:
        tps = n_tok / live_ms[k] * 1000.0
        rows.append({"k": k, "tok_s": tps, "speedup": tps / plain_tps, "profile_ratio": pred_ms[k] / live_ms[k],
                     "acceptance": acc[k][0] / max(acc[k][1], 1)})
    best = max(rows, key=lambda r: r["tok_s"])
    hf_rows = {k: n_tok / hf_ms[k] * 1000.0 for k in hf_k_values}
    result = {
        "pair": {"draft": draft, "target": target}, "profile": prof.name, "prompts": len(prompts),
        "tokens_per_variant": n_tok, "plain_tok_s": plain_tps, "live": rows, "best_fixed_k": best["k"],
        "best_speedup": best["speedup"], "best_profile_ratio": best["profile_ratio"],
        "greedy_mismatches": mismatches, "hf_plain_tok_s": n_tok / hf_plain_ms * 1000.0, "hf_assisted_tok_s": hf_rows,
        "hf_greedy_mismatches": hf_mismatch, "recorder_positions_per_s": positions / trace_s,
        "threads": torch.get_num_threads(), "clock": clock, "profile_clock": prof.hardware.get("clock", "wall"),
        "max_new_tokens": max_new_tokens, "profile_t_ar_ms": prof.t_ar_ms, "profile_draft_ms": prof.draft_ms,
    }

    table = Table(title=f"live engine, {len(prompts)} prompts x {max_new_tokens} tokens, greedy, 1 thread, "
                        f"{clock} clock")
    for col in ("K", "tok/s", "speedup vs plain", "measured/profile", "acceptance", "HF assisted tok/s"):
        table.add_column(col, justify="right")
    table.add_row("plain", f"{plain_tps:.1f}", "1.00", "", "", f"{result['hf_plain_tok_s']:.1f} (plain generate)")
    for r in rows:
        hf = hf_rows.get(r["k"])
        table.add_row(str(r["k"]), f"{r['tok_s']:.1f}", f"{r['speedup']:.2f}", f"{r['profile_ratio']:.2f}",
                      f"{r['acceptance']:.2f}", "" if hf is None else f"{hf:.1f}")
    console.print(table)
    console.print(f"best fixed K={best['k']}: {best['speedup']:.2f}x plain, {best['profile_ratio']:.2f} of the "
                  f"profile's prediction; greedy mismatches {mismatches} (live) / {hf_mismatch} (HF); recorder "
                  f"{result['recorder_positions_per_s']:.0f} trace positions/s")
    if out_md:
        _write_md(Path(out_md), result, max_new_tokens)
    return result


def _write_md(path: Path, r: dict[str, Any], n: int) -> None:
    from specgym.io import atomic_write_text

    lines = [
        "# Live engine figures (measured)", "",
        f"Pair: draft `{r['pair']['draft']}`, target `{r['pair']['target']}`; profile `{r['profile']}` "
        f"(t_AR {r['profile_t_ar_ms']:.3f} ms, draft {r['profile_draft_ms']:.3f} ms); {r['prompts']} prompts x {n} "
        f"new tokens, greedy, torch threads {r['threads']}, {r['clock']} clock (profile: {r['profile_clock']} clock); "
        "produced by `specgym.bench_live.run_live_bench`.", "",
        f"Plain greedy decoding (live engine, K=0, KV cache): **{r['plain_tok_s']:.1f} tok/s**; "
        f"transformers `generate()` plain: {r['hf_plain_tok_s']:.1f} tok/s.", "",
        "| K | tok/s | speedup vs plain | measured / profile prediction | acceptance | HF assisted tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["live"]:
        hf = r["hf_assisted_tok_s"].get(row["k"])
        lines.append(f"| {row['k']} | {row['tok_s']:.1f} | {row['speedup']:.2f} | {row['profile_ratio']:.2f} | "
                     f"{row['acceptance']:.2f} | {'' if hf is None else f'{hf:.1f}'} |")
    lines += ["", f"Best fixed K = {r['best_fixed_k']}: {r['best_speedup']:.2f}x plain decoding, "
              f"{r['best_profile_ratio']:.2f} of the profile's prediction.",
              f"Greedy outputs differing from plain decoding: {r['greedy_mismatches']} (live), "
              f"{r['hf_greedy_mismatches']} (HF).",
              f"Recorder trace extraction: {r['recorder_positions_per_s']:.0f} positions/s.", ""]
    atomic_write_text(path, "\n".join(lines), overwrite=True)
    atomic_write_text(path.with_suffix(".json"), json.dumps(r, indent=2, default=float) + "\n", overwrite=True)


def live_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """Hook for ``specgym bench --sections live`` (the workload argument is unused: the live bench runs models).

    Skips with a message when torch/transformers or the shipped pair are missing.
    """
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        console.print(f"[yellow]live section skipped: {exc}[/yellow]")
        return {}
    if not (MODELS_DIR / "tinypair" / "target" / "config.json").exists():
        console.print("[yellow]live section skipped: data/models/tinypair not built (specgym train-lm-pair)[/yellow]")
        return {}
    r = run_live_bench(console)
    return {f"live_{k}": v for k, v in r.items() if isinstance(v, (int, float))}

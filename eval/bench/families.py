"""Benchmark section ``families``: plain decoding through the engine, Llama family vs GPT-2 of the same size.

For each shape (layers, width, heads) a RANDOMLY-INITIALISED GPT-2 and Llama, Qwen2 and Mistral models of the same
parameter count (full key/value heads, a SwiGLU width of 8/3 the model width, tied embeddings, vocabulary 4096) are
built in memory, given the kernels measured fastest (:mod:`~specgym.envs.engines.live.fast_linear`, as ``load_pair``
does), and decode the same prompt plainly through :class:`~specgym.envs.engines.live.engine.LiveEngine`; every
model's runs are interleaved (the order rotated per repeat) and a model's figure is the median ms per token of its
runs, timed with the thread's CPU time (one torch thread; robust to other jobs on a shared machine). The Llama
family also decodes through the transformers forward (``lean=False``), the path it took before its lean forward.
Target: each Llama-family model within :data:`TARGET` of the GPT-2's ms per token.
"""

from __future__ import annotations

import statistics
from typing import Any

from rich.table import Table

from specgym.envs.engines.live.engine import LiveEngine
from specgym.envs.engines.live.fast_linear import engine_forward, pack_linears, select_kernels

TARGET = 1.15
#: (layers, width, heads): the midpair draft's width at 2 layers, and a target-sized model.
SHAPES = ((2, 128, 2), (2, 256, 4), (4, 512, 8))
FAMILIES = ("gpt2", "llama", "qwen2", "mistral")
VOCAB, CONTEXT = 4096, 512


def build(family: str, layers: int, width: int, heads: int, seed: int = 0) -> Any:
    """A random ``family`` model of the shape (eval mode, float32)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    if family == "gpt2":
        cfg: Any = tf.GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=width, n_layer=layers, n_head=heads,
                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}[family]
        cfg = cls(vocab_size=VOCAB, hidden_size=width, intermediate_size=(8 * width) // 3, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=CONTEXT,
                  tie_word_embeddings=True)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def measure(shapes: tuple[tuple[int, int, int], ...] = SHAPES, tokens: int = 64, prompt: int = 32,
            repeats: int = 5, families: tuple[str, ...] = FAMILIES) -> list[dict[str, Any]]:
    """One record per (shape, family, path): median ms per token of plain decoding through the engine."""
    import torch

    rows = []
    for layers, width, heads in shapes:
        engines: dict[str, LiveEngine] = {}
        params = {}
        for fam in families:
            model = build(fam, layers, width, heads)
            params[fam] = sum(p.numel() for p in model.parameters())
            if pack_linears(model):
                select_kernels(model, *engine_forward(model))
            engines[fam] = LiveEngine(model, model, timing="cpu")
            if fam != "gpt2":
                engines[f"{fam} (transformers forward)"] = LiveEngine(model, model, timing="cpu", lean=False)
        ids = [(13 * t) % (VOCAB - 1) + 1 for t in range(prompt)]
        names = list(engines)
        times: dict[str, list[float]] = {n: [] for n in names}
        with torch.inference_mode():
            for n in names:  # warm-up
                engines[n].run_plain(ids, 8)
            for rep in range(repeats):
                for n in names[rep % len(names):] + names[: rep % len(names)]:
                    res = engines[n].run_plain(ids, tokens)
                    times[n].append(res.time_ms / len(res.tokens))
        gpt2 = statistics.median(times["gpt2"])
        for n in names:
            ms = statistics.median(times[n])
            fam = n.split(" ")[0]
            rows.append({"layers": layers, "width": width, "heads": heads, "model": n, "params": params[fam],
                         "lean": engines[n].lean, "ms_per_token": round(ms, 4), "vs_gpt2": round(ms / gpt2, 3)})
    return rows


def families_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """``families``: the table, each lean Llama-family row against :data:`TARGET`."""
    try:
        import torch
    except ImportError as exc:
        console.print(f"[yellow]families section skipped: {exc}[/yellow]")
        return {}
    torch.set_num_threads(1)
    rows = measure()
    table = Table(title="plain decoding through the engine, random models of equal size (CPU time, 1 thread)")
    for col in ("layers x width", "model", "params", "ms/token", "vs GPT-2", f"target <= {TARGET}x"):
        table.add_column(col)
    for r in rows:
        verdict = "" if r["model"] == "gpt2" or not r["lean"] else ("met" if r["vs_gpt2"] <= TARGET else "MISSED")
        table.add_row(f"{r['layers']} x {r['width']}", r["model"], f"{r['params'] / 1e6:.2f}M",
                      f"{r['ms_per_token']:.3f}", f"{r['vs_gpt2']:.3f}x", verdict)
    console.print(table)
    return {"families": {"target": TARGET, "rows": rows}}

"""Benchmark section ``draft-vocab``: does a reduced draft vocabulary pay for a pair whose output layer is large?

A draft's output layer over the target's whole vocabulary (49,152 rows for SmolLM2) is a large part of each draft
token's work. Restricting the draft to its most frequent tokens (the ``draft-vocab-N.json`` lists ``specgym
train-draft`` exports) cuts that work; the target still verifies over its full vocabulary, so output stays exact, but
a target token outside the list can never be drafted. This section times one draft token (the engine's lean
forward, one thread) with the full output layer and with each reduced one, beside one target token, and prints the
held-out acceptance the export measured for each, so the trade is read off one table.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import specgym.catalogue as catalogue
from specgym.envs.engines.live.draft_vocab import DRAFT_VOCAB_FILE, make_reduced_head, output_rows
from specgym.envs.engines.live.lean_forward import lean_runner
from specgym.envs.engines.live.model_loading import encode_prompt, load_model, load_tokenizer
from specgym.errors import SpecgymError
from specgym.eval.bench.common import print_table

PROMPT = "Summarise in two sentences why the sky looks blue during the day and red at sunset."


def _token_ms(runner: Any, prompt: list[int], tokens: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean milliseconds of one-token cached forwards after the prompt."""
    import torch

    runs = []
    with torch.inference_mode():
        for _ in range(repeats):
            cache = runner.new_cache()
            logits = runner(prompt, cache)
            nxt = int(logits[-1].argmax())
            t0 = time.perf_counter()
            for _ in range(tokens):
                nxt = int(runner([nxt], cache)[-1].argmax())
            runs.append((time.perf_counter() - t0) / tokens * 1e3)
    return statistics.median(runs)


def draft_vocab_section(args: Any, workload: str, console: Any) -> dict[str, Any]:
    """Milliseconds per draft token, full and reduced output layer, against one target token."""
    import torch

    torch.set_num_threads(1)
    pair = getattr(args, "vocab_pair", None) or "smollm2"
    draft_dir, target_ref = catalogue.pair_models(pair)
    lists = sorted(draft_dir.glob("draft-vocab-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    if not draft_dir.joinpath("training_state.json").is_file() or not lists:
        raise SpecgymError(f"pair {pair!r}: its draft ({draft_dir}) ships no draft-vocab-N.json lists")
    state = json.loads((draft_dir / "training_state.json").read_text())["heldout"]
    tok = load_tokenizer(str(target_ref), "target")
    target = load_model(str(target_ref), "target")
    draft = load_model(str(draft_dir), "draft")
    prompt = encode_prompt(tok, PROMPT)
    tokens, repeats = getattr(args, "vocab_tokens", 48), getattr(args, "vocab_repeats", 5)
    t_runner = lean_runner(target)
    if t_runner is None:
        raise SpecgymError(f"pair {pair!r}: the target is not a model the lean forward runs")
    t_ms = _token_ms(t_runner, prompt, tokens, repeats)
    vocab = output_rows(draft)
    full_head = torch.nn.Linear(draft.config.hidden_size, vocab, bias=False)  # the tied embedding's rows
    full_head.weight = torch.nn.Parameter(draft.get_input_embeddings().weight.detach(), requires_grad=False)
    draft.set_output_embeddings(full_head)  # the shipped draft may already be reduced: timed full first
    runner = lean_runner(draft)
    if runner is None:
        raise SpecgymError(f"pair {pair!r}: the draft is not a model the lean forward runs")
    d_ms = _token_ms(runner, prompt, tokens, repeats)
    rows = [(f"target token ({target.config.num_hidden_layers} layers, vocabulary {target.config.vocab_size:,})",
             f"{t_ms:.2f} ms", "(reference)"),
            (f"draft token, full vocabulary: top-1 {state['full']['top1']:.3f}",
             f"{d_ms:.2f} ms", f"{d_ms / t_ms:.3f}x a target token")]
    figures: dict[str, Any] = {"target_token_ms": t_ms, "draft_token_ms": {"full": d_ms}}
    for path in lists:
        size = int(path.stem.rsplit("-", 1)[1])
        runner.lm_head = make_reduced_head(full_head, json.loads(path.read_text()), vocab)
        ms = _token_ms(runner, prompt, tokens, repeats)
        h = state.get(f"vocab{size}", {})
        rows.append((f"draft token, vocabulary {size:,} (coverage {h.get('coverage', float('nan')):.3f}, top-1 "
                     f"{h.get('top1', float('nan')):.3f})", f"{ms:.2f} ms",
                     f"{ms / t_ms:.3f}x a target token, {ms / d_ms:.2f}x the full draft"))
        figures["draft_token_ms"][size] = ms
    shipped = json.loads((draft_dir / DRAFT_VOCAB_FILE).read_text())["file"] if (
        draft_dir / DRAFT_VOCAB_FILE).is_file() else "the full vocabulary"
    print_table(console, f"draft vocabulary, pair {pair} ({Path(str(target_ref)).name}), one thread, lean forward; "
                         f"the shipped draft uses {shipped}", rows)
    return {"draft_vocab": figures}

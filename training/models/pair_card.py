"""The model card (``README.md``) of a shipped pair, written from its training states and measured figures.

Generic sections (how to load it, corpus, models, measured cost profile, recorded workloads, live figures,
limitations) come from the files the build wrote; what is particular to a pair (why this size, how it was grown or
distilled, what was tried) comes from a markdown ``notes`` file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.workloads.trace_format import load_workload
from specgym.io import atomic_write_text
from specgym.training.models.card_common import fenced, section


def workload_summary(path: Path) -> dict[str, Any]:
    """Mean acceptance and greedy-loop share per category of a recorded workload."""
    wl = load_workload(path)
    out: dict[str, Any] = {"name": wl.name, "requests": wl.n_requests, "positions": wl.n_positions,
                           "temperature": float(wl.temperature[0]), "by_category": {}}
    loops = wl.extra.get("loop_share_by_category", {})
    p_accept = wl.require("p_accept", "the model card")
    for cat in wl.categories():
        idx = np.flatnonzero(wl.category == cat)
        pa = np.concatenate([p_accept[wl.span(int(r))] for r in idx])
        out["by_category"][cat] = {"requests": int(len(idx)), "p_accept": float(pa.mean()),
                                   "loop_share": loops.get(cat)}
    out["p_accept"] = float(p_accept.mean())
    out["loop_share"] = wl.extra.get("loop_share")
    return out


def write_model_card(pair_dir: Path, work: Path, profile: Path | None = None, workloads: list[Path] | None = None,
                     figures: Path | None = None, notes: Path | None = None) -> Path:
    """Write ``README.md`` (the model card) into ``pair_dir``.

    Args:
        pair_dir: ``data/models/<name>`` with ``target/`` and ``draft/`` (each with ``training_state.json``).
        work: The build's work folder (corpus and token statistics).
        profile: The pair's measured cost profile (JSON).
        workloads: Workloads recorded from the pair.
        figures: Live benchmark figures (JSON written by ``specgym bench live``).
        notes: Markdown with what is particular to this pair (inserted after the models table).
    """
    corpus = json.loads((work / "corpus_stats.json").read_text())
    tokens = json.loads((work / "token_stats.json").read_text())
    L = _intro(pair_dir.name) + _corpus_section(corpus, tokens) + _models_section(pair_dir)
    if notes and notes.exists():
        L += [notes.read_text().strip(), ""]
    L += ["## Measured on this machine", ""]
    if profile and profile.exists():
        L += [_profile_line(json.loads(profile.read_text())), ""]
    if figures and figures.exists():
        fig = json.loads(figures.read_text())
        fig = fig.get("live", fig)  # the JSON of `specgym bench --json` holds it under "live"
        L += [f"Live engine ({fig['prompts']} held-out test prompts x {fig['max_new_tokens']} tokens, greedy, "
              f"{fig['clock']} clock, median of {fig['repeats']} repeats; `specgym bench live`): plain "
              f"decoding {fig['plain_tok_s']:.1f} tok/s; best fixed K = {fig['best_fixed_k']}: "
              f"**{fig['best_fixed_speedup']:.2f}x** plain decoding.", ""]
    for path in workloads or []:
        if path.exists():
            L += _workload_lines(workload_summary(path))
    L += section("Limitations",
                 "* A weak target falls into greedy repetition loops; loops are easy for the draft to predict, which "
                 "inflates greedy acceptance. The sampled workload (temperature 0.8) is the more realistic one; report "
                 "both.",
                 "* Figures are for one 2-core CPU at one thread; other CPUs (AVX-512, AMX) and GPUs differ: re-run "
                 "`specgym profile` and record on the hardware you deploy.",
                 "* Trained for hours, not weeks: held-out losses are high and outputs are often ungrammatical.")
    path = pair_dir / "README.md"
    atomic_write_text(path, "\n".join(L), overwrite=True)
    return path


def _intro(name: str) -> list[str]:
    """The card's title, what the pair is for and how to load it offline."""
    return [
        f"# specgym {name}: a GPT-2 draft/target pair trained on this CPU", "",
        "A real (not synthetic) model pair for specgym's live engine, recorder and profiler on machines without a "
        "model hub. It is a research fixture for speculative decoding, **not** a useful language model: it writes "
        "Python-looking code, pydoc-like prose and arithmetic word problems.", "",
        "Load it offline (weights are stored as fp16 to keep the repository small; the config says float32, so "
        "`from_pretrained` casts them back):", "",
        *fenced("python", [
            "import os; os.environ['HF_HUB_OFFLINE'] = '1'",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f"tok = AutoTokenizer.from_pretrained('data/models/{name}/target')",
            f"target = AutoModelForCausalLM.from_pretrained('data/models/{name}/target')  # float32",
            f"draft = AutoModelForCausalLM.from_pretrained('data/models/{name}/draft')"]), "",
        "Both folders hold the same tokenizer; `<|endoftext|>` (id 0) is bos and eos, `<|pad|>` (id 1) is pad.", "",
    ]


def _corpus_section(corpus: dict[str, Any], tokens: dict[str, Any]) -> list[str]:
    """Where the training text came from (``corpus_stats.json``) and how many tokens it made (``token_stats.json``)."""
    return section(
        "Corpus (built only from what every Python installation has)",
        f"* code: the standard library's `.py` files ({corpus['code_files_train']} files for training, "
        f"{corpus['code_files_heldout']} held out by `sha1(path) % 100 < 3`);",
        f"* prose: `pydoc_data/topics.py` help topics ({corpus['topics_train']} for training, repeated 3x; "
        f"{corpus['topics_heldout']} held out by `sha1(key) % 100 < 10`);",
        f"* math: generated arithmetic word problems with worked answers ({corpus['math_docs_train']} training "
        "documents from seed 1234; held-out problems from seed 98765);",
        f"* training tokens in the stream: {tokens['train_tokens']:,} "
        f"({', '.join(f'{k} {v:,}' for k, v in tokens['tokens_by_category'].items())}); Python "
        f"{sys.version.split()[0]}'s standard library.")


def _models_section(pair_dir: Path) -> list[str]:
    """One table row per model (its size, training and held-out loss, from its ``training_state.json``) and how they
    were trained."""
    states = {role: json.loads((pair_dir / role / "training_state.json").read_text()) for role in ("target", "draft")}
    sizes = {role: sum(f.stat().st_size for f in (pair_dir / role).iterdir()) / 1e6 for role in ("target", "draft")}
    L = ["## Models", "",
         "| | layers | width | heads | parameters | training tokens | steps | wall time | started from | "
         "distilled from | held-out loss code / prose / math (nats) | on disk |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for role in ("target", "draft"):
        st = states[role]
        sp = st["spec"]
        hl = st.get("heldout_loss") or {}
        L.append(f"| {role} | {sp['n_layer']} | {sp['n_embd']} | {sp['n_head']} | {st['n_params'] / 1e6:.2f}M | "
                 f"{st['tokens'] / 1e6:.1f}M | {st['step']} | {st['elapsed_s'] / 60:.0f} min | "
                 f"{st.get('init') or 'random init'} | {st.get('teacher') or '-'} | "
                 f"{hl.get('code', float('nan')):.2f} / {hl.get('prose', float('nan')):.2f} / "
                 f"{hl.get('math', float('nan')):.2f} | {sizes[role]:.1f} MB |")
    return L + ["", f"Training: AdamW (betas 0.9/0.95, weight decay 0.1), warm-up then cosine decay over a wall-clock "
                f"budget, one torch thread, {states['target'].get('precision') or 'fp32'}; the last stage of each "
                "model is listed (see the notes for the stages before it).", ""]


def _profile_line(prof: dict[str, Any]) -> str:
    """The pair's measured cost profile in one sentence."""
    v = prof["verify_ms"]
    hw = prof.get("hardware", {})
    return (f"Cost profile `{prof['name']}` ({hw.get('clock', 'wall')} clock, {hw.get('cpu', '')}, "
            f"{hw.get('torch_threads')} thread, {hw.get('dtype', '')}): draft {prof['draft_ms']:.3f} ms/token, "
            f"target step t_AR {v[0]:.3f} ms (cost ratio {prof['draft_ms'] / v[0]:.3f}), verify of 2 / 5 / "
            f"{len(v)} tokens {v[1] / v[0]:.2f}x / {v[min(4, len(v) - 1)] / v[0]:.2f}x / {v[-1] / v[0]:.2f}x "
            f"one token, round overhead {prof['round_overhead_ms']:.3f} ms.")


def _workload_lines(summ: dict[str, Any]) -> list[str]:
    """A recorded workload's mean acceptance (and loop share), then one table row per category."""
    loop = "" if summ["loop_share"] is None else (f"; share of completions ending in a repetition loop (last "
                                                  f"64 tokens periodic, period <= 32): {summ['loop_share']:.2f}")
    L = [f"Workload `{summ['name']}` (temperature {summ['temperature']:g}, {summ['requests']} held-out prompts, "
         f"{summ['positions']:,} positions): mean acceptance probability {summ['p_accept']:.3f}{loop}.", "",
         "| category | requests | mean p_accept | loop share |", "|---|---|---|---|"]
    for cat, c in summ["by_category"].items():
        ls = "" if c["loop_share"] is None else f"{c['loop_share']:.2f}"
        L.append(f"| {cat} | {c['requests']} | {c['p_accept']:.3f} | {ls} |")
    return L + [""]

"""The model card (``README.md``) of a draft that ``specgym train-draft`` exports, written from its training state."""

from __future__ import annotations

from typing import Any

from specgym.training.models.card_common import fenced, license_section, rebuild_section, section


def _row(label: str, h: dict[str, Any]) -> str:
    cover = f"{h['coverage']:.1%}" if "coverage" in h else "100%"
    return f"| {label} | {h['top1']:.3f} | {h['expected_accept']:.3f} | {cover} |"


def draft_card(meta: dict[str, Any], target: str, n_params: int, commands: list[str]) -> str:
    """The card: what the draft is, how it was trained, its held-out acceptance, how to use and rebuild it.

    Args:
        meta: The export's ``training_state.json`` (layers, plan, training state, held-out figures).
        target: The target's reference (a shipped pair name such as ``smollm2``, or a path).
        n_params: The draft's own parameters (without the borrowed embedding).
        commands: The commands that rebuild the folder.
    """
    st, h, plan = meta["training"], meta["heldout"], meta["plan"]
    vocab_rows = [_row(f"trained, draft vocabulary {k[5:]}", v) for k, v in h.items() if k.startswith("vocab")]
    temps = ", ".join("greedy" if t == 0 else f"T = {t} x{plan['samples']}" for t in plan["temperatures"])
    return "\n".join([
        f"# A distilled draft for `{target}`",
        "",
        f"A {len(meta['layers_from_target'])}-layer Llama-family draft that specgym trained for speculative decoding "
        f"with the target `{target}`. The target's weights are not in this folder: the draft borrows the target's "
        "token embedding and tied output layer at load time (`specgym-borrow.json`; "
        "`specgym.envs.engines.live.model_cache`), so this folder holds only the draft's own "
        f"{n_params / 1e6:.1f}M parameters, in float16.",
        "",
        "## How it was made",
        "",
        f"- **Start**: the target's embedding, its decoder layers {meta['layers_from_target']} and its final norm.",
        f"- **Data**: the target's own answers (chat template applied) to the train prompts of the prompts file "
        f"({temps}; at most {plan['max_new_tokens']} tokens, stopping at EOS), with the target's top-{plan['top_k']} "
        f"logits at every answer position. No text from any dataset.",
        f"- **Training**: the draft's layers and final norm (the embedding frozen) minimise the cross-entropy "
        f"against the target's renormalised top-{plan['top_k']} distribution on the answers' positions: "
        f"{st['step']:,} steps, {st['tokens']:,} tokens, {st['elapsed_s'] / 60:.0f} min on one CPU thread (a "
        f"wall-clock budget, `--budget-min {meta.get('budget_s', st['elapsed_s']) / 60:g}`: training ran until it was "
        "spent, not to convergence).",
        "",
        f"## Held-out acceptance ({meta['val_positions']:,} positions of the val prompts' greedy answers)",
        "",
        "Teacher-forced on the target's tokens: top-1 agreement is what greedy verification accepts per token; the "
        "expected acceptance `sum_x min(p, q)` is what sampled verification accepts at T = 1 (against the target's "
        "top-k distribution). A draft vocabulary restricts the draft's output layer to the most frequent answer "
        "tokens (the target still verifies over its whole vocabulary, so output stays exact); coverage is the share "
        "of held-out answer tokens inside it.",
        "",
        "| draft | top-1 agreement | expected acceptance | vocabulary coverage |",
        "|---|---|---|---|",
        _row("initial layer subset", h["init"]),
        _row("trained", h["full"]),
        *vocab_rows,
        "",
        (f"**This folder's draft scores the {meta['draft_vocab']:,} most frequent tokens** "
         f"(`specgym-draft-vocab.json`; every other token gets probability 0, decoding stays exact); "
         "`specgym bench draft-vocab` times each output layer against a target token."
         if meta.get("draft_vocab") else "This folder's draft scores the full vocabulary."),
        "",
        *section("Use", *fenced("bash", [f"specgym generate --pair {target} --prompt 'Write a haiku about autumn.'"]),
                 "",
                 "or in Python, `specgym.envs.engines.live.model_loading.load_model(<this folder>, 'draft')` (the "
                 "borrowed tensors are filled in from the target, once, in specgym's model cache)."),
        *rebuild_section(commands),
        *license_section(target, "draft", "layers it starts from and whose answers it is trained on",
                         "starts from its layers"),
    ])

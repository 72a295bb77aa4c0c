"""The model card (``README.md``) of a draft head that ``specgym train-head`` exports, written from its state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specgym.training.models.card_common import license_section, rebuild_section
from specgym.training.models.data_answers import data_command


def _runs_row(label: str, r: dict[str, Any]) -> str:
    ge = r["accept_ge"]
    return f"| {label} | {r['starts']:,} | {ge[0]:.3f} | {ge[1]:.3f} | {ge[3]:.3f} | {r['mean_run']:.2f} |"


def _plan(meta: dict[str, Any], folder: str) -> dict[str, Any]:
    """The answer plan an extra answers folder was written with (kept in the export's metadata)."""
    return meta["trained_on"]["plans"][folder]


def head_card(meta: dict[str, Any], target: str, n_params: int, out: Path) -> str:
    """The card: what the head is, how it was trained, its held-out runs, how to rebuild it.

    Args:
        meta: The export's ``training_state.json`` (build, training state, held-out runs).
        target: The target's reference (a shipped pair name such as ``smollm2``, or a path).
        n_params: The head's own parameters (the target's embedding is borrowed, not counted).
        out: The folder written (named in the rebuild command).
    """
    b, st = meta["build"], meta["training"]
    extra = [str(e) for e in b.get("extra_answers") or ()]
    commands = [f"specgym train-draft --target {target} --work-dir {b['work']} --stages answers",
                *(f"specgym train-draft --target {target} --work-dir {e} --stages answers --temperatures "
                  f"{','.join(f'{t:g}' for t in _plan(meta, e)['temperatures'])} --seed {_plan(meta, e)['seed']}"
                  for e in extra),
                f"specgym train-head --target {target} --work-dir {b['work']} "
                + "".join(f"--extra-answers {e} " for e in extra)
                + f"--mlp {b['mlp']} --steps {b['steps']} --unroll {b['unroll']} --out {out}"]
    n = st.get("recipe", {}).get("sequences")
    n_answers = f"; {n:,} answers" if n else ""
    data = ("greedy and sampled" if not extra else
            f"greedy and sampled, and {len(extra)} more sampled set{'s' if len(extra) > 1 else ''} with other seeds")
    source = (f"the target's answers to the train prompts (`specgym train-draft --stages answers`: {data}, chat "
              f"template applied{n_answers})")
    if b.get("data"):  # a data folder's answers (train-head --data)
        t = meta["trained_on"]
        commands = [data_command(target, b["data"]["folder"]),
                    f"specgym train-head --target {target} {b['data']['options']} --work-dir {b['work']} --mlp "
                    f"{b['mlp']} --steps {b['steps']} --unroll {b['unroll']} --out {out}"]
        sampled = f" and {t['samples']} sampled at T = {t['temperature']:g}" if t.get("samples") else ""
        source = (f"the target's answers in the data folder `{b['data']['folder']}` (`specgym data generate`: prompts "
                  f"the target wrote itself, its greedy answer{sampled} to each, chat template applied): "
                  f"{t['answers']:,} of its {t['of']:,} train-split answers"
                  f"{' (a seeded pick)' if t['answers'] < t['of'] else ''}, with {t['val_answers']:,} val-split greedy "
                  f"answers held out,")
    return "\n".join([
        f"# A draft head for `{target}`",
        "",
        f"An EAGLE-style draft head that specgym trained for speculative decoding with `{target}` "
        "(`specgym.envs.engines.live.draft_head`): from the target's last hidden state and the token it produced, a "
        f"gated MLP (width {b['mlp']}) predicts the target's next hidden state, which the target's own (tied) output "
        f"rows of the {b['draft_vocab']:,} most frequent answer tokens score; the head repeats on its own predictions, "
        "so it keeps no cache. The live engine serves it as the drafter `head` (greedy); verification stays exact. "
        f"This folder holds the head's own {n_params / 1e6:.1f}M parameters in float16; the target's embedding is "
        "borrowed at load time.",
        "",
        "## How it was made",
        "",
        f"- **Data**: {source} and the target's last hidden states over them (one teacher-forced forward each). No "
        "text from any dataset.",
        f"- **Training**: unrolled {b['unroll']} steps from every position, teacher-forced on the target's tokens and "
        "fed its own predicted features; cross-entropy against the target's distribution over the draft vocabulary "
        f"plus a smooth-L1 pull to the target's features; {st['step']:,} steps of {b['batch']} starts, "
        f"{st['elapsed_s'] / 60:.0f} min on one CPU thread.",
        "",
        "## Runs (teacher-forced on the target's answers)",
        "",
        "From every start of an answer, the head proposes 8 tokens; a run is how many match the answer before the "
        "first difference (what greedy verification accepts on a greedy answer). The val prompts' answers are greedy "
        "and held out; the train prompts' answers (greedy and sampled) are the ones it learned from.",
        "",
        "| answers | starts | P(run >= 1) | P(run >= 2) | P(run >= 4) | mean run |",
        "|---|---:|---:|---:|---:|---:|",
        _runs_row("val prompts (held out)", meta["heldout"]),
        _runs_row("train prompts (seen)", meta["train_runs"]),
        "",
        *rebuild_section(commands),
        *license_section(target, "head", "hidden states, answers and embedding it is trained on and borrows",
                         "is trained on its hidden states and borrows its embedding"),
    ])

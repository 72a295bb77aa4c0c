"""Wall-clock-budgeted, resumable training of one GPT-2 on the corpus stream (target, draft or distilled draft).

Runs on one torch thread by default; ``autocast`` uses bf16 only where the CPU computes it natively (elsewhere it
is several times slower than float32). A checkpoint (``<role>_ckpt``: ``save_pretrained`` + optimiser + state) is
written every few minutes and at the end, atomically (:mod:`~specgym.training.models.checkpoint`); running the same
stage again resumes it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.engines.live.model_loading import native_bf16_cpu
from specgym.training.models.checkpoint import STATE_FILE, load_optimizer, recover_folder, save_model_checkpoint
from specgym.training.models.corpus import CATEGORIES, log
from specgym.training.models.schedule import warmup_cosine
from specgym.training.models.tokenizer import load_tokenizer


@dataclass
class ModelSpec:
    """Size of one GPT-2-style model."""

    n_layer: int
    n_embd: int
    n_head: int
    n_positions: int = 512


def make_config(spec: ModelSpec, vocab_size: int, bos: int = 0, eos: int = 0, pad: int = 1):
    """A GPT2Config with explicit bos/eos/pad ids (without them transformers falls back to 50256)."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=vocab_size, n_positions=spec.n_positions, n_embd=spec.n_embd, n_layer=spec.n_layer,
                      n_head=spec.n_head, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)


def _batch(stream: np.ndarray, rng: np.random.Generator, batch: int, block: int):
    import torch

    starts = rng.integers(0, stream.size - block - 1, size=batch)
    x = np.stack([stream[s : s + block + 1].astype(np.int64) for s in starts])
    return torch.from_numpy(x)


def heldout_loss(model, work: Path, block: int = 512, max_tokens: int = 40_000) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) on the held-out sets, per category."""
    import torch

    model.eval()
    out = {}
    with torch.no_grad():
        for cat in CATEGORIES:
            arr = np.load(work / f"heldout_{cat}.npy")[:max_tokens].astype(np.int64)
            n = (arr.size - 1) // block
            losses = []
            for i in range(n):
                x = torch.from_numpy(arr[i * block : (i + 1) * block + 1])[None]
                logits = model(x[:, :-1]).logits[0].float()
                losses.append(float(torch.nn.functional.cross_entropy(logits, x[0, 1:])))
            out[cat] = float(np.mean(losses)) if losses else float("nan")
    model.train()
    return out


def train_model(work: Path, role: str, spec: ModelSpec, budget_s: float, batch: int, block: int, peak_lr: float,
                teacher_path: Path | None = None, distill_alpha: float = 0.7, ckpt_every_s: float = 300.0,
                threads: int = 1, precision: str = "auto", init_from: Path | None = None) -> dict:
    """Train ``role`` for ``budget_s`` wall-clock seconds (resumable from its checkpoint ``<role>_ckpt``).

    Args:
        work: The work folder (corpus stream, tokenizer, checkpoints).
        role: Checkpoint name (``target``, ``draft``, ``midpair_target``...).
        spec: Model size (ignored when ``init_from`` gives the weights).
        budget_s: Wall-clock budget; warm-up then cosine decay of the learning rate follow its fraction.
        batch, block: Sequences per step and their length.
        peak_lr: Peak learning rate (AdamW, betas 0.9/0.95, weight decay 0.1).
        teacher_path: Distil from this model: loss ``alpha * KL(teacher || student) + (1 - alpha) * CE`` at
            temperature 1 (the draft learns the target's full next-token distributions, which is what speculative
            acceptance rewards).
        distill_alpha: ``alpha`` above.
        ckpt_every_s: Seconds between checkpoints.
        threads: torch threads.
        precision: ``fp32``, ``bf16`` (autocast) or ``auto`` (bf16 only where the CPU computes it natively).
        init_from: Start from these weights (a grown model, a pre-trained draft) instead of a random init.
    """
    import torch
    from transformers import GPT2LMHeadModel

    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, got {precision!r}")
    autocast = precision == "bf16" or (precision == "auto" and native_bf16_cpu())

    torch.set_num_threads(threads)
    tok = load_tokenizer(work / "tokenizer")
    stream = np.load(work / "train_ids.npy")
    ckpt = work / f"{role}_ckpt"
    recover_folder(ckpt, STATE_FILE)
    recipe = {"budget_s": budget_s, "batch": batch, "block": block, "peak_lr": peak_lr,
              "teacher": Path(teacher_path).name if teacher_path else "",
              "init": Path(init_from).name if init_from else "", "precision": "bf16" if autocast else "fp32"}
    model, state, spec = _start_model(ckpt, role, spec, tok, init_from, recipe)
    state["budget_s"] = budget_s
    teacher = None
    if teacher_path is not None:
        teacher = GPT2LMHeadModel.from_pretrained(str(teacher_path), dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())
    log.info("%s: %s, %.2fM parameters, budget %.0f s, %s", role, spec, n_params / 1e6, budget_s,
             "bf16 autocast" if autocast else "fp32")
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    load_optimizer(opt, ckpt)
    rng = np.random.default_rng(state["step"] + (0 if role == "target" else 7))
    model.train()
    t0 = time.time() - state["elapsed_s"]
    last_ckpt = time.time()
    last_log = time.time()
    while (elapsed := time.time() - t0) < budget_s:
        lr = warmup_cosine(elapsed / budget_s, peak_lr)
        for g in opt.param_groups:
            g["lr"] = lr
        xb = _batch(stream, rng, batch, block)
        x, y = xb[:, :-1], xb[:, 1:]
        ce, loss = _loss(model, teacher, x, y, autocast, distill_alpha)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["tokens"] += int(x.numel())
        if time.time() - last_log > 60:
            last_log = time.time()
            el = time.time() - t0
            log.info("%s step %d  %.0f/%.0f s  lr %.2e  ce %.3f  loss %.3f  %.0f tok/s(avg)", role, state["step"], el,
                     budget_s, lr, float(ce), float(loss), state["tokens"] / max(el, 1e-9))
        if time.time() - last_ckpt > ckpt_every_s:
            state["elapsed_s"] = time.time() - t0
            save_model_checkpoint(ckpt, model, opt, state)
            last_ckpt = time.time()
    state["elapsed_s"] = time.time() - t0
    state["heldout_loss"] = heldout_loss(model, work)
    state["n_params"] = n_params
    save_model_checkpoint(ckpt, model, opt, state)
    log.info("%s done: %s", role, json.dumps({k: state[k] for k in ("step", "tokens", "elapsed_s", "heldout_loss")}))
    return state


def _start_model(ckpt: Path, role: str, spec: ModelSpec, tok: Any, init_from: Path | None,
                 recipe: dict[str, Any]) -> tuple[Any, dict[str, Any], ModelSpec]:
    """The model to train, its training state and its size: resumed from the checkpoint ``ckpt`` where there is
    one, else started from ``init_from``'s weights (whose size replaces ``spec``) or a seeded random init of
    ``spec`` (a new state records ``recipe``)."""
    import torch
    from transformers import GPT2LMHeadModel

    if ckpt.exists():
        model = GPT2LMHeadModel.from_pretrained(str(ckpt), dtype=torch.float32)
        state = json.loads((ckpt / STATE_FILE).read_text())
        log.info("%s: resuming at step %d (%.0f s used)", role, state["step"], state["elapsed_s"])
        return model, state, spec
    cfg = make_config(spec, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    torch.manual_seed(0 if role == "target" else 1)
    model = GPT2LMHeadModel.from_pretrained(str(init_from), dtype=torch.float32) if init_from else \
        GPT2LMHeadModel(cfg)
    if init_from:
        c = model.config
        spec = ModelSpec(c.n_layer, c.n_embd, c.n_head, c.n_positions)
    state = {"step": 0, "elapsed_s": 0.0, "tokens": 0, "spec": asdict(spec), "budget_s": recipe["budget_s"],
             "batch": recipe["batch"], "block": recipe["block"], "peak_lr": recipe["peak_lr"],
             "teacher": recipe["teacher"], "init": recipe["init"], "precision": recipe["precision"]}
    return model, state, spec


def _loss(model: Any, teacher: Any, x: Any, y: Any, autocast: bool, distill_alpha: float) -> tuple[Any, Any]:
    """One batch's cross-entropy and training loss: the cross-entropy alone, or with a teacher
    ``alpha * KL(teacher || student) + (1 - alpha) * CE`` (the KL per position)."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(x).logits.float()
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        if teacher is None:
            return ce, ce
        with torch.no_grad():
            t_logits = teacher(x).logits.float()
        kl = torch.nn.functional.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(t_logits, -1),
                                        log_target=True, reduction="batchmean") / x.size(1)
        return ce, distill_alpha * kl + (1 - distill_alpha) * ce

"""A draft model distilled from a Llama-family target: the target's own answers, a layer subset, sparse distillation.

How specgym makes a drafter for a pretrained target it did not train (SmolLM2-135M-Instruct, ``make
drafter-smollm2``), in four resumable stages over one work folder:

1. **answers** (:func:`sample_answers`): the target answers the *train* prompts of a prompts file (chat template
   applied by :func:`~specgym.envs.engines.live.model_loading.encode_prompt`), greedily and sampled, stopping at EOS; at
   every answer position the target's top-``k`` logits and log-normaliser are kept. Those are the distillation
   targets, so training needs no teacher forward at all. (With ``--data`` the answers are a data folder's instead,
   teacher-forced once for the same logits, in the same format: :mod:`~specgym.training.models.data_answers`.)
2. **init** (:func:`layer_subset_draft`): the draft starts as the target's embedding, a few of its layers and its
   final norm (a LayerSkip-style subset), so it starts close to the target's function.
3. **train** (:func:`train_draft`): the draft's layers and final norm learn to match the target's next-token
   distribution on the answers (cross-entropy against the target's renormalised top-``k`` distribution). The
   embedding, and with it the tied output layer, stays the target's: the shipped draft borrows it
   (:mod:`specgym.envs.engines.live.model_cache`), which keeps ~28M parameters out of the repository.
4. **eval** (:func:`heldout_acceptance`): on the *val* prompts' greedy answers, how often the draft's top token is
   the target's (what greedy verification accepts) and the expected acceptance ``sum_x min(p, q)`` of sampling.

Work folder layout: ``answers/NNNN.npz`` (one batch each) and ``answers/plan.json`` (the plan and the prompts file
they answer), ``draft_init/``, ``draft_ckpt/`` (resumed). Every file and folder appears complete or not at all: each is
written as a temporary (``.specgym-tmp-*``) and renamed into place (:mod:`~specgym.training.models.checkpoint`).
"""

from __future__ import annotations

import copy
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specgym.console import make_progress
from specgym.envs.engines.live.model_loading import encode_prompt
from specgym.envs.workloads.prompts import PromptSpec
from specgym.errors import SpecgymError
from specgym.io import sha256_file
from specgym.training.models.checkpoint import (
    STATE_FILE,
    load_optimizer,
    recover_folder,
    save_model_checkpoint,
    save_npz,
    write_json_atomic,
)
from specgym.training.models.schedule import warmup_cosine

#: A finished batch of answers (``0004.npz``); a temporary (``.specgym-tmp-0004.npz``) never matches.
BATCH_FILE = re.compile(r"\d{4,}\.npz")


@dataclass(frozen=True)
class AnswerPlan:
    """Which answers the target writes: one greedy answer per prompt and ``samples`` per temperature.

    Attributes:
        temperatures: Sampling temperatures (0 is greedy, one answer).
        samples: Answers per prompt at each temperature above 0.
        max_new_tokens: Longest answer (the target stops earlier at EOS).
        top_k: Logits kept per answer position.
        batch: Prompts per ``generate`` call.
        seed: Sampling seed (per batch: ``seed + batch index``).
    """

    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    samples: int = 2
    max_new_tokens: int = 160
    top_k: int = 32
    batch: int = 8
    seed: int = 0

    def jobs(self, prompts: list[PromptSpec]) -> list[tuple[float, int, list[PromptSpec]]]:
        """``(temperature, sample index, prompts)`` batches in a fixed order (the resume key is the batch index)."""
        out = []
        for temp in self.temperatures:
            for s in range(1 if temp == 0 else self.samples):
                for i in range(0, len(prompts), self.batch):
                    out.append((temp, s, prompts[i : i + self.batch]))
        return out


def sample_answers(target: Any, tokenizer: Any, prompts: list[PromptSpec], out: Path, plan: AnswerPlan,
                   prompts_file: str | Path | None = None, label: str = "target answers") -> int:
    """Write the target's answers with their top-``k`` logits, one ``.npz`` per batch (finished batches are skipped,
    so an interrupted run resumes); returns the number of answer tokens on disk.

    Each file holds, per answer ``a``: ``prompt_<a>`` and ``answer_<a>`` token ids, ``topi_<a>``/``topv_<a>``
    ``(len, k)`` top-``k`` indices and logits (float16) and ``lse_<a>`` the log-normaliser of every position.

    Args:
        target: The target model.
        tokenizer: Its tokenizer.
        prompts: The prompts to answer (in the order of the batches).
        out: The answers folder.
        plan: Which answers the target writes.
        prompts_file: The file ``prompts`` come from: recorded in ``plan.json`` (path and SHA-256), and a folder
            holding answers to another file is refused (:func:`check_answers_source`).
        label: What the progress bar says (``target answers (train)``).

    Raises:
        SpecgymError: ``out`` holds answers of another plan or to another prompts file.
    """
    import torch

    source = prompts_source(prompts_file) if prompts_file is not None else None
    out.mkdir(parents=True, exist_ok=True)
    _check_plan(out, plan, source)
    jobs = plan.jobs(prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with make_progress() as progress:
        task = progress.add_task(label, total=len(jobs))
        for j, (temp, s, batch) in enumerate(jobs):
            path = out / f"{j:04d}.npz"
            if path.exists():
                progress.advance(task)
                continue
            ids = [encode_prompt(tokenizer, p.text) for p in batch]
            width = max(map(len, ids))
            x = torch.full((len(ids), width), pad, dtype=torch.long)
            mask = torch.zeros_like(x)
            for r, row in enumerate(ids):  # left padding: every prompt ends where generation starts
                x[r, width - len(row):] = torch.tensor(row)
                mask[r, width - len(row):] = 1
            torch.manual_seed(plan.seed + j)
            with torch.inference_mode():
                gen = target.generate(input_ids=x, attention_mask=mask, max_new_tokens=plan.max_new_tokens,
                                      do_sample=temp > 0, temperature=temp if temp > 0 else None, top_k=None,
                                      top_p=None, pad_token_id=pad, output_logits=True,
                                      return_dict_in_generate=True)
            logits = torch.stack(gen.logits, dim=1).float()  # (batch, steps, vocab), before any processing
            arrays: dict[str, np.ndarray] = {}
            for r, p in enumerate(batch):
                answer = gen.sequences[r, width:].tolist()
                n = _answer_length(answer, tokenizer.eos_token_id, pad)
                lg = logits[r, :n]
                top = lg.topk(plan.top_k, dim=-1)
                key = f"{p.request_id}.{temp}.{s}"
                arrays[f"prompt_{key}"] = np.asarray(ids[r], dtype=np.int32)
                arrays[f"answer_{key}"] = np.asarray(answer[:n], dtype=np.int32)
                arrays[f"topi_{key}"] = top.indices.numpy().astype(np.int32)
                arrays[f"topv_{key}"] = top.values.numpy().astype(np.float16)
                arrays[f"lse_{key}"] = torch.logsumexp(lg, dim=-1).numpy().astype(np.float32)
            save_npz(path, arrays)
            progress.advance(task)
    return sum(int(a.size) for f in batch_files(out) for k, a in np.load(f).items() if k.startswith("answer_"))


def batch_files(folder: Path) -> list[Path]:
    """The finished batch files of an answers folder, in batch order (temporaries and other files are not batches)."""
    if not folder.is_dir():
        return []
    return sorted((f for f in folder.iterdir() if BATCH_FILE.fullmatch(f.name)), key=lambda f: int(f.stem))


def prompts_source(prompts_file: str | Path) -> dict[str, str]:
    """The identity of a prompts file that ``plan.json`` records: its path (as given) and the SHA-256 of its bytes."""
    return {"file": str(prompts_file), "sha256": sha256_file(prompts_file)}


def _read_plan(path: Path) -> dict[str, Any]:
    try:
        have = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecgymError(f"{path}: unreadable ({exc}); move this answers folder away or use another "
                           f"--work-dir") from None
    if not isinstance(have, dict):
        raise SpecgymError(f"{path}: not a plan (a JSON object); move this answers folder away or use another "
                           f"--work-dir")
    return have


def check_answers_source(out: Path, source: dict[str, str]) -> bool:
    """Refuse an answers folder whose ``plan.json`` records another prompts file (another SHA-256).

    The same bytes under another path are the same prompts (accepted). A ``plan.json`` that records no prompts file
    (written before specgym kept one) cannot be checked: returns False so that the answers stage records ``source``
    (it adopts the prompts file it is run with, as it adopted its plan), True when the folder records one.

    Raises:
        SpecgymError: ``plan.json`` names a prompts file with other contents.
    """
    path = out / "plan.json"
    if not path.exists():
        return False
    have = _read_plan(path).get("prompts")
    if not isinstance(have, dict) or "sha256" not in have:
        return False
    if have["sha256"] != source["sha256"]:
        same = " (the same path, edited since)" if have.get("file") == source["file"] else ""
        raise SpecgymError(f"{path}: these answers are to another prompts file ({have.get('file')}, sha256 "
                           f"{str(have['sha256'])[:12]}...; --prompts {source['file']} has sha256 "
                           f"{source['sha256'][:12]}...{same}); use another --work-dir for a new set of answers")
    return True


def _check_plan(out: Path, plan: AnswerPlan, source: dict[str, str] | None = None) -> None:
    """Keep the plan beside the answers (``plan.json``): a folder resumes only the plan it was started with, since
    its batches are keyed by their index in that plan, and only the prompts file it was started with (``source``,
    when given: its path and SHA-256)."""
    path, want = out / "plan.json", json.loads(json.dumps(asdict(plan)))
    if source is not None:
        want["prompts"] = source
    if not path.exists():  # a new folder (or one from before plans were kept: it adopts this one)
        write_json_atomic(path, want)
        return
    have = _read_plan(path)
    if {k: v for k, v in have.items() if k != "prompts"} != {k: v for k, v in want.items() if k != "prompts"}:
        diff = ", ".join(f"{k} {have.get(k)!r} there, {v!r} now" for k, v in asdict(plan).items()
                         if have.get(k) != (list(v) if isinstance(v, tuple) else v))
        raise SpecgymError(f"{path}: these answers follow another plan ({diff}); use another --work-dir")
    if source is not None and not check_answers_source(out, source):
        print(f"note: {path} records no prompts file (written before specgym kept one); these answers are taken "
              f"to be to {source['file']}, recorded now", file=sys.stderr)
        write_json_atomic(path, {**have, "prompts": source})


def _answer_length(answer: list[int], eos: int | None, pad: int) -> int:
    """Tokens up to and including the first EOS (the rest of a batch row is padding)."""
    if eos is not None and eos in answer:
        return answer.index(eos) + 1
    return len(answer)


@dataclass
class Answer:
    """One stored answer: its prompt and answer ids and the target's sparse distribution at each answer position."""

    prompt: np.ndarray
    answer: np.ndarray
    topi: np.ndarray
    topv: np.ndarray
    lse: np.ndarray


def load_answers(folder: Path) -> list[Answer]:
    """Every answer in a work folder's ``answers/`` (in batch order): finished batch files only (:data:`BATCH_FILE`),
    never the temporary of a batch being written or left by a killed run."""
    out = []
    for f in batch_files(folder):
        z = np.load(f)
        for key in [k[len("answer_"):] for k in z.files if k.startswith("answer_")]:
            if z[f"answer_{key}"].size:
                out.append(Answer(z[f"prompt_{key}"], z[f"answer_{key}"], z[f"topi_{key}"], z[f"topv_{key}"],
                                  z[f"lse_{key}"]))
    return out


def layer_subset_draft(target: Any, layers: list[int]) -> Any:
    """A Llama-family draft made of the target's embedding, the given decoder layers (in order) and its final norm.

    The embedding is the target's (the draft borrows it when shipped), and so is the tied output layer.
    """
    import torch
    from transformers import AutoModelForCausalLM

    check_layers(layers, target.config.num_hidden_layers)
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = len(layers)
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in layers]
    draft = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    sd = target.state_dict()
    mine = {}
    for k in draft.state_dict():
        if k.startswith("model.layers."):
            parts = k.split(".")
            parts[2] = str(layers[int(parts[2])])
            mine[k] = sd[".".join(parts)]
        else:
            mine[k] = sd[k]
    draft.load_state_dict(mine, strict=True)
    draft.tie_weights()
    return draft


def check_layers(layers: list[int], n: int | None = None) -> None:
    """Refuse a layer list the draft cannot start from: empty, repeated or (when the target's depth ``n`` is known)
    outside ``0..n-1``.

    Raises:
        SpecgymError: One line naming ``--layers`` and the valid range.
    """
    given = ",".join(map(str, layers))
    if not layers:
        raise SpecgymError("--layers '': name at least one target layer, e.g. 0,1,2,3")
    if len(set(layers)) != len(layers):
        twice = sorted({i for i in layers if layers.count(i) > 1})
        raise SpecgymError(f"--layers {given}: layer {twice[0]} is named twice; name each target layer once")
    bad = [i for i in layers if i < 0 or n is not None and i >= n]
    if bad:
        limit = f"0..{n - 1} (the target has {n} layers)" if n is not None else "0 or above"
        raise SpecgymError(f"--layers {given}: layer {bad[0]} is not a target layer; layers are {limit}")


def sparse_kd_loss(logits: Any, topi: Any, topv: Any) -> Any:
    """Cross-entropy of the draft's log-softmax against the target's distribution renormalised over its top-``k``
    tokens, averaged over positions (the part of the target's mass outside its top ``k`` is dropped)."""
    import torch

    logq = torch.log_softmax(logits.float(), dim=-1)
    p = torch.softmax(topv.float(), dim=-1)
    return -(p * logq.gather(-1, topi.long())).sum(-1).mean()


def train_draft(work: Path, budget_s: float, peak_lr: float = 3e-4, seq_per_step: int = 4,
                ckpt_every_s: float = 300.0, val_ids: set[str] | None = None) -> dict[str, Any]:
    """Train ``work/draft_ckpt`` (started from ``work/draft_init``) for ``budget_s`` wall-clock seconds on the
    stored answers; resumable. Only the decoder layers and the final norm learn (the embedding stays the target's).

    Checkpoints are written atomically every ``ckpt_every_s`` seconds, at the end and on Ctrl-C, which then says
    how to continue and re-raises ``KeyboardInterrupt``.

    Returns the training state (steps, tokens, elapsed seconds, last loss).

    Raises:
        SpecgymError: No finished ``draft_init`` or no answers (the stage to run first is named).
    """
    import torch
    from transformers import AutoModelForCausalLM

    ckpt, init = work / "draft_ckpt", work / "draft_init"
    recover_folder(ckpt, CKPT_DONE)
    start = ckpt if (ckpt / CKPT_DONE).exists() else init
    if start == init and not init_complete(init):
        raise SpecgymError(f"{init}: no finished initial draft (the train stage starts from it); run --stages init "
                           f"first")
    answers = load_answers(work / "answers")
    if not answers:
        raise SpecgymError(f"{work / 'answers'}: no answers to train on; run --stages answers first")
    model = AutoModelForCausalLM.from_pretrained(str(start), dtype=torch.float32)
    state: dict[str, Any] = json.loads((ckpt / CKPT_DONE).read_text()) if start == ckpt else \
        {"step": 0, "tokens": 0, "elapsed_s": 0.0, "peak_lr": peak_lr, "seq_per_step": seq_per_step}
    state["budget_s"] = budget_s
    for name, prm in model.named_parameters():
        prm.requires_grad = not name.startswith(("model.embed_tokens", "lm_head"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.0)
    if start == ckpt:
        load_optimizer(opt, ckpt)
    rng = np.random.default_rng(1000 + int(state["step"]))
    model.train()
    t0 = time.time() - state["elapsed_s"]
    last_ckpt, saved_step = time.time(), state["step"]
    loss_ema = None
    try:
        with make_progress() as progress:
            task = progress.add_task("draft distillation", total=budget_s,
                                     completed=min(state["elapsed_s"], budget_s))
            while (elapsed := time.time() - t0) < budget_s:
                for g in opt.param_groups:
                    g["lr"] = warmup_cosine(elapsed / budget_s, peak_lr)
                batch = [answers[i] for i in rng.integers(0, len(answers), size=seq_per_step)]
                step_loss, n_tok = _draft_step(model, batch)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                state["step"] += 1
                state["tokens"] += n_tok
                loss_ema = step_loss if loss_ema is None else 0.98 * loss_ema + 0.02 * step_loss
                state["loss_ema"] = loss_ema
                progress.update(task, completed=min(time.time() - t0, budget_s),
                                description=f"draft distillation {loss_ema:.3f}")
                if time.time() - last_ckpt > ckpt_every_s:
                    state["elapsed_s"] = time.time() - t0
                    save_model_checkpoint(ckpt, model, opt, state)
                    last_ckpt, saved_step = time.time(), state["step"]
    except KeyboardInterrupt:
        if state["step"] != saved_step:  # progress since the last checkpoint: keep it
            state["elapsed_s"] = time.time() - t0
            save_model_checkpoint(ckpt, model, opt, state)
        if (ckpt / CKPT_DONE).exists():
            print(f"interrupted at step {state['step']:,} ({state['elapsed_s'] / 60:.1f} of {budget_s / 60:g} min): "
                  f"checkpoint saved to {ckpt}; the same specgym train-draft command continues from it",
                  file=sys.stderr)
        raise
    state["elapsed_s"] = time.time() - t0
    save_model_checkpoint(ckpt, model, opt, state)
    return state


def _draft_step(model: Any, batch: list[Answer]) -> tuple[float, int]:
    """One step's gradients (accumulated over ``batch``, not applied); returns the mean loss and the tokens."""
    import torch

    loss_sum = 0.0
    n_tok = 0
    for a in batch:
        seq = torch.from_numpy(np.concatenate([a.prompt, a.answer]).astype(np.int64))[None]
        hidden = model.model(seq[:, :-1]).last_hidden_state[0, len(a.prompt) - 1 :]
        out = model.lm_head(hidden)  # the answer's positions only: the prompt's are not trained on
        loss = sparse_kd_loss(out, torch.from_numpy(a.topi), torch.from_numpy(a.topv))
        (loss / len(batch)).backward()
        loss_sum += float(loss.detach())
        n_tok += len(a.answer)
    return loss_sum / len(batch), n_tok


#: The file a finished ``draft_ckpt`` (written last) and a finished ``draft_init`` hold.
CKPT_DONE = STATE_FILE
INIT_DONE = "specgym-init.json"


def init_complete(folder: Path) -> bool:
    """Whether ``draft_init`` is finished: it holds :data:`INIT_DONE` (written last), or, saved in place before
    specgym saved it atomically, its weights and its tokenizer (saved after the weights)."""
    if (folder / INIT_DONE).is_file():
        return True
    weights = any((folder / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json",
                                                   "pytorch_model.bin"))
    tokenizer = any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))
    return (folder / "config.json").is_file() and weights and tokenizer and (folder / "tokenizer_config.json").is_file()


def heldout_acceptance(draft: Any, answers: list[Answer]) -> dict[str, float]:
    """How well the draft predicts the target on held-out answers (teacher-forced on the target's own tokens).

    Returns ``top1`` (share of positions where the draft's top token is the target's: greedy acceptance per token),
    ``expected_accept`` (mean ``sum_x min(p, q)`` with ``p`` the target's top-``k`` distribution, what sampled
    verification accepts per token at T = 1) and ``positions``. A draft restricted to a vocabulary
    (:func:`~specgym.envs.engines.live.draft_vocab.make_reduced_head`) is measured as it will draft.
    """
    import torch

    draft.eval()
    hits, acc, n = 0, 0.0, 0
    with torch.inference_mode():
        for a in answers:
            seq = torch.from_numpy(np.concatenate([a.prompt, a.answer]).astype(np.int64))[None]
            logits = draft(seq[:, :-1]).logits[0, len(a.prompt) - 1 :].float()
            q = torch.softmax(logits, -1)
            topi = torch.from_numpy(a.topi).long()
            p = torch.softmax(torch.from_numpy(a.topv).float(), -1)
            hits += int((logits.argmax(-1) == topi[:, 0]).sum())
            acc += float(torch.minimum(p, q.gather(-1, topi)).sum())
            n += len(a.answer)
    return {"top1": hits / max(n, 1), "expected_accept": acc / max(n, 1), "positions": n}

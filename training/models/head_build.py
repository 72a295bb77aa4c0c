"""``specgym train-head``: an EAGLE-style draft head for a target (:mod:`specgym.envs.engines.live.draft_head`).

The head learns the target's own dynamics: from the target's last hidden state ``f_t`` and the token ``x_{t+1}`` it
produced, the next hidden state ``f_{t+1}`` and the target's next-token distribution. Its data are the target's
answers to the *train* prompts that ``specgym train-draft --stages answers`` writes (greedy and sampled, chat
template applied), the same answers the distilled draft learns from, so both drafters of the pair see the same
prompts; the val prompts' greedy answers measure it. With ``--data`` they are the answers of a data folder that
``specgym data generate`` wrote, read directly (:mod:`specgym.training.models.data_answers`: its train split, a
seeded pick; its val split's greedy answers held out), the same pick ``train-draft --data`` learns from.

Stages (each resumable; running the command again continues where it stopped) over the draft's work folder:

1. ``features``: one teacher-forced target forward per answer (prompt + answer), its last hidden states kept in
   float16 (``head/features_<split>.npz``);
2. ``train``: the head unrolled ``unroll`` steps from every position, teacher-forced on the target's tokens and fed
   its own predicted features (so it trains on what it drafts from), minimising the cross-entropy against the
   target's distribution over the draft vocabulary plus a smooth-L1 pull of each predicted feature to the target's
   (EAGLE's two losses); AdamW, one-cycle schedule, checkpointed atomically (``head/ckpt.pt``: every 2 minutes, at
   the end and on Ctrl-C);
3. ``export``: the head's held-out runs on the val answers (what greedy verification accepts from each start:
   :func:`~specgym.envs.engines.live.draft_head.head_runs`) and the shipped folder with its card. Only a finished
   checkpoint trained with the options given is exported, so the card's rebuild command is the one that made it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specgym.console import make_progress
from specgym.envs.engines.live.draft_head import HEAD_CONFIG, HEAD_WEIGHTS, build_head, head_runs, target_features
from specgym.envs.engines.live.model_loading import load_model
from specgym.errors import SpecgymError
from specgym.io import atomic_dir
from specgym.training.models.checkpoint import save_npz, save_torch_checkpoint, write_json_atomic
from specgym.training.models.data_answers import DataAnswers, DataSelection, read_data_answers
from specgym.training.models.distill import AnswerPlan, load_answers
from specgym.training.models.draft_build import answer_vocab, draft_vocab
from specgym.training.models.head_card import head_card
from specgym.training.models.schedule import one_cycle

STAGES = ("features", "train", "export")
#: Proposal length of the held-out runs an export reports (the live engine's K cap).
HELDOUT_K = 8


@dataclass
class HeadBuild:
    """One ``train-head`` run.

    Attributes:
        target: The target (a folder, a ``.gguf`` file or a shipped pair's target name such as ``smollm2``).
        work: The draft's work folder (``answers/`` and ``answers_val/`` from ``train-draft --stages answers``).
        mlp: Width of the head's gated MLP.
        steps: Optimiser steps.
        batch: Start positions per step.
        unroll: Steps the head is unrolled from each start in training.
        lr: Peak learning rate.
        weight_decay: AdamW weight decay.
        feature_noise: Uniform noise added to the starting feature (EAGLE's: robustness to its own errors).
        draft_vocab: The head's output tokens: the ``draft_vocab`` most frequent train-answer tokens (the list
            the distilled draft uses).
        seed: Seed of the initialisation and the batches.
        extra_answers: More work folders whose ``answers/`` the head also learns from (``train-draft --stages
            answers`` with another ``--seed``, typically sampled only): more of the target's answers to the same
            train prompts; the draft vocabulary and the val answers stay ``work``'s.
        data: Learn from a data folder's train answers and be measured on its val greedy answers (the draft
            vocabulary: the train answers' most frequent tokens), instead of ``work``'s answers; ``work`` then
            holds only the head's features and checkpoint.
    """

    target: str
    work: Path
    mlp: int = 1536
    steps: int = 1500
    batch: int = 256
    unroll: int = 3
    lr: float = 1e-3
    weight_decay: float = 0.0
    feature_noise: float = 0.2
    draft_vocab: int = 4096
    seed: int = 0
    extra_answers: tuple[Path, ...] = ()
    data: DataSelection | None = None


def collect_features(target: Any, answers: list[Any], out: Path, what: str) -> None:
    """The target's last hidden states over every answer's prompt + answer, written once to ``out`` (ids, prompt
    lengths and float16 features, concatenated with offsets)."""
    import torch

    if out.exists():
        return
    ids, plen, feats = [], [], []
    with make_progress() as progress:
        task = progress.add_task(f"target features ({what})", total=len(answers))
        for a in answers:
            seq = [int(t) for t in np.concatenate([a.prompt, a.answer])]
            with torch.inference_mode():
                feats.append(target_features(target, seq).float().cpu().numpy().astype(np.float16))
            ids.append(np.asarray(seq, dtype=np.int32))
            plen.append(len(a.prompt))
            progress.advance(task)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in ids])]).astype(np.int64)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_npz(out, {"ids": np.concatenate(ids), "h": np.concatenate(feats), "offsets": offsets,
                   "prompt_len": np.asarray(plen, dtype=np.int32)})


@dataclass
class Features:
    """Stored features: ``ids`` and ``h`` concatenated over sequences, ``offsets`` ``(S + 1,)``, ``prompt_len``."""

    ids: np.ndarray
    h: np.ndarray
    offsets: np.ndarray
    prompt_len: np.ndarray

    @classmethod
    def load(cls, path: Path) -> Features:
        z = np.load(path)
        return cls(z["ids"].astype(np.int64), z["h"], z["offsets"], z["prompt_len"])

    @classmethod
    def concat(cls, parts: list[Features]) -> Features:
        """The sequences of every part, in order."""
        if len(parts) == 1:
            return parts[0]
        shift = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shift)]).astype(np.int64)
        return cls(np.concatenate([p.ids for p in parts]), np.concatenate([p.h for p in parts]), offsets,
                   np.concatenate([p.prompt_len for p in parts]))

    def starts(self, unroll: int) -> np.ndarray:
        """Flat indices ``s`` of every trainable start: ``s - 1`` and ``s + unroll - 1`` in the same sequence."""
        out = [np.arange(lo + 1, hi - unroll + 1) for lo, hi in zip(self.offsets[:-1], self.offsets[1:])]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def sequences(self) -> list[tuple[list[int], Any, int]]:
        """``(ids, features, prompt_len)`` per sequence (features as float32 torch tensors)."""
        import torch

        return [(self.ids[lo:hi].tolist(), torch.from_numpy(self.h[lo:hi].astype(np.float32)), int(p))
                for lo, hi, p in zip(self.offsets[:-1], self.offsets[1:], self.prompt_len)]


def train_head(build: HeadBuild, target: Any, feats: Features, ckpt: Path, ids: list[int],
               source: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train (or resume) the head for ``build.steps`` steps over the draft vocabulary ``ids``; returns the training
    state. ``source``: the data answers' identity, part of the recipe a resumed checkpoint must match."""
    import torch

    torch.manual_seed(build.seed)
    emb = target.get_input_embeddings().weight.detach().float()
    head = build_head(emb.shape[1], build.mlp, emb, ids)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=build.lr, weight_decay=build.weight_decay)
    sched = one_cycle(opt, build.lr, build.steps, pct_start=0.05)
    state: dict[str, Any] = {"step": 0, "elapsed_s": 0.0, "loss": None}
    recipe = _recipe(build, feats, source)
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        _check_recipe(ckpt, saved["state"].get("recipe"), recipe, "remove it to start over")
        head.load_state_dict(saved["head"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        state = saved["state"]
    state["recipe"] = recipe
    starts = feats.starts(build.unroll)
    if not len(starts):
        raise SpecgymError(f"{build.work}: no answers long enough to train a head on")
    h_all = torch.from_numpy(feats.h)
    tok_all = torch.from_numpy(feats.ids)
    rows = head.rows
    steps = np.arange(build.unroll)
    t0 = time.time() - state["elapsed_s"]
    last_ckpt, saved_step = time.time(), state["step"]
    head.train()
    try:
        with make_progress() as progress:
            task = progress.add_task("draft head", total=build.steps, completed=state["step"])
            while state["step"] < build.steps:
                rng = np.random.default_rng(build.seed * 1_000_003 + state["step"])
                s = starts[rng.integers(0, len(starts), build.batch)]
                f = h_all[s - 1].float()
                f = f + (torch.rand_like(f) - 0.5) * build.feature_noise
                pos = s[:, None] + steps[None, :]
                loss = _head_loss(head, f, tok_all[pos], h_all[pos].float(), rows, build.unroll)
                opt.zero_grad(set_to_none=True)
                (loss / build.unroll).backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                state["step"] += 1
                state["loss"] = float(loss.detach()) / build.unroll
                progress.update(task, completed=state["step"], description=f"draft head {state['loss']:.3f}")
                if time.time() - last_ckpt > 120 or state["step"] == build.steps:
                    state["elapsed_s"] = time.time() - t0
                    _save(ckpt, head, opt, sched, state)
                    last_ckpt, saved_step = time.time(), state["step"]
    except KeyboardInterrupt:
        if state["step"] != saved_step:  # progress since the last checkpoint: keep it
            state["elapsed_s"] = time.time() - t0
            _save(ckpt, head, opt, sched, state)
        if ckpt.exists():
            print(f"interrupted at step {state['step']:,} of {build.steps:,}: checkpoint saved to {ckpt}; the same "
                  f"specgym train-head command continues from it", file=sys.stderr)
        raise
    return state


def _head_loss(head: Any, f: Any, toks: Any, want: Any, rows: Any, unroll: int) -> Any:
    """The loss of one batch of starts, summed over ``unroll`` steps: the head fed its own features, each step's
    cross-entropy against the target's distribution over the draft vocabulary plus the smooth-L1 feature pull."""
    import torch

    loss = torch.zeros(())
    for j in range(unroll):
        f = head.step(f, toks[:, j])
        with torch.no_grad():
            p = torch.softmax(want[:, j] @ rows.T, dim=-1)
        ce = -(p * torch.log_softmax(head.scores(f), dim=-1)).sum(-1).mean()
        loss = loss + ce + torch.nn.functional.smooth_l1_loss(f, want[:, j])
    return loss


def _recipe(build: HeadBuild, feats: Features, source: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint was trained with: the build's training options, the number of train sequences and (data
    answers) their identity."""
    recipe = {k: v for k, v in asdict(build).items() if k not in ("target", "work", "extra_answers", "data")}
    recipe["sequences"] = len(feats.offsets) - 1
    if source is not None:
        recipe["data"] = source
    return recipe


def _check_recipe(ckpt: Path, had: dict[str, Any] | None, recipe: dict[str, Any], todo: str) -> None:
    """Refuse a checkpoint trained with another recipe (one from before recipes were kept is not checked)."""
    if had is not None and had != recipe:
        diff = ", ".join(f"{k} {had.get(k)!r} there, {v!r} now" for k, v in recipe.items() if had.get(k) != v)
        raise SpecgymError(f"{ckpt}: a head trained another way ({diff}); {todo}")


def _save(path: Path, head: Any, opt: Any, sched: Any, state: dict[str, Any]) -> None:
    """Checkpoint the head, its optimiser and schedule and the training state atomically (one file)."""
    save_torch_checkpoint(path, {"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                                 "state": state})


def heldout_runs(head: Any, feats: Features, k: int = HELDOUT_K) -> dict[str, Any]:
    """The head's runs from every start of the held-out answers (teacher-forced on the target's greedy tokens):
    ``accept_ge`` = share of starts whose first ``j`` proposals all match (j = 1..k), and the mean run."""
    runs = np.concatenate([head_runs(head, h, ids, p, k) for ids, h, p in feats.sequences()])
    return {"starts": int(runs.size), "mean_run": round(float(runs.mean()), 4),
            "accept_ge": [round(float((runs >= j).mean()), 4) for j in range(1, k + 1)]}


def run(build: HeadBuild, stages: tuple[str, ...] = STAGES, out: Path | None = None, force: bool = False) -> dict:
    """Run ``stages`` in order; returns the build's report (held-out runs after ``export``)."""
    if build.data is not None:
        return _run_on_data(build, stages, out, force)
    work, folder = build.work, build.work / "head"
    _check_source(folder, None)
    if not (work / "answers").is_dir() or not (work / "answers_val").is_dir():
        raise SpecgymError(f"{work}: no answers/ and answers_val/ (run `specgym train-draft --stages answers "
                           f"--work-dir {work}` first)")
    seen = {work.resolve(): f"--work-dir {work}"}
    for extra in build.extra_answers:
        if not (extra / "answers").is_dir():
            raise SpecgymError(f"--extra-answers {extra}: no answers/ (run `specgym train-draft --stages answers "
                               f"--seed N --work-dir {extra}` first)")
        if (same := seen.get(extra.resolve())) is not None:
            raise SpecgymError(f"--extra-answers {extra}: the same folder as {same} (its answers would be learned "
                               f"twice); drop it")
        seen[extra.resolve()] = f"--extra-answers {extra}"
    train_files = [w / "head" / "features_train.npz" for w in (work, *build.extra_answers)]
    _check_prerequisites(stages, train_files, folder)
    target = load_model(build.target, "target")
    report: dict[str, Any] = {}
    if "features" in stages:
        for w, path in zip((work, *build.extra_answers), train_files):
            collect_features(target, load_answers(w / "answers"), path, f"train answers of {w.name}")
        collect_features(target, load_answers(work / "answers_val"), folder / "features_val.npz", "val answers")
    ids = [int(i) for i in draft_vocab(work, build.draft_vocab)] if {"train", "export"} & set(stages) else []
    _train_and_export(build, stages, target, train_files, ids, None, report, out, force)
    return report


def _train_and_export(build: HeadBuild, stages: tuple[str, ...], target: Any, train_files: list[Path], ids: list[int],
                      data: DataAnswers | None, report: dict[str, Any], out: Path | None, force: bool) -> None:
    """The train and export stages (whichever ``stages`` names) over the features on disk, into ``report``."""
    import torch

    folder = build.work / "head"
    source = data.identity("train") if data is not None else None
    if "train" in stages:
        report["train"] = train_head(build, target, Features.concat([Features.load(p) for p in train_files]),
                                     folder / "ckpt.pt", ids, source)
    if "export" in stages:
        if out is None:
            raise SpecgymError("the export stage needs --out")
        saved = torch.load(folder / "ckpt.pt", weights_only=False)
        train_feats = Features.concat([Features.load(p) for p in train_files])
        _check_exportable(folder / "ckpt.pt", saved["state"], build, train_feats, source)
        emb = target.get_input_embeddings().weight.detach().float()
        head = build_head(emb.shape[1], build.mlp, emb, ids)
        head.load_state_dict(saved["head"])
        head.eval()
        report["heldout"] = heldout_runs(head, Features.load(folder / "features_val.npz"))
        report["train_runs"] = heldout_runs(head, train_feats)
        export_head(build, head, ids, saved["state"], report, out, force, data)


#: The file of a head folder (``<work>/head``) that records the data answers its features are of.
SOURCE_FILE = "source.json"


def _check_source(folder: Path, data: DataAnswers | None) -> None:
    """Refuse a head folder whose features or checkpoint are of other answers: data answers (``source.json``) for a
    run without ``--data`` or with another pick, a work folder's answers for a run with ``--data``.

    Raises:
        SpecgymError: One line naming the folder and what it holds.
    """
    path = folder / SOURCE_FILE
    want = {"train": data.identity("train"), "val": data.identity("val")} if data is not None else None
    try:
        have = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        raise SpecgymError(f"{path}: unreadable; use another --work-dir") from None
    made = any((folder / f).exists() for f in ("features_train.npz", "features_val.npz", "ckpt.pt"))
    if have == want or (have is None and not made):
        return
    if want is None:
        assert have is not None
        raise SpecgymError(f"{folder}: holds a head made from --data {have['train']['folder']}'s answers; give that "
                           f"--data, or use another --work-dir")
    if have is None:
        raise SpecgymError(f"{folder}: holds a head made from {folder.parent}'s answers, not --data "
                           f"{want['train']['folder']}'s; use another --work-dir")
    raise SpecgymError(f"{folder}: holds a head made from another pick of data answers ({have['train']['folder']}, "
                       f"{have['train']['answers']} train answers); use another --work-dir, or the same --data, "
                       f"--max-answers and --max-val-answers")


def _run_on_data(build: HeadBuild, stages: tuple[str, ...], out: Path | None, force: bool) -> dict:
    """:func:`run` on a data folder's answers: refusals first (an unfinished or another target's data folder, extra
    answers, a head folder of other answers, a stage's missing input), then the stages."""
    assert build.data is not None
    if build.extra_answers:
        raise SpecgymError(f"--extra-answers with --data: the data folder's train split holds the sampled answers; "
                           f"drop --extra-answers {build.extra_answers[0]}")
    data = read_data_answers(build.data, build.target)
    folder = build.work / "head"
    train_files = [folder / "features_train.npz"]
    _check_source(folder, data)
    _check_prerequisites(stages, train_files, folder)
    target = load_model(build.target, "target")
    report: dict[str, Any] = {}
    if "features" in stages:
        write_source(folder, data)
        collect_features(target, data.train, train_files[0], f"train answers of {build.data.folder.name}")
        collect_features(target, data.val, folder / "features_val.npz", "val answers")
    ids = [int(i) for i in answer_vocab(data.train, build.draft_vocab)]
    _train_and_export(build, stages, target, train_files, ids, data, report, out, force)
    return report


def write_source(folder: Path, data: DataAnswers) -> None:
    """Record the data answers a head folder's features are of (:data:`SOURCE_FILE`, before any feature)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / SOURCE_FILE, {"train": data.identity("train"), "val": data.identity("val")})


def _check_prerequisites(stages: tuple[str, ...], train_files: list[Path], folder: Path) -> None:
    """Refuse a stage whose input neither an earlier run nor an earlier stage of this run makes, naming the stage to
    run first (before the target is loaded)."""
    if {"train", "export"} & set(stages) and "features" not in stages:
        for path in [*train_files, *([folder / "features_val.npz"] if "export" in stages else [])]:
            if not path.is_file():
                stage = "train" if "train" in stages else "export"
                raise SpecgymError(f"--stages {stage}: {path} does not exist yet; run --stages features first")
    if "export" in stages and "train" not in stages and not (folder / "ckpt.pt").is_file():
        raise SpecgymError(f"--stages export: {folder / 'ckpt.pt'} does not exist yet (no trained head); run "
                           f"--stages train first")


def _check_exportable(ckpt: Path, state: dict[str, Any], build: HeadBuild, feats: Features,
                      source: dict[str, Any] | None = None) -> None:
    """Export only a finished checkpoint trained as this command says, so the card never misreports its recipe."""
    _check_recipe(ckpt, state.get("recipe"), _recipe(build, feats, source),
                  "export with the options it was trained with, or remove it and run --stages train")
    if state["step"] != build.steps:
        how = "stopped before the end" if state["step"] < build.steps else "more than --steps"
        raise SpecgymError(f"{ckpt}: trained {state['step']:,} steps of --steps {build.steps:,} ({how}); run "
                           f"--stages train to finish it, then export")


def _answer_plan(work: Path) -> dict[str, Any]:
    """The plan a work folder's answers were written with (``answers/plan.json``; the default plan before one was
    kept)."""
    path = work / "answers" / "plan.json"
    return json.loads(path.read_text()) if path.exists() else asdict(AnswerPlan())


def export_head(build: HeadBuild, head: Any, ids: list[int], state: dict[str, Any], report: dict[str, Any],
                out: Path, force: bool, data: DataAnswers | None = None) -> None:
    """Write the head folder: config, float16 weights (no embedding: the target's, borrowed at load), the
    vocabulary, ``training_state.json`` and a README card (``data``: the data folder's answers it learned from)."""
    import torch
    from safetensors.torch import save_file

    vocab_file = f"draft-vocab-{build.draft_vocab}.json"
    with atomic_dir(out, overwrite=force, owner="specgym train-head") as tmp:
        own = {k: v.to(torch.float16).contiguous() for k, v in head.state_dict().items()}
        save_file(own, str(tmp / HEAD_WEIGHTS), metadata={"format": "pt"})
        (tmp / vocab_file).write_text(json.dumps(ids) + "\n")
        cfg = {"width": head.width, "mlp": head.mlp, "vocab_file": vocab_file, "target": build.target,
               "kind": "specgym draft head (EAGLE-style recurrence, gated MLP)"}
        (tmp / HEAD_CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
        built = {k: str(v) if isinstance(v, Path) else [str(e) for e in v] if k == "extra_answers" else v
                 for k, v in asdict(build).items() if k != "data"}
        trained_on: dict[str, Any] = {
            "answers": "train prompts (train-draft --stages answers)", "split": "train",
            "folders": [str(w) for w in (build.work, *build.extra_answers)],
            "plans": {str(w): _answer_plan(w) for w in (build.work, *build.extra_answers)}}
        if data is not None and build.data is not None:
            built["data"] = {"folder": str(build.data.folder), "max_answers": build.data.max_answers,
                             "max_val_answers": build.data.max_val_answers, "options": build.data.options()}
            trained_on = {"answers": "the data folder's train split (specgym data generate)", **data.trained_on()}
        meta = {"build": built, "trained_on": trained_on, "training": state, "heldout": report["heldout"],
                "train_runs": report["train_runs"]}
        (tmp / "training_state.json").write_text(json.dumps(meta, indent=2) + "\n")
        n_params = sum(int(v.numel()) for v in own.values())
        (tmp / "README.md").write_text(head_card(meta, build.target, n_params, out), encoding="utf-8")

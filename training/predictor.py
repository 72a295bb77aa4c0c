"""Training and measuring the acceptance predictor (:mod:`specgym.envs.core.acceptance_predictor`).

Data: every position of a workload's split, its signals at the correct prefix (trace format v2) and its label —
greedy traces the accept bit, sampled traces ``p_accept`` as a soft label (the exact acceptance probability, so the
fit needs no draws). The loss is the binary cross-entropy with an L2 penalty, minimised by L-BFGS (scipy) on
standardised inputs; ``logistic`` and a small ``mlp`` (one tanh layer) are both fitted and the one with the lower
validation log loss is kept (:func:`select_predictor`).

Measures (:func:`predictor_metrics`): AUC (soft labels count each position as accepted with weight ``p`` and
rejected with ``1 - p``), log loss, expected calibration error (10 equal-width bins), against calibrated
confidence (the ``conf``-only logistic: Platt scaling of the draft's confidence).

**The draft head's tokens** (``drafter="head"``, ``specgym predictor train --drafter head``): a recording with the
head's per-start runs and top-8 (``runs_head``, ``topk_head``) gives one example per greedy request's start ``g`` and
depth ``j = 1..J`` (``J``: ``topk_head``'s depth, at most the room left before the request's end) at which the head's
first ``j - 1`` tokens were accepted (``runs_head[g] >= j - 1``): the head's token ``j`` is then judged, accepted iff
``runs_head[g] >= j`` (:func:`head_dataset`). Its inputs are
:func:`~specgym.envs.core.acceptance_predictor.head_features` of ``topk_head[g, j - 1]`` (converted by
:func:`~specgym.envs.engines.replay.trace_engine.head_topk`, as replay converts them), the token's position ``g + j -
1`` and ``j``: the function a ``DraftStep`` of the head is priced with. The fitting, the choice of model kind and the
decision threshold (tuned on ``predicted:NAME@head``) are the draft model's, unchanged; no continuation models (the
``planned:`` controller does not plan the head).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specgym.baselines.drafter_chain import ChainOnDrafter
from specgym.baselines.predicted_marginal import PredictedMarginal
from specgym.envs.core.acceptance_predictor import (
    GROUP_SIGNALS,
    MODEL_KINDS,
    AcceptancePredictor,
    check_groups,
    design_matrix,
    head_design_matrix,
)
from specgym.envs.core.kinds import HEAD_DRAFTER, IMPLICIT_DRAFTER
from specgym.envs.core.signals import TOPK
from specgym.envs.core.stopping_plan import ContinuationModel, fit_continuation
from specgym.envs.engines.replay.trace_engine import TraceEngine, head_topk
from specgym.envs.workloads.loops import is_looped
from specgym.envs.workloads.trace_format import Workload
from specgym.errors import SpecgymError
from specgym.eval.drafter_runner import run_drafter_controller
from specgym.eval.runner import run_controller


@dataclass
class Dataset:
    """Design rows and labels of a workload split."""

    x: np.ndarray
    y: np.ndarray
    loops: np.ndarray  # per row: the request has a repetition loop (lookup agreement on most positions)


def workload_dataset(wl: Workload, split: str, groups: tuple[str, ...], max_rows: int | None = None,
                     seed: int = 0, requests: np.ndarray | None = None, drafter: str = IMPLICIT_DRAFTER) -> Dataset:
    """The predictor's design matrix and labels over the positions of ``split``'s requests (or of ``requests``):
    the draft model's tokens, or with ``drafter`` ``head`` the head's (:func:`head_dataset`)."""
    groups = check_groups(groups, drafter=drafter)
    reqs = wl.split_indices(split) if requests is None else np.asarray(requests)
    if drafter == HEAD_DRAFTER:
        return head_dataset(wl, groups, reqs, max_rows, seed)
    rows = np.concatenate([np.arange(wl.offsets[r], wl.offsets[r + 1]) for r in reqs]) if len(reqs) else \
        np.zeros(0, np.int64)
    pos = np.concatenate([np.arange(wl.offsets[r + 1] - wl.offsets[r]) for r in reqs]) if len(reqs) else rows
    temp = np.concatenate([np.full(wl.offsets[r + 1] - wl.offsets[r], wl.temperature[r]) for r in reqs]) \
        if len(reqs) else rows.astype(np.float64)

    def col(name: str) -> np.ndarray | None:
        a = getattr(wl, name, None)
        return None if a is None else a[rows]

    what = "the acceptance predictor's training"
    x = design_matrix(groups, wl.require("draft_conf", what)[rows], wl.require("draft_entropy", what)[rows], pos, temp,
                      col("draft_topk"), col("lookup_len"), col("lookup_agree"), col("hidden_sketch"))
    if x is None:
        raise SpecgymError(missing_signals(wl, groups))
    loops = np.concatenate([np.full(wl.offsets[r + 1] - wl.offsets[r], request_loops(wl, int(r))) for r in reqs]) \
        if len(reqs) else np.zeros(0, bool)
    y = wl.require("p_accept", what)[rows].astype(np.float64)
    if max_rows is not None and len(y) > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(len(y), max_rows, replace=False))
        x, y, loops = x[keep], y[keep], loops[keep]
    return Dataset(x, y, loops)


def head_dataset(wl: Workload, groups: tuple[str, ...], requests: np.ndarray, max_rows: int | None = None,
                 seed: int = 0) -> Dataset:
    """The head predictor's design rows and labels over the greedy requests of ``requests``: one per start ``g`` and
    depth ``j`` whose earlier head tokens were accepted (see the module docstring); subsampled to ``max_rows``.

    Raises:
        SpecgymError: ``wl`` lacks ``topk_head`` or ``runs_head``.
    """
    top_head = wl.topk_head
    missing = [c for c, have in (("topk_head", top_head is not None), ("runs_head", HEAD_DRAFTER in wl.runs))
               if not have]
    if top_head is None or missing:
        raise SpecgymError(f"workload {wl.name!r} lacks the draft head's column(s) {', '.join(map(repr, missing))}: "
                           f"record it with a pair that has a draft head (specgym record), or train on the draft "
                           f"model's tokens (without --drafter head)")
    reqs = np.asarray(requests, dtype=np.int64)
    reqs = reqs[wl.temperature[reqs] == 0.0]  # the head's confidence is carried on greedy requests only
    depth = top_head.shape[1] // TOPK
    rows = np.concatenate([np.arange(wl.offsets[r], wl.offsets[r + 1]) for r in reqs]) if len(reqs) else \
        np.zeros(0, np.int64)
    g = np.concatenate([np.arange(wl.offsets[r + 1] - wl.offsets[r]) for r in reqs]) if len(reqs) else rows
    room = np.concatenate([np.full(wl.offsets[r + 1] - wl.offsets[r], wl.offsets[r + 1] - wl.offsets[r]) for r in
                           reqs]) - g - 1 if len(reqs) else rows  # tokens a round from g may draft
    loop = np.concatenate([np.full(wl.offsets[r + 1] - wl.offsets[r], request_loops(wl, int(r))) for r in reqs]) \
        if len(reqs) else np.zeros(0, bool)
    runs = np.asarray(wl.runs[HEAD_DRAFTER], dtype=np.int64)[rows]
    j = np.arange(1, depth + 1)[None, :]
    judged = (j <= room[:, None]) & (runs[:, None] >= j - 1)
    at, col = np.nonzero(judged)
    if max_rows is not None and len(at) > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(len(at), max_rows, replace=False))
        at, col = at[keep], col[keep]
    topk = head_topk(top_head[rows[at]])[np.arange(len(at)), col]
    x = head_design_matrix(groups, topk, g[at] + col, col + 1)
    return Dataset(x, (runs[at] >= col + 1).astype(np.float64), loop[at])


def missing_signals(wl: Workload, groups: tuple[str, ...]) -> str:
    """The one-line message for a workload that lacks a column ``groups`` read: which columns, and the fix (a v2
    trace that only lacks the hidden sketch needs ``--hidden-sketch``, not another format)."""
    present = set(wl.signal_names)
    lacking = {g: [c for c in GROUP_SIGNALS[g] if c not in present] for g in groups}
    lacking = {g: cols for g, cols in lacking.items() if cols}
    have = [g for g in groups if g not in lacking]
    what = ", ".join(f"{g} ({', '.join(cols)})" for g, cols in lacking.items())
    if set(lacking) == {"hidden"} and present:
        fix = "record it with --hidden-sketch D (specgym record), or drop the hidden group"
    else:
        fix = "record it with specgym record (trace format v2 signals)"
    return (f"workload {wl.name!r} lacks the signals of group(s) {what}: {fix}, or use --groups "
            f"{','.join(have) or 'conf,position'}")


def request_loops(wl: Workload, r: int) -> bool:
    """True when request ``r``'s completion ends in a repetition loop — the recorder's definition
    (:func:`~specgym.envs.workloads.loops.is_looped`: the last 64 tokens periodic with period <= 32) on the recorded
    token ids; without token ids, when the lookup agrees with the draft at more than half of its positions."""
    sl = slice(int(wl.offsets[r]), int(wl.offsets[r + 1]))
    if wl.token_id is not None:
        return is_looped(wl.token_id[sl].tolist())
    agree = wl.lookup_agree
    return bool(agree is not None and len(agree[sl]) and agree[sl].mean() > 0.5)


# ---------------------------------------------------------------------------------------------------- fitting
def _unpack(theta: np.ndarray, shapes: list[tuple[int, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
    layers, i = [], 0
    for fin, fout in shapes:
        w = theta[i: i + fin * fout].reshape(fin, fout)
        i += fin * fout
        b = theta[i: i + fout]
        i += fout
        layers.append((w, b))
    return layers


def _loss_grad(theta: np.ndarray, x: np.ndarray, y: np.ndarray, shapes: list[tuple[int, int]], l2: float):
    layers = _unpack(theta, shapes)
    acts = [x]
    h = x
    for i, (w, b) in enumerate(layers):
        h = h @ w + b
        if i < len(layers) - 1:
            h = np.tanh(h)
        acts.append(h)
    z = acts[-1][:, 0]
    n = len(y)
    # BCE with logits: log(1 + e^z) - y z
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z)) + 0.5 * l2 * sum(float((w * w).sum()) for w, _ in layers)
    g = ((1.0 / (1.0 + np.exp(-z))) - y)[:, None] / n
    grads: list[np.ndarray] = []
    for i in range(len(layers) - 1, -1, -1):
        w, _ = layers[i]
        a_in = acts[i]
        gw = a_in.T @ g + l2 * w
        gb = g.sum(axis=0)
        grads = [gw.ravel(), gb] + grads
        if i > 0:
            g = (g @ w.T) * (1.0 - acts[i] ** 2)
    return loss, np.concatenate(grads)


def fit_predictor(train: Dataset, groups: tuple[str, ...], kind: str = "logistic", hidden_units: int = 16,
                  l2: float = 1e-4, seed: int = 0, name: str = "predictor", hidden_dim: int = 0,
                  max_iter: int = 400, drafter: str = IMPLICIT_DRAFTER) -> AcceptancePredictor:
    """Fit one model (``logistic`` or ``mlp``) by L-BFGS on standardised inputs (of ``drafter``'s tokens)."""
    from scipy.optimize import minimize

    if kind not in MODEL_KINDS:
        raise SpecgymError(f"model kind {kind!r}: choose one of {', '.join(MODEL_KINDS)}")
    if len(train.y) == 0:
        raise SpecgymError("no training positions (empty split)")
    mean = train.x.mean(axis=0)
    scale = train.x.std(axis=0)
    scale = np.where(scale > 1e-8, scale, 1.0)
    xs = (train.x - mean) / scale
    f = xs.shape[1]
    shapes = [(f, 1)] if kind == "logistic" else [(f, hidden_units), (hidden_units, 1)]
    rng = np.random.default_rng(seed)
    theta0 = np.concatenate([np.concatenate([rng.standard_normal(fi * fo) * (0.0 if kind == "logistic" else
                                                                          1.0 / np.sqrt(fi)), np.zeros(fo)])
                             for fi, fo in shapes])
    res = minimize(_loss_grad, theta0, args=(xs, train.y, shapes, l2), jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter})
    layers = tuple((w.copy(), b.copy()) for w, b in _unpack(res.x, shapes))
    return AcceptancePredictor(name, groups, kind, mean, scale, layers, hidden_dim, drafter=drafter)


def select_predictor(wl: Workload | Sequence[Workload], groups: tuple[str, ...], name: str,
                     kinds: tuple[str, ...] = MODEL_KINDS, max_rows: int | None = 200_000,
                     seed: int = 0, progress: Callable[[int, int], None] | None = None,
                     drafter: str = IMPLICIT_DRAFTER) -> tuple[AcceptancePredictor, dict[str, Any]]:
    """Fit every kind on the train split (of every workload given: e.g. one pair's greedy and sampled traces, so one
    predictor serves every temperature), keep the one with the lowest validation log loss, then choose its decision
    threshold on validation (:func:`tune_threshold`: the largest geometric-mean speed over the workloads); returns it
    and the validation figures of every candidate. With the ``hidden`` group it also carries a fallback selected the
    same way without it, for deployments that cannot read the draft's hidden state (transformers' ``generate()``).
    ``drafter`` ``head``: a predictor of the draft head's tokens (see the module docstring)."""
    wls = [wl] if isinstance(wl, Workload) else list(wl)
    groups = check_groups(groups, drafter=drafter)
    head = drafter == HEAD_DRAFTER
    steps = len(kinds) * (2 if "hidden" in groups else 1) + len(wls) + (0 if head else 1)  # fits, thresholds, conts
    done = [0]

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], steps)

    best, candidates = select_kind(wls, groups, name, kinds, max_rows, seed, tick, drafter)
    speeds = []
    for w in wls:
        speeds.append(tune_threshold(w, best)[1])
        tick()
    grid = list(speeds[0])
    threshold = max(grid, key=lambda t: sum(math.log(sp[t]) for sp in speeds))
    candidates["threshold"] = {"chosen": threshold, "val_tok_s": {
        w.name: {str(t): v for t, v in sp.items()} for w, sp in zip(wls, speeds)}}
    fallback = None
    if "hidden" in groups:
        # no threshold or continuation of its own: the primary's price the decisions
        fallback_groups = tuple(g for g in groups if g != "hidden")
        fallback, figures = select_kind(wls, fallback_groups, f"{name}-fallback", kinds, max_rows, seed, tick)
        candidates["fallback"] = {"groups": list(fallback_groups), **figures}
    continuation = {} if head else fit_continuations(wls, best)
    if not head:
        tick()
    return dataclasses.replace(best, threshold=threshold, continuation=continuation, fallback=fallback), candidates


def select_kind(wls: Sequence[Workload], groups: tuple[str, ...], name: str, kinds: tuple[str, ...],
                max_rows: int | None = 200_000, seed: int = 0, tick: Callable[[], None] | None = None,
                drafter: str = IMPLICIT_DRAFTER) -> tuple[AcceptancePredictor, dict[str, Any]]:
    """Fit every model kind on ``groups`` (of ``drafter``'s tokens) over the train splits; the one with the lowest
    validation log loss and the validation figures of every kind."""
    sketch = getattr(wls[0], "hidden_sketch", None)
    hidden_dim = int(sketch.shape[1]) if "hidden" in groups and sketch is not None else 0
    per = max_rows // len(wls) if max_rows else None
    train = _concat([workload_dataset(w, "train", groups, per, seed, requests=w.learning_requests()[0],
                                      drafter=drafter) for w in wls])
    val = _concat([workload_dataset(w, "val", groups, requests=w.learning_requests()[1], drafter=drafter)
                   for w in wls])
    figures: dict[str, Any] = {}
    best: AcceptancePredictor | None = None
    for kind in kinds:
        pred = fit_predictor(train, groups, kind, name=name, hidden_dim=hidden_dim, seed=seed, drafter=drafter)
        figures[kind] = predictor_metrics(pred.predict_matrix(val.x), val.y)
        if tick is not None:
            tick()
        if best is None or figures[kind]["log_loss"] < figures[best.kind]["log_loss"]:
            best = pred
    assert best is not None
    return best, figures


def fit_continuations(wls: Sequence[Workload], pred: AcceptancePredictor, split: str | None = None,
                      ) -> dict[str, ContinuationModel]:
    """The continuation models of ``pred`` (what ``planned:`` plans with), one per temperature group present
    (``greedy``: T = 0; ``sampled``), fitted on ``pred``'s own predictions over ``split`` (``None``: the requests
    the predictor was fitted on, :meth:`Workload.learning_requests`)."""
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for w, wl in enumerate(wls):
        reqs = wl.learning_requests()[0] if split is None else wl.split_indices(split)
        for group, sel in (("greedy", wl.temperature[reqs] == 0.0), ("sampled", wl.temperature[reqs] != 0.0)):
            chosen = reqs[sel]
            if len(chosen) == 0:
                continue
            sub = workload_dataset(wl, split or wl.fit_split, pred.groups, requests=chosen)
            # a transition never crosses two requests (of one workload or of two)
            key = np.concatenate([np.full(wl.offsets[r + 1] - wl.offsets[r], (w << 32) + int(r)) for r in chosen])
            parts.setdefault(group, []).append((pred.predict_matrix(sub.x), sub.y, key))
    out: dict[str, ContinuationModel] = {}
    for g, ps in parts.items():
        p, accepted, request = (np.concatenate(cols) for cols in zip(*ps))
        out[g] = fit_continuation(p, accepted, request)
    return out


def _concat(parts: list[Dataset]) -> Dataset:
    return Dataset(np.concatenate([p.x for p in parts]), np.concatenate([p.y for p in parts]),
                   np.concatenate([p.loops for p in parts]))


THRESHOLDS = tuple(round(0.5 + 0.05 * i, 2) for i in range(15))  # 0.50 .. 1.20


def tune_threshold(wl: Workload, pred: AcceptancePredictor, split: str | None = None,
                   grid: tuple[float, ...] = THRESHOLDS, seed: int = 0) -> tuple[float, dict[float, float]]:
    """The decision threshold of the ``predicted:`` controller that decodes ``split`` fastest in replay (``None``:
    the requests a choice is made on, :meth:`Workload.learning_requests`; the workload's own profile, common random
    numbers); returns it and the tokens/s of every grid point. A head predictor is tuned as ``predicted:NAME@head``
    on the greedy requests (where the head's rounds carry what it reads)."""
    engine = TraceEngine(wl, wl.profile, seed=seed)
    requests = wl.learning_requests()[1] if split is None else wl.split_indices(split)
    if pred.on_head:
        requests = requests[wl.temperature[requests] == 0.0]

    def time_ms(t: float) -> float:
        ctrl = PredictedMarginal(pred, threshold=t)
        if pred.on_head:
            return float(run_drafter_controller(engine, requests, ChainOnDrafter(ctrl, HEAD_DRAFTER)).time_ms.sum())
        return float(run_controller(engine, requests, ctrl).time_ms.sum())

    tokens = float(wl.lengths[requests].sum())
    speed = {t: tokens / time_ms(t) * 1000.0 for t in grid}
    return max(grid, key=lambda t: speed[t]), speed


# ---------------------------------------------------------------------------------------------------- metrics
def soft_auc(p: np.ndarray, y: np.ndarray) -> float:
    """AUC with soft labels: each row is a positive of weight ``y`` and a negative of weight ``1 - y``."""
    order = np.argsort(p, kind="mergesort")
    p, y = p[order], y[order]
    pos, neg = y, 1.0 - y
    # ties: give each tied group half credit
    _, start, counts = np.unique(p, return_index=True, return_counts=True)
    neg_before = np.concatenate([[0.0], np.cumsum(neg)])
    auc = 0.0
    for s, c in zip(start, counts):
        e = s + c
        n_below = neg_before[s]
        n_tie = neg_before[e] - neg_before[s]
        auc += float(pos[s:e].sum()) * (n_below + 0.5 * n_tie)
    total = float(pos.sum()) * float(neg.sum())
    return auc / total if total > 0 else float("nan")


def predictor_metrics(p: np.ndarray, y: np.ndarray, bins: int = 10) -> dict[str, float]:
    """AUC, log loss, expected calibration error and the mean prediction vs the mean label."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(y, dtype=np.float64)
    ll = float(np.mean(-(y * np.log(p) + (1 - y) * np.log1p(-p))))
    idx = np.minimum((p * bins).astype(int), bins - 1)
    ece = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            ece += m.mean() * abs(float(p[m].mean()) - float(y[m].mean()))
    return {"auc": soft_auc(p, y), "log_loss": ll, "ece": float(ece), "mean_pred": float(p.mean()),
            "mean_label": float(y.mean()), "positions": int(len(y))}

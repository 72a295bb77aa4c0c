"""A learned acceptance predictor: P(draft token accepted) from the signals a controller has before verification.

The decision of when to stop drafting is a threshold on the acceptance probability (SpecDec++), so a controller is as
good as its estimate of that probability. The draft's confidence alone is a weak estimate (AUC ~0.84 on the greedy
midpair); recorded context signals (:mod:`specgym.envs.core.signals`, trace format v2) add what the draft does not
know about itself, above all whether the text is repeating (the context lookup). This module is the predictor's
*inference* and artifact: a small model over a fixed design matrix, numpy only, stored as JSON with its signal
groups, feature version and a checksum over every field that changes its output. Training lives in
:mod:`specgym.training.predictor`.

**Inputs** (:func:`design_matrix`; the same function serves training on trace columns and deployment on one
:class:`~specgym.envs.core.rounds.DraftStep`), by signal group:

* ``conf``: ``logit(draft_conf)`` (clipped to +-12) — always present;
* ``shape``: draft entropy / 8 nats, the top-2 probability, ``top1 - top2``, ``log(top1 / top2)``, the top-8 mass;
* ``position``: ``log1p(completion position) / log1p(4096)``, and the temperature;
* ``lookup``: one-hot of the lookup match length 1..4, whether its continuation equals the draft token, and that
  agreement times the match length / 4;
* ``hidden``: the draft hidden-state sketch (``D`` values), when recorded.

**The draft head's tokens** (``drafter`` ``head``, ``predicted:NAME@head``): a predictor may predict the acceptance
of another drafter's tokens than the pair's draft model's. The draft head's rounds carry no entropy and none of the
draft model's signals, only the head's top-8 probabilities at each draft token (what a recording's ``topk_head``
stores and what the live head computes as it drafts: ``DraftStep.drafter_topk``), so its inputs are
:func:`head_features`, by group (:data:`HEAD_GROUPS`): ``conf`` (``logit`` of the top-1), ``shape`` without the
entropy (top-2, ``top1 - top2``, ``log(top1 / top2)``, the top-8 mass), ``position`` (its log, as above; head rounds
are greedy, so no temperature) and ``index`` (the token's index ``j`` in the round: one-hot of 1..3 and ``min(j,
16) / 8``, since the head drifts from the target's features as it drafts on). One function computes them for training
(:func:`head_design_matrix`) and for a ``DraftStep`` (:meth:`AcceptancePredictor.predict_step`). The drafter is a field
of the artifact, covered by its checksum (absent, as in every older file: the draft model's tokens).

Every column is standardised with the training set's mean and scale (stored). **Models**: ``logistic`` (one
linear layer) or ``mlp`` (one tanh hidden layer), chosen by validation log loss.

**Degrading**: a predictor needs its groups' signals; where a step lacks one (a synthetic trace, a v1 trace, an
engine without lookups) it asks its **fallback**, a predictor of the same probability on fewer groups (the shipped
midpair predictor reads the draft's hidden sketch, which transformers' ``generate()`` hook cannot give, and falls back
to the one without it); where no model has its signals :meth:`AcceptancePredictor.predict_step` returns ``None`` and
the controller falls back to calibrated confidence. Bump :data:`PREDICTOR_VERSION` when any input's meaning or
scaling changes.

**Compatibility** (:meth:`AcceptancePredictor.for_source`, the one check of every place that pairs a predictor with
a workload or an engine: ``eval``, ``predictor eval``, ``train``, the gym env, ``generate``, the live bench): a
predictor is a function of one pair's signals. Its metadata names the pair it was trained on (``pair_draft``,
``pair_target``) and the identity of the hidden sketch it reads (``hidden_sketch``:
:func:`~specgym.envs.core.signals.sketch_identity`). A :class:`SignalSource` describes what a workload or a live
engine feeds it. Then:

* another pair (both sides known) is refused in one line: its probabilities are another model's; names are not
  enough (two folders may share a name): where both sides' configs can be read (a recorded workload's
  ``draft_signature``/``target_signature``, a model folder on this machine, shipped models by their data path), the
  architecture, width, depth and vocabulary of each model must agree too (:func:`model_signature`);
* a source without one of the predictor's groups, or with a different hidden sketch (another projection, width or
  seed), is served by the first predictor of its fallback chain that it can feed, with one note; where none fits,
  the controller estimates acceptance from calibrated confidence (``marginal``'s estimate), with one note;
* ``strict`` (training a policy on the predictor's outputs) refuses any of these instead of falling back.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.kinds import HEAD_DRAFTER, IMPLICIT_DRAFTER
from specgym.envs.core.rounds import DraftStep
from specgym.envs.core.signals import sketch_identity, sketch_identity_from_meta
from specgym.envs.core.stopping_plan import ContinuationModel
from specgym.errors import SpecgymError
from specgym.io import atomic_write_text

PREDICTOR_VERSION = 1
SIGNAL_GROUPS = ("conf", "shape", "position", "lookup", "hidden")
#: The signal groups of a predictor of the draft head's tokens (:func:`head_features`).
HEAD_GROUPS = ("conf", "shape", "position", "index")
#: The drafters whose tokens a predictor may predict: the pair's draft model (the default) and the draft head.
PREDICTOR_DRAFTERS = (IMPLICIT_DRAFTER, HEAD_DRAFTER)
MODEL_KINDS = ("logistic", "mlp")
_LOGIT_CLIP = 12.0
_ENTROPY_SCALE = 8.0
_LOG_POS = math.log1p(4096.0)
_EPS = 1e-6


#: The trace signal columns each signal group needs (``conf`` and ``position`` are in every trace and engine).
GROUP_SIGNALS: dict[str, tuple[str, ...]] = {
    "conf": (), "shape": ("draft_topk",), "position": (), "lookup": ("lookup_len", "lookup_agree"),
    "hidden": ("hidden_sketch",),
}


def _model_name(name: Any) -> str | None:
    """A model's name as metadata gives it, normalised for comparison (``./a/b/`` = ``a/b``); None if unknown."""
    if not name:
        return None
    text = str(name).strip()
    return os.path.normpath(text) if text else None


def model_signature(config: Any) -> dict[str, Any]:
    """What identifies a model's shape for signal compatibility: family, width, depth, vocabulary (``config``: a
    transformers config or its ``config.json`` dict)."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))

    def first(*keys: str) -> int | None:
        for k in keys:
            v = get(k, None)
            if isinstance(v, int) and not isinstance(v, bool):
                return int(v)
        return None

    return {"model_type": get("model_type", None), "hidden_size": first("hidden_size", "n_embd", "d_model"),
            "layers": first("num_hidden_layers", "n_layer", "num_layers"), "vocab_size": first("vocab_size")}


def signature_of(name: str | None, roots: tuple[Path, ...] = ()) -> dict[str, Any] | None:
    """:func:`model_signature` of a model folder a metadata name points to (a shipped ``models/...`` name resolves
    under one of ``roots``: the data catalogue's folder, passed in by the caller, since the core reads no
    catalogue), or None where no config can be read (a hub name, a folder not on this machine)."""
    if not name:
        return None
    for folder in (*(root / name for root in roots), Path(name)):
        try:
            cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(cfg, dict):
            return model_signature(cfg)
    return None


def _describe(sig: dict[str, Any]) -> str:
    return f"{sig.get('model_type')}, hidden {sig.get('hidden_size')}, {sig.get('layers')} layers, vocab " \
           f"{sig.get('vocab_size')}"


def same_model(a: str | None, b: str | None) -> bool:
    """Whether two metadata names may name one model: equal, either unknown, or one path ending with the other
    (``/data/models/midpair/target`` and the shipped ``models/midpair/target``), over at least two components."""
    if a is None or b is None or a == b:
        return True
    pa, pb = Path(a).parts, Path(b).parts
    short, long = (pa, pb) if len(pa) <= len(pb) else (pb, pa)
    return len(short) >= 2 and long[-len(short):] == short


@dataclass(frozen=True)
class SignalSource:
    """What a workload or a live engine feeds an acceptance predictor.

    Attributes:
        where: How messages name it (``workload 'midpair-greedy'``, ``the live engine on midpair``).
        draft, target: The pair's models as metadata names them (None where unknown: a synthetic workload).
        groups: The signal groups it carries (:data:`SIGNAL_GROUPS`).
        sketch: The identity of its hidden sketch (:func:`~specgym.envs.core.signals.sketch_identity`), or None.
        signatures: The draft's and target's :func:`model_signature` where known (recorded, or the loaded models').
        model_roots: Folders where metadata model names resolve (:data:`specgym.paths.MODEL_ROOTS`, passed in by
            the caller), to read a model's signature from its folder where none is recorded.
    """

    where: str
    draft: str | None
    target: str | None
    groups: tuple[str, ...]
    sketch: dict[str, Any] | None = None
    signatures: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None)
    model_roots: tuple[Path, ...] = ()

    def signature(self, role: str) -> dict[str, Any] | None:
        """The ``draft``/``target`` model's :func:`model_signature`: the recorded one, else its folder's."""
        sig = self.signatures[0 if role == "draft" else 1]
        return sig if sig is not None else signature_of(self.draft if role == "draft" else self.target,
                                                        self.model_roots)

    @classmethod
    def of_workload(cls, wl: Any, model_roots: tuple[Path, ...] = ()) -> SignalSource:
        """The source of a :class:`~specgym.envs.workloads.trace_format.Workload` (its metadata and columns)."""
        source = wl.source if isinstance(wl.source, dict) else {}
        where = f"workload {wl.name!r}"
        present = set(wl.signal_names)
        groups = tuple(g for g in SIGNAL_GROUPS if set(GROUP_SIGNALS[g]) <= present)
        meta = (wl.signal_meta or {}).get("hidden_sketch")
        sketch = sketch_identity_from_meta(meta, where) if meta is not None and "hidden" in groups else None
        recorded = source.get("kind") == "recorded"
        sigs = tuple(source.get(f"{r}_signature") if recorded and isinstance(source.get(f"{r}_signature"), dict)
                     else None for r in ("draft", "target"))
        return cls(where, _model_name(source.get("draft_model")) if recorded else None,
                   _model_name(source.get("target_model")) if recorded else None, groups, sketch,
                   (sigs[0], sigs[1]), tuple(model_roots))

    @classmethod
    def of_engine(cls, where: str, draft: str | None, target: str | None, signals: bool,
                  sketch: np.ndarray | None = None, sketch_seed: int | None = None,
                  signatures: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None),
                  model_roots: tuple[Path, ...] = ()) -> SignalSource:
        """The source of a live engine: every group when it computes signals, ``hidden`` with a sketch
        (``signatures``: the loaded models' :func:`model_signature`, else read from their folders)."""
        groups = ("conf", "position") + (("shape", "lookup") if signals else ())
        if signals and sketch is not None:
            groups += ("hidden",)
        ident = sketch_identity(sketch, sketch_seed) if signals and sketch is not None else None
        return cls(where, _model_name(draft), _model_name(target),
                   tuple(g for g in SIGNAL_GROUPS if g in groups), ident, signatures, tuple(model_roots))


def drafter_groups(drafter: str = IMPLICIT_DRAFTER) -> tuple[str, ...]:
    """The signal groups a predictor of ``drafter``'s tokens may read, in canonical order."""
    return HEAD_GROUPS if drafter == HEAD_DRAFTER else SIGNAL_GROUPS


def group_columns(groups: tuple[str, ...], hidden_dim: int = 0, drafter: str = IMPLICIT_DRAFTER) -> list[str]:
    """Names of the design-matrix columns of ``groups`` (of a predictor of ``drafter``'s tokens), in order."""
    names: list[str] = []
    if drafter == HEAD_DRAFTER:
        for g in HEAD_GROUPS:
            if g not in groups:
                continue
            names += {"conf": ["logit_conf"], "shape": ["top2", "top1_minus_top2", "log_top1_over_top2", "top8_mass"],
                      "position": ["log_position"], "index": ["index_1", "index_2", "index_3", "index_scaled"]}[g]
        return names
    for g in SIGNAL_GROUPS:
        if g not in groups:
            continue
        if g == "conf":
            names += ["logit_conf"]
        elif g == "shape":
            names += ["entropy", "top2", "top1_minus_top2", "log_top1_over_top2", "top8_mass"]
        elif g == "position":
            names += ["log_position", "temperature"]
        elif g == "lookup":
            names += [f"lookup_len_{n}" for n in range(1, 5)] + ["lookup_agree", "lookup_agree_x_len"]
        elif g == "hidden":
            names += [f"hidden_{d}" for d in range(hidden_dim)]
    return names


def check_groups(groups: tuple[str, ...] | list[str], where: str = "groups",
                 drafter: str = IMPLICIT_DRAFTER) -> tuple[str, ...]:
    """Validated groups of a predictor of ``drafter``'s tokens in canonical order (``conf`` always included)."""
    allowed = drafter_groups(drafter)
    unknown = [g for g in groups if g not in allowed]
    if unknown:
        whose = " of the draft head's tokens" if drafter == HEAD_DRAFTER else ""
        raise SpecgymError(f"{where}: unknown signal group(s) {unknown}{whose}; choose from {', '.join(allowed)}")
    return tuple(g for g in allowed if g in set(groups) | {"conf"})


def _logit(conf: float) -> float:
    c = min(max(conf, _EPS), 1.0 - _EPS)
    return min(max(math.log(c) - math.log1p(-c), -_LOGIT_CLIP), _LOGIT_CLIP)


def _shape(tk: list[float]) -> list[float]:
    """The entropy-free ``shape`` inputs of a top-8: top-2, ``top1 - top2``, ``log(top1 / top2)``, the mass."""
    t1, t2 = tk[0], tk[1]
    ratio = math.log(max(t1, _EPS)) - math.log(max(t2, _EPS))
    return [t2, t1 - t2, min(ratio, _LOGIT_CLIP), math.fsum(tk)]


def head_features(groups: tuple[str, ...], topk: Any, position: int, index: int) -> list[float] | None:
    """The inputs of a predictor of the draft head's tokens (:data:`HEAD_GROUPS`) for one draft token, in plain
    Python floats: the one definition training (:func:`head_design_matrix`) and deployment
    (:meth:`AcceptancePredictor.predict_step`) share. ``None`` when ``topk`` is absent.

    Args:
        groups: Signal groups, canonical order.
        topk: The head's 8 largest probabilities at the token, descending (the first is its confidence).
        position: The token's completion position.
        index: The token's 1-based index ``j`` in its round.
    """
    if topk is None:
        return None
    tk = [float(v) for v in topk]
    row = [_logit(tk[0])]
    if "shape" in groups:
        row += _shape(tk)
    if "position" in groups:
        row += [math.log1p(position) / _LOG_POS]
    if "index" in groups:
        j = int(index)
        row += [1.0 if j == 1 else 0.0, 1.0 if j == 2 else 0.0, 1.0 if j == 3 else 0.0, min(j, 16) / 8.0]
    return row


def head_design_matrix(groups: tuple[str, ...], topk: np.ndarray, position: np.ndarray,
                       index: np.ndarray) -> np.ndarray:
    """:func:`head_features` of ``n`` draft tokens, ``(n, F)`` float64 (``topk`` ``(n, 8)``, ``position`` and
    ``index`` ``(n,)``): row by row through the deployment path's function, so training sees what deployment does."""
    tk = np.asarray(topk).tolist()
    pos, idx = np.asarray(position).tolist(), np.asarray(index).tolist()
    width = len(group_columns(groups, drafter=HEAD_DRAFTER))
    rows = [head_features(groups, t, p, j) for t, p, j in zip(tk, pos, idx)]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), width)


def design_matrix(groups: tuple[str, ...], conf: np.ndarray, entropy: np.ndarray, position: np.ndarray,
                  temperature: np.ndarray | float, topk: np.ndarray | None = None,
                  lookup_len: np.ndarray | None = None, lookup_agree: np.ndarray | None = None,
                  hidden: np.ndarray | None = None) -> np.ndarray | None:
    """The predictor's inputs for ``n`` draft tokens, ``(n, F)`` float64 (unstandardised); ``None`` when a signal a
    group needs is absent.

    Args:
        groups: Signal groups (:data:`SIGNAL_GROUPS`), canonical order.
        conf, entropy, position: ``(n,)`` draft confidence, draft entropy (nats), completion position.
        temperature: Sampling temperature (scalar or ``(n,)``).
        topk, lookup_len, lookup_agree, hidden: The v2 signals (``(n, 8)``, ``(n,)``, ``(n,)``, ``(n, D)``).
    """
    conf = np.asarray(conf, dtype=np.float64)
    n = conf.shape[0]
    cols: list[np.ndarray] = []
    c = np.clip(conf, _EPS, 1.0 - _EPS)
    cols.append(np.clip(np.log(c) - np.log1p(-c), -_LOGIT_CLIP, _LOGIT_CLIP)[:, None])
    if "shape" in groups:
        if topk is None:
            return None
        tk = np.asarray(topk, dtype=np.float64)
        t1, t2 = tk[:, 0], tk[:, 1]
        ent = np.minimum(np.asarray(entropy, dtype=np.float64), _ENTROPY_SCALE) / _ENTROPY_SCALE
        ratio = np.log(np.maximum(t1, _EPS)) - np.log(np.maximum(t2, _EPS))
        cols.append(np.stack([ent, t2, t1 - t2, np.minimum(ratio, _LOGIT_CLIP), tk.sum(axis=1)], axis=1))
    if "position" in groups:
        temp = np.broadcast_to(np.asarray(temperature, dtype=np.float64), (n,))
        cols.append(np.stack([np.log1p(np.asarray(position, dtype=np.float64)) / _LOG_POS, temp], axis=1))
    if "lookup" in groups:
        if lookup_len is None or lookup_agree is None:
            return None
        ll = np.asarray(lookup_len, dtype=np.int64)
        ag = np.asarray(lookup_agree, dtype=np.float64)
        onehot = (ll[:, None] == np.arange(1, 5)[None, :]).astype(np.float64)
        cols.append(np.concatenate([onehot, ag[:, None], (ag * ll / 4.0)[:, None]], axis=1))
    if "hidden" in groups:
        if hidden is None:
            return None
        cols.append(np.asarray(hidden, dtype=np.float64).reshape(n, -1))
    return np.concatenate(cols, axis=1)


def design_row(groups: tuple[str, ...], conf: float, entropy: float, position: int, temperature: float,
               topk: Any = None, lookup_len: int | None = None, lookup_agree: bool | None = None,
               hidden: Any = None) -> list[float] | None:
    """One row of :func:`design_matrix` in plain Python floats: the deployment path (a draft step costs a few
    microseconds here against ~30 through numpy's per-call overhead). ``tests/test_predictor.py`` proves it equal to
    :func:`design_matrix` row by row; change both together."""
    row = [_logit(conf)]
    if "shape" in groups:
        if topk is None:
            return None
        row += [min(entropy, _ENTROPY_SCALE) / _ENTROPY_SCALE, *_shape([float(v) for v in topk])]
    if "position" in groups:
        row += [math.log1p(position) / _LOG_POS, float(temperature)]
    if "lookup" in groups:
        if lookup_len is None or lookup_agree is None:
            return None
        ll, ag = int(lookup_len), 1.0 if lookup_agree else 0.0
        row += [1.0 if ll == n else 0.0 for n in range(1, 5)] + [ag, ag * ll / 4.0]
    if "hidden" in groups:
        if hidden is None:
            return None
        row += [float(v) for v in hidden]
    return row


@dataclass(frozen=True)
class AcceptancePredictor:
    """A trained acceptance predictor (see the module docstring).

    Attributes:
        name: Short identifier, e.g. ``midpair``.
        groups: Signal groups it reads.
        kind: ``logistic`` or ``mlp``.
        mean, scale: Standardisation of each design-matrix column.
        layers: ``[(W, b), ...]``: ``logistic`` one ``(F, 1)`` layer; ``mlp`` ``(F, H)`` tanh then ``(H, 1)``.
        hidden_dim: Width of the hidden sketch it reads (0 without the ``hidden`` group).
        threshold: The marginal ratio above which its controller drafts on (``predicted:``), chosen on the
            validation split by :func:`specgym.training.predictor.tune_threshold`: the marginal rule is myopic (one
            more token also opens the way to the ones after it), and with a sharp predictor a ratio below 1 pays.
        version: :data:`PREDICTOR_VERSION` it was trained with.
        continuation: Per temperature group (``greedy``, ``sampled``), how its predictions follow each other on
            the train split (:class:`~specgym.envs.core.stopping_plan.ContinuationModel`): what the ``planned:``
            controller plans with. Empty for a predictor trained before they existed.
        meta: Provenance and measured figures (workload, pair, AUC...): does not change the function.
        fallback: A predictor on fewer signal groups, asked where a step lacks one of this predictor's signals
            (its threshold and continuation models are not used: the decisions are priced by this predictor's).
        drafter: Whose draft tokens it predicts (:data:`PREDICTOR_DRAFTERS`): the pair's draft model
            (``draft``, every older file) or the draft head (``head``: :func:`head_features`, ``predicted:NAME@head``).
    """

    name: str
    groups: tuple[str, ...]
    kind: str
    mean: np.ndarray
    scale: np.ndarray
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    hidden_dim: int = 0
    threshold: float = 1.0
    version: int = PREDICTOR_VERSION
    meta: dict[str, Any] | None = None
    continuation: dict[str, ContinuationModel] = field(default_factory=dict)
    fallback: AcceptancePredictor | None = None
    drafter: str = IMPLICIT_DRAFTER
    _first: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)
    _linear: tuple[list[float], float] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the standardisation folded into the first layer, for the one-row deployment path
        w0, b0 = self.layers[0]
        w = np.asarray(w0, dtype=np.float64) / np.asarray(self.scale, dtype=np.float64)[:, None]
        b = np.asarray(b0, dtype=np.float64) - np.asarray(self.mean, dtype=np.float64) @ w
        object.__setattr__(self, "_first", (w, b))
        object.__setattr__(self, "_linear", (w[:, 0].tolist(), float(b[0])) if len(self.layers) == 1 else None)

    @property
    def columns(self) -> list[str]:
        """Design-matrix column names."""
        return group_columns(self.groups, self.hidden_dim, self.drafter)

    @property
    def on_head(self) -> bool:
        """True for a predictor of the draft head's tokens."""
        return self.drafter == HEAD_DRAFTER

    def predict_matrix(self, x: np.ndarray) -> np.ndarray:
        """Acceptance probabilities of unstandardised design rows ``x`` ``(n, F)``."""
        h = (np.asarray(x, dtype=np.float64) - self.mean) / self.scale
        for i, (w, b) in enumerate(self.layers):
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.tanh(h)
        z = np.clip(h[:, 0], -30.0, 30.0)
        return 1.0 / (1.0 + np.exp(-z))

    def predict_step(self, step: DraftStep, temperature: float) -> float | None:
        """P(the draft token of ``step`` is accepted), or ``None`` when the step lacks a signal this predictor reads
        (a head predictor reads ``step.drafter_topk``)."""
        sig = step.signals
        if self.drafter == HEAD_DRAFTER:
            row = head_features(self.groups, step.drafter_topk, step.position, step.index)
        elif sig is None:
            row = design_row(self.groups, step.conf, step.entropy, step.position, temperature)
        else:
            cols, last = sig.columns, sig.stop - 1
            row = design_row(self.groups, step.conf, step.entropy, step.position, temperature,
                             None if cols.topk is None else cols.topk[last].tolist(),
                             None if cols.lookup_len is None else int(cols.lookup_len[last]),
                             None if cols.lookup_agree is None else bool(cols.lookup_agree[last]),
                             None if cols.hidden_sketch is None else cols.hidden_sketch[last].tolist())
        if row is None or len(row) != len(self.mean):
            return None if self.fallback is None else self.fallback.predict_step(step, temperature)
        if self._linear is not None:
            weights, bias = self._linear
            z = bias + sum(wi * xi for wi, xi in zip(weights, row))
        else:
            w1, b1 = self._first
            h = np.tanh(np.asarray(row) @ w1 + b1)
            for i, (w, bb) in enumerate(self.layers[1:], start=1):
                h = h @ w + bb
                if i < len(self.layers) - 1:
                    h = np.tanh(h)
            z = float(h[0])
        return 1.0 / (1.0 + math.exp(-min(max(z, -30.0), 30.0)))

    # ------------------------------------------------------------------------------------- compatibility
    @property
    def pair(self) -> tuple[str | None, str | None]:
        """``(draft, target)`` it was trained on, as its metadata names them (None where not recorded)."""
        meta = self.meta or {}
        return _model_name(meta.get("pair_draft")), _model_name(meta.get("pair_target"))

    def chain(self) -> list[AcceptancePredictor]:
        """This predictor, then its fallbacks, in the order they are asked."""
        out: list[AcceptancePredictor] = []
        pred: AcceptancePredictor | None = self
        while pred is not None:
            out.append(pred)
            pred = pred.fallback
        return out

    def for_source(self, src: SignalSource, strict: bool = False) -> tuple[AcceptancePredictor | None, str | None]:
        """The predictor of :meth:`chain` that ``src`` can feed, and a one-line note when it is not this one.

        Returns ``(predictor, note)``; ``predictor`` is None where no model of the chain fits (the controller then
        estimates acceptance from calibrated confidence). See *Compatibility* in the module docstring.

        Raises:
            SpecgymError: ``src`` comes from another pair; with ``strict``, anything but this predictor fitting.
        """
        draft, target = self.pair
        if self.drafter == HEAD_DRAFTER:  # the head drafts from the target's features: its pair is the target
            draft = None
        for mine, theirs, role in ((target, src.target, "target"), (draft, src.draft, "draft")):
            if not same_model(mine, theirs):
                raise SpecgymError(
                    f"predictor {self.name!r} was trained on the {role} model {mine}, {src.where} comes from "
                    f"{theirs}: its probabilities are another model's (train one on this pair: specgym predictor "
                    f"train --workload W --out P.json)")
            mine_sig = (self.meta or {}).get(f"{role}_signature") or signature_of(mine, src.model_roots)
            theirs_sig = src.signature(role)
            if mine_sig and theirs_sig and any(mine_sig.get(k) is not None and theirs_sig.get(k) is not None
                                               and mine_sig[k] != theirs_sig[k] for k in mine_sig):
                raise SpecgymError(
                    f"predictor {self.name!r} was trained on the {role} model {mine} ({_describe(mine_sig)}), "
                    f"{src.where} comes from a {_describe(theirs_sig)} model: its probabilities and hidden sketch "
                    f"are another model's (train one on this pair: specgym predictor train --workload W --out P.json)")
        why = self._missing(src)
        if why is None:
            return self, None
        if strict:
            raise SpecgymError(f"predictor {self.name!r} reads {', '.join(self.groups)}, but {src.where} {why}")
        for pred in self.chain()[1:]:
            if pred._missing(src) is None:
                return pred, (f"predictor {self.name!r}: {src.where} {why}; its fallback on "
                              f"{', '.join(pred.groups)} predicts instead")
        return None, (f"predictor {self.name!r}: {src.where} {why}, and no fallback of it fits; acceptance is "
                      f"estimated from calibrated confidence (as marginal does)")

    def _missing(self, src: SignalSource) -> str | None:
        """Why ``src`` cannot feed this predictor alone (None: it can). A head predictor reads the head's top-8,
        which a request carries exactly where it carries the head's confidence: checked per request, by the chain
        rule on the head (:class:`~specgym.baselines.drafter_chain.ChainOnDrafter`), as for ``confidence:T@head``."""
        if self.drafter == HEAD_DRAFTER:
            return None
        lacking = [g for g in self.groups if g not in src.groups]
        if lacking:
            cols = [c for g in lacking for c in GROUP_SIGNALS[g]]
            return f"lacks the signal(s) {', '.join(cols)} (group {', '.join(lacking)})"
        if "hidden" not in self.groups:
            return None
        have = src.sketch or {}
        if int(have.get("dim", -1)) != self.hidden_dim:
            return f"has a {have.get('dim')}-dimensional hidden sketch, this predictor reads {self.hidden_dim}"
        want = (self.meta or {}).get("hidden_sketch")
        if isinstance(want, dict):
            for key in ("hidden_size", "sha256"):
                if want.get(key) is not None and have.get(key) is not None and want[key] != have[key]:
                    return (f"has another hidden sketch ({key} {have[key]}, the predictor was trained on "
                            f"{want[key]}: another model or projection)")
        return None

    # ------------------------------------------------------------------------------------------ artifact
    def to_dict(self) -> dict[str, Any]:
        """The JSON form; ``sha256`` covers every field that changes the function (not ``meta``)."""
        body = self._function_fields()
        return {**body, "name": self.name, "meta": self.meta or {}, "sha256": _digest(body)}

    def _function_fields(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "format": "specgym-acceptance-predictor", "version": int(self.version), "groups": list(self.groups),
            "kind": self.kind, "hidden_dim": int(self.hidden_dim), "threshold": float(self.threshold),
            "columns": self.columns,
            "mean": [float(v) for v in self.mean], "scale": [float(v) for v in self.scale],
            "layers": [{"w": np.asarray(w, dtype=np.float64).tolist(), "b": np.asarray(b, dtype=np.float64)
                        .tolist()} for w, b in self.layers]}
        if self.continuation:  # absent from older artifacts, whose checksum stays valid
            body["continuation"] = {g: m.to_dict() for g, m in sorted(self.continuation.items())}
        if self.fallback is not None:
            body["fallback"] = self.fallback.to_dict()
        if self.drafter != IMPLICIT_DRAFTER:  # absent from older artifacts (the draft model's), whose checksum stays
            body["drafter"] = self.drafter
        return body

    @classmethod
    def from_dict(cls, d: Any, where: str = "<predictor>") -> AcceptancePredictor:
        """Build and validate; a tampered or mismatched artifact raises one line naming ``where`` and the field."""
        if not isinstance(d, dict) or d.get("format") != "specgym-acceptance-predictor":
            raise SpecgymError(f"{where}: not a specgym acceptance predictor (field 'format')")
        version = d.get("version")
        if version != PREDICTOR_VERSION:
            raise SpecgymError(f"{where}: predictor version {version!r}, this specgym reads version "
                               f"{PREDICTOR_VERSION}: retrain it with specgym predictor train")
        drafter = d.get("drafter", IMPLICIT_DRAFTER)
        if drafter not in PREDICTOR_DRAFTERS:
            raise SpecgymError(f"{where}: field 'drafter' must be one of {PREDICTOR_DRAFTERS}, got {drafter!r}")
        try:
            groups = check_groups(list(d["groups"]), f"{where}: field 'groups'", drafter)
            kind = str(d["kind"])
            hidden_dim = int(d["hidden_dim"])
            threshold = float(d["threshold"])
            mean = np.asarray(d["mean"], dtype=np.float64)
            scale = np.asarray(d["scale"], dtype=np.float64)
            layers = tuple((np.asarray(layer["w"], dtype=np.float64), np.asarray(layer["b"], dtype=np.float64))
                           for layer in d["layers"])
            raw_cont = d.get("continuation") or {}
            if not isinstance(raw_cont, dict) or not set(raw_cont) <= {"greedy", "sampled"}:
                raise ValueError("field 'continuation' must map 'greedy'/'sampled' to models")
            continuation = {str(g): ContinuationModel.from_dict(m, f"{where}: field 'continuation.{g}'")
                            for g, m in raw_cont.items()}
            fallback = None if d.get("fallback") is None else \
                AcceptancePredictor.from_dict(d["fallback"], f"{where}: field 'fallback'")
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecgymError(f"{where}: malformed predictor ({exc})") from None
        if kind not in MODEL_KINDS:
            raise SpecgymError(f"{where}: field 'kind' must be one of {MODEL_KINDS}, got {kind!r}")
        if not 0.0 < threshold <= 10.0:
            raise SpecgymError(f"{where}: field 'threshold' must be in (0, 10], got {threshold!r}")
        pred = cls(str(d.get("name", "predictor")), groups, kind, mean, scale, layers, hidden_dim, threshold,
                   version, d.get("meta") or {}, continuation, fallback, drafter)
        if d.get("columns") != pred.columns:
            raise SpecgymError(f"{where}: field 'columns' does not match groups {list(groups)} (signal list "
                               f"mismatch)")
        f = len(pred.columns)
        width = f
        for i, (w, b) in enumerate(layers):
            if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
                raise SpecgymError(f"{where}: field 'layers[{i}]' has shape {w.shape}/{b.shape}, expected "
                                   f"({width}, H)/(H,)")
            width = w.shape[1]
        if width != 1 or mean.shape != (f,) or scale.shape != (f,) or not np.all(scale > 0):
            raise SpecgymError(f"{where}: fields 'mean'/'scale'/'layers' do not fit {f} columns")
        if d.get("sha256") != _digest(pred._function_fields()):
            raise SpecgymError(f"{where}: checksum mismatch (field 'sha256'): the file was edited or damaged")
        return pred


def bind_signals(named: Any, src: SignalSource) -> list[str]:
    """Fit every predictor-reading controller of ``named`` (``(label, controller)`` pairs or controllers) to ``src``
    (their ``bind_signals`` method: :meth:`AcceptancePredictor.for_source`); returns the notes, one line per
    distinct note, naming the controllers it concerns."""
    notes: dict[str, list[str]] = {}
    for item in named:
        label, ctrl = item if isinstance(item, tuple) else (getattr(item, "name", "?"), item)
        bind = getattr(ctrl, "bind_signals", None)
        note = bind(src) if bind is not None else None
        if note:
            notes.setdefault(note, []).append(str(label))
    return [f"{', '.join(labels)}: {note}" for note, labels in notes.items()]


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def save_predictor(pred: AcceptancePredictor, path: str | Path, overwrite: bool = False) -> Path:
    """Write ``pred`` as JSON atomically."""
    return atomic_write_text(Path(path), json.dumps(pred.to_dict(), indent=1) + "\n", overwrite=overwrite)


_LOADED: dict[tuple[str, int, int], AcceptancePredictor] = {}


def load_draft_predictor(path: str | Path, rule: str) -> AcceptancePredictor:
    """:func:`load_predictor` for a rule that reads the draft model's tokens (``planned``, ``tree-predicted``).

    Raises:
        SpecgymError: The file predicts the draft head's tokens (one line naming the rule, the file and the rule that
            runs it: ``predicted:FILE@head``).
    """
    pred = load_predictor(path)
    if pred.on_head:
        raise SpecgymError(f"{rule}: predictor {path} predicts the draft head's tokens (trained with --drafter head), "
                           f"which {rule.split(':')[0]} does not serve; it runs as predicted:{path}@head")
    return pred


def load_predictor(path: str | Path) -> AcceptancePredictor:
    """Read a predictor JSON file (pickle-free); defects raise one line naming the file.

    A file is read once per process (keyed by its resolved path, modification time and size): every controller,
    env and catalogue look-up of one evaluation shares the same predictor object, which nothing mutates.
    """
    p = Path(path)
    if not p.is_file():
        raise SpecgymError(f"{p}: acceptance predictor file not found")
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    pred = _LOADED.get(key)
    if pred is None:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SpecgymError(f"{p}: not valid JSON ({exc})") from None
        pred = _LOADED[key] = AcceptancePredictor.from_dict(data, where=str(p))
    return pred


def workload_predictions(pred: AcceptancePredictor, wl: Any, model_roots: tuple[Path, ...] = ()) -> np.ndarray:
    """The predictor's acceptance probability at every position of ``wl`` (flat, the workload's layout), from the
    trace's recorded draft signals (the model of its fallback chain that the workload can feed).

    Raises:
        SpecgymError: ``wl`` comes from another pair, or no model of the chain fits its signals.
    """
    if pred.on_head:
        raise SpecgymError(f"predictor {pred.name!r} predicts the draft head's tokens, not the draft model's positions "
                           f"of workload {wl.name!r}: use it as predicted:{pred.name}@head")
    use, _ = pred.for_source(SignalSource.of_workload(wl, model_roots))
    if use is None:
        raise SpecgymError(f"predictor {pred.name!r}: workload {wl.name!r} lacks the signals of every model of its "
                           f"chain")
    n = int(wl.offsets[-1])
    reqs = np.repeat(np.arange(len(wl.offsets) - 1), np.diff(wl.offsets))
    position = np.arange(n) - np.asarray(wl.offsets)[reqs]
    x = design_matrix(use.groups, wl.require("draft_conf", "the predictor"), wl.require("draft_entropy",
                      "the predictor"), position, np.asarray(wl.temperature, dtype=np.float64)[reqs],
                      getattr(wl, "draft_topk", None), getattr(wl, "lookup_len", None),
                      getattr(wl, "lookup_agree", None), getattr(wl, "hidden_sketch", None))
    if x is None:
        raise SpecgymError(f"predictor {use.name!r}: workload {wl.name!r} lacks a signal it reads")
    return use.predict_matrix(x)

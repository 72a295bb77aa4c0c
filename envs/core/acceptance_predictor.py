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

Every column is standardised with the training set's mean and scale (stored). **Models**: ``logistic`` (one
linear layer) or ``mlp`` (one tanh hidden layer), chosen by validation log loss.

**Degrading**: a predictor needs its groups' signals; where a step lacks one (a synthetic trace, a v1 trace, an
engine without lookups) it asks its **fallback**, a predictor of the same probability on fewer groups (the shipped
midpair predictor reads the draft's hidden sketch, which transformers' ``generate()`` hook cannot give, and falls back
to the one without it); where no model has its signals :meth:`AcceptancePredictor.predict_step` returns ``None`` and
the controller falls back to calibrated confidence. Bump :data:`PREDICTOR_VERSION` when any input's meaning or
scaling changes.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.core.rounds import DraftStep
from specgym.envs.core.stopping_plan import ContinuationModel
from specgym.errors import SpecgymError
from specgym.io import atomic_write_text

PREDICTOR_VERSION = 1
SIGNAL_GROUPS = ("conf", "shape", "position", "lookup", "hidden")
MODEL_KINDS = ("logistic", "mlp")
_LOGIT_CLIP = 12.0
_ENTROPY_SCALE = 8.0
_LOG_POS = math.log1p(4096.0)
_EPS = 1e-6


def group_columns(groups: tuple[str, ...], hidden_dim: int = 0) -> list[str]:
    """Names of the design-matrix columns of ``groups``, in order."""
    names: list[str] = []
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


def check_groups(groups: tuple[str, ...] | list[str], where: str = "groups") -> tuple[str, ...]:
    """Validated groups in canonical order (``conf`` always included)."""
    unknown = [g for g in groups if g not in SIGNAL_GROUPS]
    if unknown:
        raise SpecgymError(f"{where}: unknown signal group(s) {unknown}; choose from {', '.join(SIGNAL_GROUPS)}")
    return tuple(g for g in SIGNAL_GROUPS if g in set(groups) | {"conf"})


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
    c = min(max(conf, _EPS), 1.0 - _EPS)
    row = [min(max(math.log(c) - math.log1p(-c), -_LOGIT_CLIP), _LOGIT_CLIP)]
    if "shape" in groups:
        if topk is None:
            return None
        tk = [float(v) for v in topk]
        t1, t2 = tk[0], tk[1]
        ratio = math.log(max(t1, _EPS)) - math.log(max(t2, _EPS))
        row += [min(entropy, _ENTROPY_SCALE) / _ENTROPY_SCALE, t2, t1 - t2, min(ratio, _LOGIT_CLIP), math.fsum(tk)]
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
        return group_columns(self.groups, self.hidden_dim)

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
        """P(the draft token of ``step`` is accepted), or ``None`` when the step lacks a signal this predictor reads."""
        sig = step.signals
        if sig is None:
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
        try:
            groups = check_groups(list(d["groups"]), f"{where}: field 'groups'")
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
                   version, d.get("meta") or {}, continuation, fallback)
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


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def save_predictor(pred: AcceptancePredictor, path: str | Path, overwrite: bool = False) -> Path:
    """Write ``pred`` as JSON atomically."""
    return atomic_write_text(Path(path), json.dumps(pred.to_dict(), indent=1) + "\n", overwrite=overwrite)


_LOADED: dict[tuple[str, int, int], AcceptancePredictor] = {}


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

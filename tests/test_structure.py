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
#: layers, lowest first: a module may import only from its own layer or lower ones (lazy imports included)
LAYERS = [
    ("foundation", ("specgym.errors", "specgym.io", "specgym.paths", "specgym.deps", "specgym.console",
                    "specgym.version")),
    ("core", ("specgym.envs.core",)),
    ("data", ("specgym.envs.workloads",)),
    ("engines", ("specgym.envs.engines",)),
    ("controllers", ("specgym.baselines", "specgym.agents")),
    ("envs/eval/training", ("specgym.envs.gym", "specgym.eval", "specgym.training")),
    ("benchmarks", ("specgym.eval.bench",)),
    ("cli", ("specgym.commands", "specgym.cli", "specgym.__main__")),
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
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best


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


def test_dependencies_point_one_way():
    modules = _modules()
    bad = []
    for mod, path in modules.items():
        if mod == "specgym":  # the front door re-exports the public API from the layers below
            continue
        for imp in _imports(path, mod, top_level_only=False):
            target = imp if imp in modules else imp.rsplit(".", 1)[0]
            if target not in modules or target == "specgym":
                continue
            if _layer(target) > _layer(mod):
                bad.append(f"{mod} ({LAYERS[_layer(mod)][0]}) imports {target} ({LAYERS[_layer(target)][0]})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles_at_module_level():
    modules = _modules()
    graph = {m: set() for m in modules}
    for mod, path in modules.items():
        for imp in _imports(path, mod, top_level_only=True):
            target = imp if imp in modules else imp.rsplit(".", 1)[0]
            if target in modules and target != mod and target != "specgym":
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


def test_ppo_spec_resolves_without_importing_agents_first(tmp_path):
    """``make_controller('ppo:DIR')`` works in a fresh interpreter that never imported specgym.agents."""
    from specgym.agents.policy_controller import random_artifact, write_artifact

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

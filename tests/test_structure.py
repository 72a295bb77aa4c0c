"""The package's structure: one-way dependencies between layers, no import cycles, no library code importing the CLI,
every module importable on its own in a fresh interpreter, imports at the module top unless a function-level import
saves start-up time (a heavy module), and a start-up that loads no heavy module."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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
    ("profiles", ("specgym.envs.profiles",)),
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
    ("specgym.envs.gym", "specgym.envs.engines.live.recorder", "the prompts file is envs.workloads.prompts"),
    ("specgym.envs.core", "specgym.paths", "the core reads no data catalogue: callers pass paths and objects in "
     "(SignalSource.model_roots, envs.profiles)"),
    ("specgym.envs.core", "specgym.catalogue", "the core reads no data catalogue: shipped names resolve above it "
     "(envs.profiles.load_profile)"),
    # the engines split by what they depend on: replay (numpy) < live (torch) < serving (vLLM)
    ("specgym.envs.engines.replay", "specgym.envs.engines.live", "replay is numpy only: live engines need torch"),
    ("specgym.envs.engines.replay", "specgym.envs.engines.serving", "replay is numpy only: serving needs vLLM"),
    ("specgym.envs.engines.live", "specgym.envs.engines.serving", "live engines run without vLLM's environment"),
]
#: The engine subpackages and the third-party modules each may never import, at any depth (lazy imports included).
ENGINE_DEPENDENCIES = {
    "specgym.envs.engines.replay": ("torch", "transformers", "tokenizers", "safetensors", "ray", "vllm"),
    "specgym.envs.engines.live": ("vllm",),
}


#: Third-party modules that cost start-up time (0.2-3.4 s each to import): the only reason to import inside a function.
HEAVY = ("torch", "transformers", "tokenizers", "stable_baselines3", "matplotlib", "ray", "pyarrow", "scipy", "vllm")
#: What ``import specgym``, ``specgym --help`` and ``specgym eval`` on replay never load.
NEVER_AT_START = ("torch", "transformers", "stable_baselines3", "matplotlib", "ray", "vllm")
#: Function-level imports of light modules that stay: ``(importer, imported module) -> why``. Aim: none.
LAZY_ALLOWED: dict[tuple[str, str], str] = {
    ("specgym.envs.engines.live.model_cache", "safetensors.numpy"): "safetensors comes with the hf extra, and "
    "model_cache is imported wherever a model is resolved",
    ("specgym.training.models.draft_build", "safetensors.torch"): "imports torch",
    ("specgym.training.models.head_build", "safetensors.torch"): "imports torch",
    ("specgym.envs.engines.live.draft_head", "safetensors.torch"): "imports torch (draft_head is imported wherever a "
    "pair is loaded)",
}


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


def _runs_at_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements a module runs when it is imported: its top level, including ``if``/``try`` blocks and
    class bodies, but not function bodies and not ``if TYPE_CHECKING:`` blocks (which never run)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def walk(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, (ast.Import, ast.ImportFrom)):
                out.append(s)
            elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            elif isinstance(s, ast.If) and ast.unparse(s.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                walk(s.orelse)
            else:  # if/try/with/for/match blocks and class bodies run at import
                for child in ast.iter_child_nodes(s):
                    if isinstance(child, ast.stmt):
                        walk([child])
                    elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                        walk(child.body)

    walk(tree.body)
    return out


def _function_level(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements inside a function or method (at any depth), in line order."""
    out: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.update(n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return sorted(out, key=lambda n: (n.lineno, n.col_offset))  # type: ignore[attr-defined]


def _targets(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The modules an import statement loads: ``import a.b`` -> ``a.b``; ``from a import b`` -> ``a``, and ``a.b``
    too where that is a package module."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level or not node.module:
        return []
    return [node.module] + [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]


def _heavy_modules(modules: dict[str, Path]) -> set[str]:
    """Package modules that import a :data:`HEAVY` module when imported: directly at their top level, or through the
    top-level imports of other package modules (their parent packages included, the front door excepted: it is
    loaded by every import of a package module anyway)."""
    deps: dict[str, set[str]] = {}
    heavy = set()
    for mod, path in modules.items():
        deps[mod] = set()
        for node in _runs_at_import(ast.parse(path.read_text())):
            for target in _targets(node, modules):
                if target.split(".")[0] in HEAVY:
                    heavy.add(mod)
                parts = target.split(".")
                deps[mod].update(p for p in (".".join(parts[:i]) for i in range(2, len(parts) + 1))
                                 if p in modules and p != mod)
    changed = True
    while changed:
        changed = False
        for mod in modules:
            if mod not in heavy and deps[mod] & heavy:
                heavy.add(mod)
                changed = True
    return heavy


def _lazy_imports(modules: dict[str, Path]) -> list[tuple[str, int, str]]:
    """``(module, line, imported module)`` for every function-level import that buys no start-up time: its target
    is neither :data:`HEAVY` nor a heavy package module (:func:`_heavy_modules`)."""
    heavy = _heavy_modules(modules)
    out = []
    for mod, path in modules.items():
        for node in _function_level(ast.parse(path.read_text())):
            targets = _targets(node, modules)
            if isinstance(node, ast.ImportFrom):
                if any(t.split(".")[0] in HEAVY or t in heavy for t in targets):
                    continue
                out.append((mod, node.lineno, targets[0] if targets else f"{'.' * node.level}{node.module or ''}"))
            else:  # ``import a, b``: each name on its own
                out += [(mod, node.lineno, t) for t in targets if t.split(".")[0] not in HEAVY and t not in heavy]
    return out


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


def _third_party_imports(path: Path) -> set[str]:
    """The top-level names of every third-party import in a file, at any depth (function bodies included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_engines_split_by_dependency():
    """``envs/engines/`` holds only its three subpackages (replay, live, serving), and each imports only what its
    name allows: replay no model library, live no vLLM."""
    loose = sorted(p.name for p in (ROOT / "envs" / "engines").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"engine modules outside replay/, live/, serving/: {loose}"
    bad = [f"{mod} imports {lib}" for mod, path in _modules().items() for prefix, banned in ENGINE_DEPENDENCIES.items()
           if mod.startswith(prefix) for lib in sorted(_third_party_imports(path) & set(banned))]
    assert not bad, "\n".join(bad)


def test_the_layer_test_catches_an_upward_edge(tmp_path):
    """The checks above see lazy imports and the front door: a sample of edges that must count as upward."""
    assert _layer("specgym.baselines.fixed") < _layer("specgym.agents.specs")
    assert _layer("specgym.eval.bench.policy") < _layer("specgym.training.config")
    assert _layer("specgym.eval.harness") < _layer(FRONT_DOOR)
    assert _layer("specgym.envs.core.replay") < _layer("specgym.envs.engines.replay.trace_engine")
    assert _layer("specgym.envs.core.cost") < _layer("specgym.envs.profiles") < _layer("specgym.envs.workloads.x")
    tree = "def f():\n    from specgym.agents.specs import make\n"
    path = tmp_path / "probe.py"
    path.write_text(tree)
    assert "specgym.agents.specs" in _imports(path, "x", top_level_only=False)
    assert "specgym.agents.specs" not in _imports(path, "x", top_level_only=True)


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
    """Each module imports in an interpreter of its own (no import leans on another module imported before it);
    the interpreters run one per core."""
    mods = [m for m in _modules() if not m.endswith("__main__")]

    def failure(mod: str) -> str | None:
        r = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True, cwd="/",
                           timeout=300)
        if not r.returncode:
            return None
        return f"{mod}: {(r.stderr.strip().splitlines() or ['exit ' + str(r.returncode)])[-1]}"

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        bad = [f for f in pool.map(failure, mods) if f]
    assert not bad, "\n".join(bad)


def test_function_level_imports_only_for_heavy_modules():
    """An import inside a function is allowed only when it buys start-up time: a :data:`HEAVY` module, or a package
    module that imports one at its top level (directly or through other package modules); everything else is
    imported at the module top. A lazy import that dodges a cycle means a function or constant is in the wrong
    module: move it instead (the allow list is for what cannot move yet, with the reason)."""
    found = _lazy_imports(_modules())
    bad = [f"{mod}:{line} imports {target}" for mod, line, target in found if (mod, target) not in LAZY_ALLOWED]
    assert not bad, "function-level imports of light modules (move them to the module top):\n" + "\n".join(bad)
    stale = sorted(set(LAZY_ALLOWED) - {(mod, target) for mod, _, target in found})
    assert not stale, f"LAZY_ALLOWED entries no module needs any more (remove them): {stale}"


def test_the_lazy_import_check_catches_a_light_import(tmp_path):
    """The check flags a function-level ``import json`` and a lazy import of a light package module; it accepts
    ``import torch``, a heavy package module (directly or by transitivity) and ``TYPE_CHECKING`` blocks."""
    files = {
        "specgym.probe_heavy": "import torch\n",
        "specgym.probe_via": "from specgym.probe_heavy import x\n",
        "specgym.probe_typing": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
        "specgym.probe": ("from typing import TYPE_CHECKING\n"
                          "if TYPE_CHECKING:\n    import numpy\n"
                          "def f():\n    import json\n"
                          "def g():\n    import torch.nn as nn\n    from transformers import AutoTokenizer\n"
                          "class C:\n    def m(self):\n        from specgym.probe_via import x\n"
                          "def h():\n    from specgym.probe_typing import y\n"
                          "    from specgym.io import read_text\n"
                          "def outer():\n    def inner():\n        import os, scipy\n"),
    }
    modules = dict(_modules())
    for mod, text in files.items():
        path = tmp_path / f"{mod}.py"
        path.write_text(text)
        modules[mod] = path
    heavy = _heavy_modules(modules)
    assert {"specgym.probe_heavy", "specgym.probe_via"} <= heavy
    assert "specgym.probe_typing" not in heavy and "specgym.probe" not in heavy
    assert {"specgym.agents.hf_generate", "specgym.eval.plots", "specgym.training.callbacks"} <= heavy
    assert "specgym.envs.workloads.trace_format" not in heavy  # pyarrow is imported inside its functions
    found = [(line, target) for mod, line, target in _lazy_imports(modules) if mod == "specgym.probe"]
    assert found == [(5, "json"), (13, "specgym.probe_typing"), (14, "specgym.io"), (17, "os")]


_STARTUP_PROBE = """
import contextlib, importlib, io, json, sys

def heavy():
    return sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})

seen = {{}}
import specgym
seen["import specgym"] = heavy()
import specgym.cli
with contextlib.redirect_stdout(io.StringIO()) as out:
    rc = specgym.cli.main(["--help"])
assert rc == 0 and "COMMAND" in out.getvalue(), (rc, out.getvalue())
seen["specgym --help"] = heavy()
for name in sys.argv[1:]:
    importlib.import_module(name)
seen["every light command module"] = heavy()
print(json.dumps(seen))
"""


def test_startup_loads_no_heavy_module(tmp_path):
    """``import specgym``, ``specgym --help`` (every subcommand's parser) and importing every light command module
    (``specgym/commands/``, those not heavy by their top-level imports) load no :data:`HEAVY` module."""
    modules = _modules()
    heavy = _heavy_modules(modules)
    light_commands = sorted(m for m in modules if m.startswith("specgym.commands.") and m not in heavy)
    assert "specgym.commands.eval" in light_commands and "specgym.commands.train" in light_commands
    r = subprocess.run([sys.executable, "-c", _STARTUP_PROBE.format(heavy=set(HEAVY)), *light_commands],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert list(seen) == ["import specgym", "specgym --help", "every light command module"]
    assert all(v == [] for v in seen.values()), seen


_EVAL_PROBE = """
import contextlib, io, json, sys
from specgym.cli import main

with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["eval", "--workload", "midpair-greedy", "--controllers",
               "all,ppo:midpair-token,predicted:midpair,planned:midpair", "--max-requests", "5",
               "--bootstrap", "0", "--no-plots", "--out", sys.argv[1]])
print(json.dumps({{"rc": rc, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})}}))
"""


def _eval_on_replay(tmp_path: Path) -> list[str]:
    """The :data:`HEAVY` modules ``specgym eval`` loads on replay (every baseline, shipped PPO and predictor
    controllers, ``--no-plots``)."""
    r = subprocess.run([sys.executable, "-c", _EVAL_PROBE.format(heavy=set(HEAVY)), str(tmp_path / "report")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["rc"] == 0 and (tmp_path / "report" / "report.md").is_file()
    return out["loaded"]


def test_eval_on_replay_loads_no_model_library(tmp_path):
    """``specgym eval`` on replay (PPO policies and predictors included) runs without torch, transformers,
    stable-baselines3 or Ray (pyarrow reads the workload)."""
    loaded = _eval_on_replay(tmp_path)
    assert not [m for m in loaded if m.split(".")[0] in set(NEVER_AT_START) - {"matplotlib"}], loaded


def test_eval_without_plots_loads_no_matplotlib(tmp_path):
    """``specgym eval --no-plots`` needs no matplotlib."""
    assert not [m for m in _eval_on_replay(tmp_path) if m.split(".")[0] == "matplotlib"]


def test_ppo_spec_resolves_in_a_fresh_interpreter(tmp_path):
    """``make('ppo:DIR')`` works in a fresh interpreter that imported only the spec table."""
    from specgym.agents.artifact import random_artifact, write_artifact

    write_artifact(random_artifact("k"), tmp_path / "pol")
    code = (f"from specgym.agents.specs import make\n"
            f"c = make('ppo:{tmp_path / 'pol'}', 8)\n"
            f"d = make('{tmp_path / 'pol'}', 8)\n"
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
                 + sorted((ROOT / "docs").rglob("*.md")) + shipped_text):
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


#: The names of "what is decided" (decision kinds, policy modes, decision levels: envs/core/kinds.py).
DECISION_NAMES = frozenset({"chain", "tree", "batch", "drafter", "token", "alloc", "k"})
#: At most this many library lines may compare a value with one of :data:`DECISION_NAMES` outside the kind table
#: (issue 42's target). The lines it counts today are not branches on the kind, and stay counted so that the figure is
#: the plain pattern's: ``agents/traits.py`` (``m == "tree"``: a missing *signal*, the ranks a tree needs) and
#: ``training/callbacks.py`` (``"batch" in info and "k" in info``: the keys of a step's info dict).
KIND_BRANCH_LIMIT = 3


def _names_a_decision(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in DECISION_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_decision(e) for e in node.elts)
    return False


def _kind_branches(files: dict[str, Path]) -> list[str]:
    """``module:line`` of every line outside ``envs/core/kinds.py`` that compares a value with a decision name: a
    comparison (``==``, ``!=``, ``in``, ``not in``) with a string literal of :data:`DECISION_NAMES` (or a tuple, list
    or set holding one) on either side, or a ``case "tree":`` of a match statement. Iterating over names
    (``for mode in ...``) and looking a name up (``KIND_ROWS[kind]``) are not branches."""
    hits = set()
    for mod, path in files.items():
        if mod == "specgym.envs.core.kinds":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Compare)
                    and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops)
                    and any(_names_a_decision(x) for x in (node.left, *node.comparators))):
                hits.add(f"{mod}:{node.lineno}")
            elif (isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue)
                  and _names_a_decision(node.pattern.value)):
                hits.add(f"{mod}:{node.pattern.lineno}")
    return sorted(hits)


def test_code_asks_the_kind_table_not_the_kind_name():
    """Branches on the decision kind live in its row (``KIND_ROWS``, ``MODES``): at most :data:`KIND_BRANCH_LIMIT`
    library lines compare a kind, mode or level with its name (23 on main before the kind rows; 0 of those are left)."""
    hits = _kind_branches(_modules())
    assert len(hits) <= KIND_BRANCH_LIMIT, f"{len(hits)} lines branch on a decision name (ask kind_row(...)): {hits}"


def test_the_kind_branch_count_catches_a_branch(tmp_path):
    """The count sees the forms a kind branch takes."""
    src = tmp_path / "m.py"
    src.write_text('def f(row, mode, kind):\n    if row.kind == "tree":\n        pass\n'
                   '    x = 1 if mode in ("k", "token") else 2\n'
                   '    match kind:\n        case "drafter":\n            pass\n'
                   '    for m in ("k", "token"):\n        pass\n    return {"batch": 1}[kind]\n')
    assert _kind_branches({"m": src}) == ["m:2", "m:4", "m:6"]


def test_no_spec_prefix_read_as_its_type():
    """Code asks a resolved spec's row, never its prefix: no ``spec.startswith("fixed:")`` on a controller-spec
    prefix outside the kind table (the vLLM bench's policy labels are not specs: ``policy_family``)."""
    from specgym.agents.specs import TABLE

    prefixes = {prefix for _, prefix in TABLE}
    assert {"fixed", "ppo", "tree-ppo", "predicted"} <= prefixes
    hits = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "startswith" and node.args):
                arg = node.args[0]
                values = arg.elts if isinstance(arg, ast.Tuple) else [arg]
                if any(isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.rstrip(":-@") in prefixes
                       for v in values):
                    hits.append(f"{mod}:{node.lineno}")
    assert not hits, f"a spec's prefix read as its type (ask row_of(spec)): {hits}"


def test_every_kind_row_names_a_replay_runner_that_imports():
    """The harness imports each kind's runner by the name its row gives (the core names it without importing
    upward); a kind with a runner is exactly what ``specgym eval`` runs."""
    from specgym.envs.core.kinds import EVAL_KINDS, KIND_ROWS
    from specgym.eval.harness import replay_runner

    for name, row in KIND_ROWS.items():
        runner = replay_runner(name)
        assert (runner is not None) == bool(row.replay_runner) == (name in EVAL_KINDS), name
        assert runner is None or callable(runner)


def test_every_kind_row_names_a_live_runner_that_imports():
    """``specgym generate`` and the live bench run a controller by its kind's live runner, imported by the name its
    row gives; a kind with one is exactly what they run (the batch kind decides serving steps: ``specgym tune``)."""
    from specgym.envs.core.kinds import KIND_ROWS, LIVE_KINDS
    from specgym.envs.engines.live.runners import live_runner

    for name, row in KIND_ROWS.items():
        runner = live_runner(name)
        assert (runner is not None) == bool(row.live_runner) == (name in LIVE_KINDS), name
        assert runner is None or callable(runner)
    assert set(LIVE_KINDS) == {"chain", "tree", "drafter"}


def test_every_controller_interface_prepares_the_same_way():
    """One ``prepare(workload, profile)`` on every controller interface (a no-op unless a controller fits itself),
    so runners never ask whether a controller has one."""
    from specgym.agents.specs import build
    from specgym.envs.core.batch import BatchController
    from specgym.envs.core.controller import Controller, Prepared, fits_itself
    from specgym.envs.core.drafter_choice import DrafterController
    from specgym.envs.core.tree import TreeController

    for base in (Controller, TreeController, BatchController, DrafterController):
        assert issubclass(base, Prepared) and base.prepare is Prepared.prepare, base
    assert not fits_itself(build("fixed:4").controller) and not fits_itself(build("fixed:3@ngram").controller)
    assert fits_itself(build("drafter-marginal").controller) and fits_itself(build("tree-sequoia").controller)
    assert build("goodput", kinds=("batch",)).controller.prepare(None, None) == []
    for module, path in _modules().items():  # no runner asks whether a controller has one
        text = path.read_text()
        assert not any(f'{f}({x}, "prepare"' in text for f in ("getattr", "hasattr") for x in ("ctrl", "inner")), module

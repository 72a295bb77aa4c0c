"""A new decision kind touches its row and its own module only (issue 57's target), and the guide says so.

The test adds a toy kind at run time the way the guide (``docs/guides/adding-a-decision-kind.md``) says a new kind is
added: one row in the kind table (``KIND_ROWS`` of ``envs/core/kinds.py``, patched in for the test) and one new
module, written to ``tmp_path``, holding its controller interface, its replay runner, its reference function and
its spec rows. Nothing else is patched: the toy kind is resolved, listed in ``all``, refused where it does not run,
told apart from other controllers by its interface, and run by ``specgym eval`` end to end. Every change goes through
:class:`Touch`, which records the file each change belongs to; the files recorded must be the guide's list.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

import specgym.agents.specs as specs
import specgym.envs.core.kinds as kinds
from specgym.cli import main
from specgym.errors import SpecgymError

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "adding-a-decision-kind.md"

#: The toy kind's own module: a request-level draft cap (one K for the whole request, chosen from the prompt
#: length), played on the chain replay engine by its runner.
TOY_MODULE = '''
"""A toy decision kind: one draft cap per request, chosen before decoding from the prompt length."""

from abc import ABC, abstractmethod

from specgym.agents.specs import register
from specgym.envs.core.controller import Controller, Prepared
from specgym.eval.harness import KindReferences
from specgym.eval.runner import run_controller


class ToyController(Prepared, ABC):
    """The toy kind's controller interface: one draft cap for a whole request."""

    name = "toy"

    @abstractmethod
    def cap(self, prompt_len: int) -> int:
        """The draft cap of every round of a request whose prompt has ``prompt_len`` tokens."""


class ToyFixed(ToyController):
    def __init__(self, k: int) -> None:
        self.k, self.name = k, f"toy:{k}"

    def cap(self, prompt_len: int) -> int:
        return self.k


class _PlaysTheCap(Controller):
    """The toy's cap as a chain controller: K every round of the request."""

    def __init__(self, toy: ToyController) -> None:
        self.toy, self.name = toy, toy.name

    def reset(self, ctx) -> None:
        super().reset(ctx)
        self.k = self.toy.cap(ctx.prompt_len)

    def propose(self) -> int:
        return self.k

    def observe(self, outcome) -> None:
        pass


def run_toy(state, row, tick):
    """The replay runner: the toy's caps on the evaluation's replay engine."""
    rp = state.replay
    return run_controller(rp.engine, rp.requests, _PlaysTheCap(row.controller), on_request=tick)


def toy_references(replay, named, results, refs):
    """The reference of the kind: its fastest row."""
    own = [r for r, row in zip(results, named) if isinstance(row.controller, ToyController)]
    best = min(own, key=lambda r: float(r.time_ms.sum())) if own else None
    return KindReferences({} if best is None else {"speedup_vs_best_toy": best},
                          {"best_toy": None if best is None else best.name})


def _toy(arg, k_max):
    return ToyFixed(2 if arg is None else int(arg))


register("toy", _toy, "toy[:K] (one draft cap per request)", kind="toy", family="fixed", level="request",
         in_all=lambda traits, k_max: ["toy:2"])
'''


class Touch:
    """Every change a new kind makes, recorded by the repository file it belongs to (or the new module it writes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.monkeypatch, self.tmp_path = monkeypatch, tmp_path
        self.files: set[str] = set()
        self.new_modules: list[Path] = []

    def setitem(self, module: types.ModuleType, table: str, key: str, value: object) -> None:
        """Add ``key: value`` to the table ``module.<table>`` (the change is to ``module``'s file)."""
        self.monkeypatch.setitem(getattr(module, table), key, value)
        self.files.add(Path(module.__file__ or "").resolve().relative_to(ROOT).as_posix())

    def new_module(self, name: str, source: str) -> types.ModuleType:
        """Write and import a new module (its ``register`` calls add its spec rows)."""
        path = self.tmp_path / f"{name}.py"
        path.write_text(source)
        self.new_modules.append(path)
        self.monkeypatch.syspath_prepend(str(self.tmp_path))
        return __import__(name)


def _guide_files() -> tuple[set[str], int]:
    """The repository files and the count of new modules the guide's "files it touches" list names."""
    text = GUIDE.read_text()
    section = text.split("## A new kind: the files it touches", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. (.*?)(?=^\d+\. |^\s*$)", section, flags=re.M | re.S)
    files = {f for item in items for f in re.findall(r"`([\w/]+\.py)`", item.split(":", 1)[0])}
    new = sum(1 for item in items if item.lower().startswith("one new module"))
    return files, new


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """The toy kind: its row in the kind table and its own module; returns the module and the record of changes."""
    touch = Touch(monkeypatch, tmp_path)
    touch.setitem(kinds, "KIND_ROWS", "toy", kinds.DecisionKind(
        "toy", "request", "toy-cap",  # type: ignore[arg-type]  # a new name: the KindName Literal is for mypy
        replay_runner="toy_kind:run_toy", interface="toy_kind:ToyController", references="toy_kind:toy_references"))
    registered = set(specs.TABLE)
    module = touch.new_module("toy_kind", TOY_MODULE)
    yield module, touch
    for key in set(specs.TABLE) - registered:  # its spec rows and its module leave with the test
        del specs.TABLE[key]
    sys.modules.pop("toy_kind", None)


def test_the_guide_lists_the_files_a_new_kind_touches(toy):
    """The files the toy kind changed are the guide's list: the kind table and one new module, nothing else."""
    _, touch = toy
    files, new = _guide_files()
    assert files == {"envs/core/kinds.py"} and new == 1, (files, new)
    assert touch.files == files and len(touch.new_modules) == new


def test_a_new_kind_joins_every_list_the_table_derives(toy):
    """Its row alone puts it in the kinds ``specgym eval`` runs, in ``all`` and in the usage line; the interface its
    row names tells its controllers apart from every other kind's."""
    module, _ = toy
    assert "toy" in kinds.KINDS and "toy" in kinds.EVAL_KINDS and "toy" not in kinds.LIVE_KINDS
    assert "toy[:K]" in specs.usage_line() and "toy:2" in specs.expand("all")[0]
    row = specs.build("toy:3")
    assert (row.kind, row.family, row.entry.level, row.controller.cap(10)) == ("toy", "fixed", "request", 3)
    assert specs.entry_of(module.ToyFixed(4)).kind == "toy"  # a controller built outside the table, by interface
    assert specs.entry_of(specs.build("fixed:4").controller).kind == "chain"
    with pytest.raises(SpecgymError, match="a toy controller, not chain"):
        specs.build("toy:2", kinds=("chain",))
    with pytest.raises(SpecgymError, match="implements none of Controller, TreeController, .*ToyController"):
        specs.entry_of(object())


def test_a_new_kind_runs_through_specgym_eval(toy, tmp_path, capsys):
    """``specgym eval`` runs the toy rows by the runner their row names and compares every row with the kind's
    reference; a toy playing K = 2 every round is the fixed K = 2 run (the same requests, the same draws)."""
    out = tmp_path / "ev"
    assert main(["eval", "--workload", "assc-regimes", "--controllers", "toy:2,toy:5,fixed:2,assc",
                 "--max-requests", "6", "--bootstrap", "100", "--no-plots", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    rows = {row["spec"]: row for row in report["rows"]}
    assert rows["toy:2"]["kind"] == rows["toy:5"]["kind"] == "toy" and rows["assc"]["kind"] == "chain"
    assert rows["toy:2"]["total_time_ms"] == pytest.approx(rows["fixed:2"]["total_time_ms"], rel=1e-9)
    assert rows["toy:2"]["tokens"] == rows["fixed:2"]["tokens"]
    best = report["best_toy"]
    assert best in ("toy:2", "toy:5") and rows[best]["speedup_vs_best_toy"] == pytest.approx(1.0)
    assert all("speedup_vs_best_toy" in row["ci95"] for row in rows.values())
    assert report["best_static_tree"] is None and report["best_single_drafter"] is None  # the other kinds' keys
    assert "toy:2" in (out / "report.md").read_text()


def test_a_new_kind_without_a_live_runner_is_refused_live(toy):
    """``run_live`` asks the row: a kind that names no live runner is one line, before any engine is touched."""
    pytest.importorskip("torch")
    from specgym.envs.engines.live.runners import LiveCall, run_live

    module, _ = toy
    with pytest.raises(SpecgymError, match="toy:3: a toy-cap controller does not run on a live engine"):
        run_live(None, "toy", module.ToyFixed(3), LiveCall([1, 2, 3], 4))  # type: ignore[arg-type]

"""Every shell block of README.md and docs/getting-started.md runs as a new user would type it, so none can drift.

The blocks are the ```bash blocks of both pages. A block right after a ``<!-- not run: WHY -->`` comment is not run
(a server, the command that runs this very test); every other line is run, top to bottom, each command once, in a
fresh folder with the shipped data paths pointed at this checkout. Budgets shrink through extra flags appended to
the command (argparse takes the last value), never by editing what the pages show. ``make demo`` runs the Makefile's
recipe for it; ``source .venv/bin/activate`` is checked (the test itself runs with that environment's commands
first on PATH, which is what activating does).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", ROOT / "docs" / "getting-started.md")
BIN = Path(sys.executable).parent
#: extra flags per subcommand (or "subcommand action") that keep CI fast
SMALL = {
    "eval": ["--max-requests", "24", "--bootstrap", "200"],
    "tune compare": ["--replications", "2"],
    "train": ["--timesteps", "2048", "--hyperparams", "n_envs=2", "n_steps=256", "batch_size=128",
              "eval_freq=1024", "eval_max_requests=10"],
    "record": ["--max-prompts", "2", "--max-new-tokens", "12"],
    "profile": ["--repeats", "3", "--warmup", "1", "--k-max", "4"],
    "generate": ["--max-new-tokens", "12"],
    "demo": ["--k-steps", "2048", "--token-steps", "2048"],
    # the shrunk run is below the best fixed K (the page's 300,000 steps beat it), which export refuses without it
    "export": ["--force"],
}
#: what each command must print (regexes over stdout + stderr), keyed like SMALL: an exit code of 0 is not enough
EXPECT = {
    "--version": [r"specgym \d+\.\d+"],
    "workloads list": [r"shipped workloads:", r"midpair-greedy\s+recorded", r"assc-regimes\s+SYNTHETIC",
                       r"shipped cost profiles:"],
    "workloads show": [r"workload\s+midpair-greedy", r"splits\s+train \d+\s+val \d+\s+test \d+", r"category"],
    "eval": [r"\| controller \| tok/s", r"\*\*oracle\*\*", r"report: \S+/report\.md"],
    "train": [r"run folder: runs/assc-k"],
    "export": [r"exported policy: policies/assc-k/policy\.json"],
    "generate": [r"controller ppo:generalist-token", r"speculative [\d.]+ tok/s vs plain [\d.]+ tok/s"],
    "record": [r"wrote my\.parquet: 2 requests"],
    "profile": [r"wrote my-profile\.json"],
    "tune vllm": [r'"num_speculative_tokens_per_batch_size": \[\[1,', r"table >= best static K"],
    "tune compare": [r"goodput \(reference\)", r"static:1 \| [\d.]+ \| [\d.]+x \["],
    "bench": [r"vectorised replay", r"rounds/s"],
    "demo": [r"report:\s+\S+/report\.md"],
}
SUITE_EXPECT = [r"Geometric mean over cells", r"suite report: \S+/suite\.md"]
#: make targets a page may show but this test cannot run, and why
MAKE_NOT_RUN = {"test": "the command that runs this test", "install": "creates the environment this test runs in"}
#: commands a run block may show but this test cannot run, and why
NOT_RUN = {"tensorboard": "a server that runs until stopped"}
BLOCK = re.compile(r"(?:<!--\s*(not run:[^>]*?)\s*-->\s*\n)?(?:<!-- tour -->\s*\n)?```bash\n(.*?)```", re.S)


def shell_blocks(page: Path) -> list[tuple[str | None, list[str]]]:
    """``(not-run reason or None, commands)`` of each bash block of a page; continuation lines are joined and
    comments dropped."""
    out = []
    for m in BLOCK.finditer(page.read_text()):
        cmds, cmd = [], ""
        for raw in m.group(2).splitlines():
            line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
            if not line.strip():
                continue
            cmd += line[:-1] + " " if line.endswith("\\") else line
            if not line.endswith("\\"):
                cmds.append(" ".join(cmd.split()))
                cmd = ""
        out.append((m.group(1), cmds))
    return out


def tour_commands() -> list[str]:
    """Every command the pages show in blocks that run, in page order, each once."""
    seen: list[str] = []
    for page in PAGES:
        for reason, cmds in shell_blocks(page):
            if reason is None:
                seen += [c for c in cmds if c not in seen]
    return seen


def make_recipe(target: str) -> list[str]:
    """The Makefile's one-line recipe of ``target`` as an argv with ``$(VENV)/bin/`` resolved to this venv."""
    m = re.search(rf"^{re.escape(target)}:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, f"Makefile has no one-line recipe for {target}"
    return shlex.split(m.group(1).replace("$(VENV)/bin/", f"{BIN}/"))


def test_every_shell_block_runs_or_says_why_not():
    for page in PAGES:
        blocks = shell_blocks(page)
        assert blocks, f"{page.name} has no bash block"
        for reason, cmds in blocks:
            assert reason is None or len(reason) > len("not run: ") + 10, f"{page.name}: say why a block is not run"
            if reason is None:
                for cmd in cmds:
                    argv = shlex.split(cmd)
                    ok = (argv[0] in ("specgym", ".venv/bin/specgym", *NOT_RUN)
                          or argv[:2] == ["source", ".venv/bin/activate"]
                          or (argv[0] == "make" and (argv[1] == "demo" or argv[1] in MAKE_NOT_RUN)))
                    assert ok, f"{page.name}: the tour test cannot run {cmd!r}: mark its block <!-- not run: why -->"
    assert "<!-- tour -->" in PAGES[0].read_text(), "README.md has no '<!-- tour -->' block"
    assert len(tour_commands()) >= 12


def _argv(cmd: str) -> list[str] | None:
    argv = shlex.split(cmd)
    if argv[0] in NOT_RUN:
        return None
    if argv[0] == "source":
        assert (BIN / "activate").is_file(), f"{cmd}: {BIN / 'activate'} missing"
        return None
    if argv[0] == "make":
        return None if argv[1] in MAKE_NOT_RUN else make_recipe(argv[1])
    if argv[0] == ".venv/bin/specgym":
        argv[0] = "specgym"
    return argv


def test_make_demo_runs_specgym_demo():
    assert make_recipe("demo")[1:] == ["demo", "--force"]


@pytest.mark.slow
def test_readme_tour_runs_top_to_bottom(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}
    (tmp_path / "data").symlink_to(ROOT / "data")  # the tour's data/... paths, as in a checkout
    for cmd in tour_commands():
        argv = _argv(cmd)
        if argv is None:
            continue
        argv[0] = str(BIN / "specgym") if argv[0] == "specgym" else argv[0]
        key = " ".join(argv[1:3])
        argv += SMALL.get(key, SMALL.get(argv[1], []))
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        text = r.stdout + r.stderr
        expect = SUITE_EXPECT if "--suite" in argv else EXPECT.get(key, EXPECT.get(argv[1]))
        assert expect, f"no expected output for {cmd!r}: add it to EXPECT"
        missing = [e for e in expect if not re.search(e, text)]
        assert not missing, f"{cmd}: output lacks {missing}\n{text[-3000:]}"
        assert "Traceback" not in text, f"{cmd}\n{text[-3000:]}"
        outs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"]
        outs += re.findall(r"report: (\S+)/report\.md", text)
        for out in outs:
            assert (tmp_path / out).exists(), f"{cmd}: {out} not written"

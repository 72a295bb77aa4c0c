"""The README's tour runs top to bottom, as a new user would type it (with smaller budgets), so it cannot drift.

The tour is the ``bash`` block after ``<!-- tour -->`` in README.md. Each command runs in a fresh folder with the
shipped data paths pointed at this checkout; budgets shrink through extra flags appended to the command (argparse
takes the last value), never by editing what the README shows. Long-running servers (tensorboard) are skipped.
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
#: extra flags per subcommand (or "subcommand action") that keep CI fast
SMALL = {
    "eval": ["--max-requests", "24", "--bootstrap", "200"],
    "tune compare": ["--replications", "2"],
    "train": ["--timesteps", "2048", "--hyperparams", "n_envs=2", "n_steps=256", "batch_size=128",
              "eval_freq=1024", "eval_max_requests=10"],
    "record": ["--max-prompts", "2", "--max-new-tokens", "12"],
    "profile": ["--repeats", "3", "--warmup", "1", "--k-max", "4"],
    "bench": ["--sections", "load,vector"],
    "generate": ["--max-new-tokens", "12"],
    "demo": ["--k-steps", "2048", "--token-steps", "2048"],
}
SKIP = ("tensorboard",)
#: what each command must print (regexes over stdout + stderr), keyed like SMALL: an exit code of 0 is not enough
EXPECT = {
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
    "bench": [r"workload load", r"vectorised replay"],
}
SUITE_EXPECT = [r"Geometric mean over cells", r"suite report: \S+/suite\.md"]


def tour_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- tour -->\s*```bash\n(.*?)```", text, re.S)
    assert m, "README.md has no '<!-- tour -->' bash block"
    lines, cmd = [], ""
    for raw in m.group(1).splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        cmd += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(cmd.strip())
            cmd = ""
    return lines


def test_tour_is_found():
    cmds = tour_commands()
    assert len(cmds) >= 8 and all(c.split()[0] in ("specgym", *SKIP) for c in cmds), cmds


@pytest.mark.slow
def test_readme_tour_runs_top_to_bottom(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    (tmp_path / "data").symlink_to(ROOT / "data")  # the tour's data/... paths, as in a checkout
    for cmd in tour_commands():
        argv = shlex.split(cmd)
        if argv[0] in SKIP:
            continue
        argv += SMALL.get(" ".join(argv[1:3]), SMALL.get(argv[1], []))
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        text = r.stdout + r.stderr
        expect = SUITE_EXPECT if "--suite" in argv else EXPECT.get(" ".join(argv[1:3]), EXPECT.get(argv[1]))
        assert expect, f"no expected output for {cmd!r}: add it to EXPECT"
        missing = [e for e in expect if not re.search(e, text)]
        assert not missing, f"{cmd}: output lacks {missing}\n{text[-3000:]}"
        assert "Traceback" not in text, f"{cmd}\n{text[-3000:]}"
        outs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"]
        outs += re.findall(r"report: (\S+)/report\.md", text)
        for out in outs:
            assert (tmp_path / out).exists(), f"{cmd}: {out} not written"

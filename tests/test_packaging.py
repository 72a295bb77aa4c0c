"""The wheel works without the checkout: build it, install it into a fresh venv, run the product from elsewhere.

The fresh venv gets specgym from the wheel alone; its dependencies come from this environment's site-packages
through a ``.pth`` path line (which, unlike a site directory, does not run this environment's editable-install
hooks), so nothing of the checkout is importable there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    out = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist"),
                          str(ROOT)], capture_output=True, text=True, cwd=tmp)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("specgym-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                           "--quiet", str(wheel)], capture_output=True, text=True)
    assert inst.returncode == 0, inst.stderr[-3000:]
    return {"log": out.stdout + out.stderr, "py": py, "bin": env_dir / "bin", "cwd": tmp, "wheel": wheel}


def _run(env, *args, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [str(env["py"]), "-c", code] if code is not None else [str(env["bin"] / "specgym"), *args]
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECGYM_DATA")}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=env["cwd"], env={**clean, "HF_HUB_OFFLINE": "1"},
                          timeout=600)


@pytest.mark.slow
def test_build_has_no_setuptools_warnings(wheel_env):
    import re

    hits = [ln for ln in wheel_env["log"].splitlines() if re.search(r"\w+Warning|!!|absent from the .packages.", ln)]
    assert not hits, "\n".join(hits)


@pytest.mark.slow
def test_wheel_works_without_the_checkout(wheel_env):
    r = _run(wheel_env, code=(
        "import gymnasium as gym, specgym, specgym.paths as p\n"
        "env = gym.make('specgym/SpecDecode-v1')\n"
        "env.reset(seed=0); env.step(2)\n"
        "print(specgym.__file__); print(p.DATA_DIR)"))
    assert r.returncode == 0, r.stderr[-2000:]
    pkg, data = r.stdout.split()
    assert str(ROOT) not in pkg and str(ROOT) not in data and "site-packages" in pkg
    out = wheel_env["cwd"] / "ev"
    r = _run(wheel_env, "eval", "--controllers", "fixed:2,assc", "--max-requests", "10", "--out", str(out),
             "--no-plots")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "report.json").read_text())["rows"]
    r = _run(wheel_env, "generate", "--prompt", "def add(a, b):", "--max-new-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["tokens"] == 12

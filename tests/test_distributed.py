"""Distributed recording on a local Ray cluster (tinypair, a few short prompts): identical to one process, an
actor killed mid-run is retried, an interrupted run resumes by shard; without Ray, one line naming the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from specgym.cli import main
from specgym.paths import MODELS_DIR

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym.envs.engines.live.recorder import PromptSpec, RecordingSpec, record_workload  # noqa: E402
from specgym.envs.profiles import load_profile  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.io import sha256_file  # noqa: E402

TINY = MODELS_DIR / "tinypair"
# the fast linear kernels are chosen by timing at load: fixed kernels make the float columns reproducible at all
LOAD = {"draft": str(TINY / "draft"), "target": str(TINY / "target"), "fast_kernels": False}
TEXTS = ["def f(x):\n    return x", "the cat sat on the mat.", "12 + 7 = 19", "import os\nimport sys\n",
         "class a:\n  pass\n", "for i in range(3):", "Once upon a time", "x = [1, 2, 3]"]
PROMPTS = [PromptSpec(f"q{i}", t, ["code", "prose", "math"][i % 3]) for i, t in enumerate(TEXTS)]
COMMON = dict(max_new_tokens=(6, 12), profile=load_profile("cpu-tinypair"), name="dist", seed=4, gen_k=2, batch=2,
              split_fractions=(0.5, 0.25, 0.25))


def _spec(temperature: float) -> RecordingSpec:
    return RecordingSpec(temperature=temperature, **COMMON)


def test_core_install_does_not_pull_ray():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert not any(d.lower().startswith("ray") for d in project["dependencies"])
    assert any(d.startswith("ray") for d in project["optional-dependencies"]["distributed"])


def test_workers_without_ray_is_one_line(monkeypatch, tmp_path, capsys, one_line_error):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code = main(["record", "--draft", LOAD["draft"], "--target", LOAD["target"], "--prompts", "tinypair-prompts",
                 "--max-prompts", "2", "--max-new-tokens", "4", "--profile", "cpu-tinypair", "--workers", "2",
                 "--out", str(tmp_path / "w.parquet")])
    assert code == 2
    one_line_error(capsys, "--workers needs Ray", "pip install 'specgym[distributed]'")
    assert list(tmp_path.iterdir()) == []


ray = pytest.importorskip("ray")
from specgym.envs.engines.live.distributed import plan_shards, record_distributed, start_ray, stop_ray  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster (2 CPUs, loopback only) for the module."""
    started = start_ray(2)
    yield
    if started:
        stop_ray()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The single-process recordings (one torch thread, as each Ray actor), greedy and sampled."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    from specgym.envs.engines.live.model_loading import load_pair

    pair = load_pair(**LOAD)
    out = {}
    try:
        for temp in (0.0, 0.8):
            path = tmp_path_factory.mktemp("ref") / "ref.parquet"
            record_workload(pair, PROMPTS, path, _spec(temp))
            out[temp] = path
    finally:
        torch.set_num_threads(threads)
    return out


def test_plan_shards_are_batch_multiples():
    assert plan_shards(10, 2, 4, 3) == [(0, 4), (4, 8), (8, 10)]
    assert plan_shards(8, 2, 2) == [(0, 2), (2, 4), (4, 6), (6, 8)]


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_two_workers_identical_to_one_process(cluster, reference, tmp_path, temperature):
    out = tmp_path / "two.parquet"
    wl, stats = record_distributed(LOAD, PROMPTS, out, _spec(temperature), 2, shard_requests=2)
    assert stats["shards"] == 4 and stats["retries"] == 0
    assert sha256_file(out) == sha256_file(reference[temperature])  # every column, the splits, the metadata
    assert not (tmp_path / "two.parquet.shards").exists()


@pytest.mark.slow
def test_killed_actor_is_retried_and_resumes_its_shard(cluster, reference, tmp_path):
    out = tmp_path / "k.parquet"
    # shard 1 (4 requests, batches of 2): its actor's process dies after 2 requests (one batch written)
    _, stats = record_distributed(LOAD, PROMPTS, out, _spec(0.0), 2, shard_requests=4, fault=(1, 2))
    assert stats["retries"] == 1 and stats["resumed"] == 2  # the retry resumed the 2 requests the dead actor wrote
    assert sha256_file(out) == sha256_file(reference[0.0])


@pytest.mark.slow
def test_interrupted_run_resumes_by_shard(cluster, reference, tmp_path):
    out = tmp_path / "r.parquet"
    with pytest.raises(SpecgymError, match=r"shard\(s\) \[2\] failed 1 times .* rerun the same command to resume"):
        record_distributed(LOAD, PROMPTS, out, _spec(0.0), 2, shard_requests=2, fault=(2, 1),
                           max_retries=0)
    work = tmp_path / "r.parquet.shards"
    kept = sorted(p.name for p in work.glob("shard-*.parquet"))
    assert "shard-00002.parquet" not in kept and len(kept) >= 1 and not out.exists()
    seen: list[tuple[int, int]] = []
    _, stats = record_distributed(LOAD, PROMPTS, out, _spec(0.0), 2, shard_requests=2,
                                  progress=lambda i, n: seen.append((i, n)))
    assert stats["shards_resumed"] == len(kept) and stats["retries"] == 0
    assert sha256_file(out) == sha256_file(reference[0.0])
    # the progress bar starts at the resumed shards' requests, then advances shard by shard to every request
    assert seen[0] == (2 * len(kept), len(PROMPTS)) and seen[-1] == (len(PROMPTS), len(PROMPTS))
    assert [i for i, _ in seen] == sorted(i for i, _ in seen) and len(seen) == len(PROMPTS) // 2 - len(kept) + 1
    # other settings over the same work folder are refused, not mixed in
    other = tmp_path / "r2.parquet.shards"
    other.mkdir()
    (other / ".specgym").write_text('{"files": ["plan.json"]}')
    (other / "plan.json").write_text("{}")
    with pytest.raises(SpecgymError, match="different settings"):
        record_distributed(LOAD, PROMPTS, tmp_path / "r2.parquet", _spec(0.0), 2)


@pytest.mark.slow
def test_cli_workers_writes_a_sharded_folder(cluster, reference, tmp_path, capsys):
    out = tmp_path / "ds"
    assert main(["record", "--draft", LOAD["draft"], "--target", LOAD["target"], "--prompts", "tinypair-prompts",
                 "--max-prompts", "4", "--max-new-tokens", "5", "--profile", "cpu-tinypair", "--workers", "2",
                 "--shard-requests", "2", "--quiet", "--no-fast-kernels", "--out", str(out)]) == 0
    assert "on 2 workers" in capsys.readouterr().out
    from specgym.envs.workloads.trace_format import open_dataset

    ds = open_dataset(out)
    assert ds.n_requests == 4 and all(np.isfinite(w.p_accept).all() for w in ds.iter_shards())


# --------------------------------------------------------------------------- issue 31: no hang, nothing left behind
def _record_args(out: Path, *extra: str) -> list[str]:
    return ["record", "--draft", LOAD["draft"], "--target", LOAD["target"], "--prompts", "tinypair-prompts",
            "--max-prompts", "4", "--max-new-tokens", "5", "--profile", "cpu-tinypair", "--workers", "2", "--quiet",
            "--out", str(out), *extra]


def test_unreachable_cluster_is_one_line_and_leaves_no_output(tmp_path, capsys, one_line_error):
    out = tmp_path / "w.parquet"
    assert main(_record_args(out, "--ray-address", "127.0.0.1:1")) == 2  # port 1: nothing listens
    one_line_error(capsys, "cannot reach the Ray cluster at 127.0.0.1:1")
    assert list(tmp_path.iterdir()) == []  # no OUT.shards/ (it used to be created before the endless retries)


def test_a_port_that_is_not_ray_times_out_within_the_bound(tmp_path, capsys, monkeypatch, one_line_error):
    import socket
    import time

    import specgym.envs.engines.live.distributed as distributed

    monkeypatch.setattr(distributed, "CONNECT_TIMEOUT_S", 8.0)
    with socket.socket() as listener:  # accepts TCP connections, never answers Ray's protocol
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        assert main(_record_args(tmp_path / "w.parquet", "--ray-address", address)) == 2
        assert time.monotonic() - t0 < 30
    one_line_error(capsys, f"the Ray cluster at {address} did not answer within 8 s")
    assert list(tmp_path.iterdir()) == []


def _marked(mark: str) -> list[int]:
    """Processes whose environment carries ``SPECGYM_TEST_MARK=mark`` (everything the run started inherits it)."""
    pids = []
    for name in Path("/proc").iterdir():
        if name.name.isdigit():
            try:
                if f"SPECGYM_TEST_MARK={mark}".encode() in (name / "environ").read_bytes().split(b"\0"):
                    pids.append(int(name.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_no_ray_process_outlives_the_recording(tmp_path, sig):
    """A real local cluster of 2 CPUs: the parent killed outright (SIGKILL; SIGTERM takes the same path) or
    interrupted while the workers record; within 30 s nothing the run started is left (GCS, raylet, agents,
    workers, the reaper)."""
    import os
    import signal
    import subprocess
    import time
    import uuid

    mark = uuid.uuid4().hex
    env = {**os.environ, "SPECGYM_TEST_MARK": mark, "OMP_NUM_THREADS": "1"}
    args = _record_args(tmp_path / "w.parquet")
    args[args.index("--max-prompts") + 1], args[args.index("--max-new-tokens") + 1] = "16", "200"
    proc = subprocess.Popen([sys.executable, "-m", "specgym", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (tmp_path / "w.parquet.shards").exists():
            time.sleep(0.5)  # the cluster is up once the work folder exists
        assert proc.poll() is None, "the recording ended before it could be interrupted"
        time.sleep(3)  # workers loading the pair
        before = [p for p in _marked(mark) if p != proc.pid]
        assert len(before) >= 3, before  # GCS, raylet, workers... (and the reaper)
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=180)  # an interrupted run shuts its cluster down first: over 60 s at load 6 (seen in CI)
        deadline = time.monotonic() + 30
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _marked(mark) == []
    finally:
        if proc.poll() is None:
            proc.kill()

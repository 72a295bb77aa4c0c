"""The device: device-agnostic synchronisation, sampling on a host generator, and the CPU dry run of ``make
gpu-check`` (no GPU here: the GPU run itself has not been made, docs/guides/own-pair.md)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym.envs.engines.live import clock  # noqa: E402

torch.set_num_threads(1)


def test_clock_helpers_on_the_cpu():
    clock.synchronize("cpu")
    clock.synchronize(torch.device("cpu"))
    assert clock.syncer("cpu")() is None
    t0 = clock.timed("cpu")
    assert clock.timed("cpu") >= t0
    probs = torch.softmax(torch.randn(3, 40), -1)
    a = clock.host_multinomial(probs, clock.host_generator(7))
    b = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)  # on the CPU the host draw is the draw it always was
    assert 0.0 <= clock.host_uniform(clock.host_generator(1)) < 1.0


def test_sampled_requests_draw_on_the_host(tmp_path):
    from specgym.envs.engines.live.engine import LiveEngine
    from specgym.envs.engines.live.model_loading import load_pair
    from specgym.training.models.toy import save_toy_pair

    d, t = save_toy_pair(tmp_path / "pair")
    eng = LiveEngine.from_pair(load_pair(str(d), str(t)))
    req = eng.start(list(range(3, 12)), 16, temperature=0.8, seed=5)
    assert req.gen is not None and req.gen.device.type == "cpu"
    first = eng.run_request(list(range(3, 12)), 3, 16, temperature=0.8, seed=5).tokens
    assert eng.run_request(list(range(3, 12)), 3, 16, temperature=0.8, seed=5).tokens == first


@pytest.mark.slow
def test_gpu_check_dry_run_on_the_cpu(tmp_path, capsys):
    from specgym.cli import main

    out = tmp_path / "gpu-check.json"
    assert main(["gpu-check", "--device", "cpu", "--quick", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["machine"]["device"] == "cpu" and figures["quick"] is True
    assert figures["record"]["requests"] == 2 and figures["record"]["positions"] > 0
    rows = {r["controller"]: r for r in figures["live_bench"]["rows"]}
    assert {"fixed:0", "fixed:2", "fixed:4", "marginal", "tree-static:2-2-1"} <= set(rows)
    assert all(r["greedy_identical"] for r in rows.values())
    assert set(figures["seconds"]) >= {"load_s", "profile_s", "record_s", "live_bench_s", "total_s"}


def test_gpu_check_refuses_a_missing_gpu_in_one_line(tmp_path, capsys):
    from specgym.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    capsys.readouterr()
    assert main(["gpu-check", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "CUDA is not available" in err
    assert not (tmp_path / "x.json").exists()

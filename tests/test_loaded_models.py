"""Loaded models: after ``load_pair`` the models are still ordinary models (the fast kernels keep the layers' own
parameters): ``save_pretrained`` writes byte-identical files, ``.to(dtype)`` works, parameter counts are right.

Models are tiny RANDOMLY-INITIALISED pairs of several architectures (tests/hf_pairs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_pairs  # noqa: E402

from specgym.envs.engines.live import fast_linear  # noqa: E402
from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.envs.engines.live.model_loading import load_pair  # noqa: E402

torch.set_num_threads(1)
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors")


@pytest.mark.parametrize("arch", ["gpt2", "llama", "phi"])
def test_saved_after_use_byte_identical(arch, tmp_path_factory, tmp_path):
    d, t = hf_pairs.cached_pair(arch, tmp_path_factory)
    pair = load_pair(str(d), str(t))
    if fast_linear.packing_available():
        assert pair.packed > 0 and fast_linear.kernel_modules(pair.target)
    ids = pair.tokenizer("def f(x):\n")["input_ids"]
    LiveEngine.from_pair(pair).run_request(ids, 3, 12)
    for role, model, src in (("draft", pair.draft, d), ("target", pair.target, t)):
        model.save_pretrained(str(tmp_path / role))
        for name in MODEL_FILES:
            assert (tmp_path / role / name).read_bytes() == (Path(src) / name).read_bytes(), (arch, role, name)


def test_parameter_count_and_dtype_moves(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    d, t = hf_pairs.cached_pair("llama", tmp_path_factory)
    pair = load_pair(str(d), str(t))
    fresh = AutoModelForCausalLM.from_pretrained(str(t))
    assert sum(p.numel() for p in pair.target.parameters()) == sum(p.numel() for p in fresh.parameters())
    assert set(pair.target.state_dict()) == set(fresh.state_dict())
    ids = pair.tokenizer("def f(x):\n")["input_ids"]
    before = LiveEngine.from_pair(pair).run_request(ids, 3, 16).tokens
    for m in (pair.draft, pair.target):
        m.to(torch.bfloat16)
    half = LiveEngine.from_pair(pair).run_request(ids, 3, 16).tokens  # was: a dtype error at the next forward
    assert len(half) == 16
    for m in (pair.draft, pair.target):
        m.to(torch.float32)
    assert LiveEngine.from_pair(pair).run_request(ids, 3, 16).tokens == before


def test_kernel_layer_follows_weight_updates():
    w = torch.nn.Parameter(torch.randn(24, 16))
    layer = fast_linear.kernel_linear(w, None)
    assert layer.weight is w  # the layer's own parameter, not a copy
    x = torch.randn(3, 16)
    for kernel in fast_linear.KERNELS if fast_linear.packing_available() else ("gemm",):
        layer.forced = kernel
        layer(x)
        with torch.no_grad():
            w.mul_(2.0)  # an in-place update drops the derived layouts
        torch.testing.assert_close(layer(x), x @ w.detach().t(), rtol=1e-5, atol=1e-5)


def test_shipped_batch_profile_counts_parameters():
    from transformers import AutoModelForCausalLM

    from specgym.paths import MODELS_DIR, PROFILES_DIR

    prof = json.loads((PROFILES_DIR / "batch-cpu-midpair.json").read_text())
    hw = prof["hardware"]
    for role in ("draft", "target"):
        model = AutoModelForCausalLM.from_pretrained(str(MODELS_DIR / "midpair" / role))
        assert hw[f"{role}_params"] == sum(p.numel() for p in model.parameters()), role

"""Shared fixtures: small synthetic workloads, hand-made traces and a tiny random Llama target."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specgym.envs.core.cost import CostProfile
from specgym.envs.workloads.synthetic import generate_workload
from specgym.envs.workloads.trace_format import workload_from_requests


@pytest.fixture(scope="session")
def mix_workload():
    """A small synthetic speclane-mix workload (labelled synthetic)."""
    return generate_workload("speclane-mix", 300, seed=1)


@pytest.fixture(scope="session")
def regime_workload():
    """A small synthetic assc-regimes workload."""
    return generate_workload("assc-regimes", 200, seed=2)


@pytest.fixture
def flat_profile():
    """draft 1 ms, verify 10 ms flat, no overhead."""
    return CostProfile(name="flat", draft_ms=1.0, verify_ms=(10.0,) * 17, source="synthetic")


@pytest.fixture(scope="session")
def make_trace():
    """Build a workload from explicit per-request p_accept lists: ``make_trace(p_accepts, profile, ...)``."""
    return build_trace


def build_trace(p_accepts, profile, temperature=0.0, name="hand"):
    """A workload from explicit per-request p_accept lists (conf/entropy derived from them)."""
    reqs = []
    for i, p in enumerate(p_accepts):
        p = np.asarray(p, dtype=np.float32)
        reqs.append({
            "request_id": f"r{i}", "category": "cat", "temperature": temperature, "prompt_len": 5,
            "p_accept": p, "draft_conf": np.clip(0.1 + 0.8 * p, 0, 1), "draft_entropy": 1.0 - 0.5 * p,
            "split": "test",
        })
    return workload_from_requests(name, {"kind": "synthetic", "generator": "tests"}, profile, reqs)


def assert_one_line_error(capsys, *fragments: str) -> str:
    """The captured stderr is one line, no traceback, holding every fragment; returns it."""
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    return err


@pytest.fixture
def one_line_error():
    """:func:`assert_one_line_error`, for test modules (``one_line_error(capsys, "fragment")``)."""
    return assert_one_line_error


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A random 4-layer Llama with the tinypair tokenizer (the real target's architecture, in miniature)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tiny") / "target"
    tok = transformers.AutoTokenizer.from_pretrained(
        str(Path(__file__).resolve().parents[1] / "data" / "models" / "tinypair" / "target"))
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                                   max_position_embeddings=512, eos_token_id=tok.eos_token_id,
                                   bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder

"""The lean forward of the Llama family (issue 30): the same logits as transformers within float rounding, per
architecture (Llama, Qwen2 with grouped-query attention and qkv biases, Mistral past its sliding window), with
tree-attention masks, in bfloat16 too.

Models are tiny RANDOMLY-INITIALISED pairs (tests/hf_pairs.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_pairs  # noqa: E402

from specgym.envs.engines.live.lean_forward import LeanLlama, lean_runner  # noqa: E402

torch.set_num_threads(1)
LLAMA_FAMILY = ("llama", "qwen2", "mistral")
IDS = [(7 * i) % 45 + 2 for i in range(60)]  # 60 tokens: past the Mistral pair's 24-token window


def _target(arch, tmp_path_factory, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    _, t = hf_pairs.cached_pair(arch, tmp_path_factory)
    return AutoModelForCausalLM.from_pretrained(str(t), dtype=dtype).eval()


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_same_logits_as_transformers(arch, tmp_path_factory):
    model = _target(arch, tmp_path_factory)
    runner = lean_runner(model)
    assert isinstance(runner, LeanLlama)
    with torch.inference_mode():
        ref = model(torch.tensor([IDS])).logits[0]
        cache = runner.new_cache()
        chunks = [runner(IDS[:30], cache), runner(IDS[30:31], cache), runner(IDS[31:], cache)]
        torch.testing.assert_close(torch.cat(chunks), ref, rtol=1e-4, atol=1e-4)
        one = runner.new_cache()
        torch.testing.assert_close(torch.cat([runner([t], one) for t in IDS]), ref, rtol=1e-4, atol=1e-4)
        cache.crop(-10)  # the engine's rollback, then the same tokens again
        torch.testing.assert_close(runner(IDS[50:], cache), ref[50:], rtol=1e-4, atol=1e-4)
        logits, h = runner(IDS[:5], runner.new_cache(), hidden=True)
        out = model(torch.tensor([IDS[:5]]), output_hidden_states=True)
        torch.testing.assert_close(h, out.hidden_states[-1][0], rtol=1e-4, atol=1e-4)
    if arch == "mistral":
        assert set(runner.windows) == {hf_pairs.SLIDING_WINDOW}


@pytest.mark.parametrize("arch", LLAMA_FAMILY)
def test_tree_rows_see_the_prefix_and_their_ancestors(arch, tmp_path_factory):
    """Siblings at one position and a child of the first: each row's logits are the forward of its own path."""
    model = _target(arch, tmp_path_factory)
    runner = lean_runner(model)
    prefix, a, b, c = IDS[:40], 11, 12, 13
    p = len(prefix)
    with torch.inference_mode():
        cache = runner.new_cache()
        runner(prefix, cache)
        mask = torch.zeros(3, p + 3, dtype=torch.bool)
        mask[:, :p] = True
        mask[0, p] = mask[1, p + 1] = True  # a, b: siblings
        mask[2, p] = mask[2, p + 2] = True  # c: child of a
        tree = runner([a, b, c], cache, positions=[p, p, p + 1], mask=mask)
        for row, path in ((0, [a]), (1, [b]), (2, [a, c])):
            ref = model(torch.tensor([prefix + path])).logits[0, -1]
            torch.testing.assert_close(tree[row], ref, rtol=1e-4, atol=1e-4)


def test_bfloat16_close_and_cache_grows(tmp_path_factory):
    model = _target("llama", tmp_path_factory, torch.bfloat16)
    runner = lean_runner(model)
    assert isinstance(runner, LeanLlama)
    runner.INITIAL_CACHE = 16  # grows while decoding
    with torch.inference_mode():
        ref = model(torch.tensor([IDS])).logits[0].float()
        cache = runner.new_cache()
        got = torch.cat([runner(IDS[:8], cache)] + [runner([t], cache) for t in IDS[8:]]).float()
    assert cache.k.shape[2] >= len(IDS) and cache.k.dtype == torch.bfloat16
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()


def test_other_families_and_dynamic_rope_keep_the_transformers_forward(tmp_path_factory):
    for arch in ("gpt_neox", "phi"):
        assert lean_runner(_target(arch, tmp_path_factory)) is None
    model = _target("llama", tmp_path_factory)
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_type": "dynamic"}
    assert lean_runner(model) is None

"""The model-pair pipeline (``training/models``): growth of a trained GPT-2 preserves its function, in seconds on
a toy model (the corpus, tokenizer and training stages run only in ``make models``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specgym.errors import SpecgymError  # noqa: E402
from specgym.training.models.grow import grow_gpt2  # noqa: E402
from specgym.training.models.toy import toy_models, toy_tokenizer  # noqa: E402

torch.set_num_threads(1)


def _tied_toy(layers: int = 2, width: int = 32, seed: int = 0):
    """A small random GPT-2 of the toy pair's shape, with tied embeddings (what growth expects)."""
    cfg = transformers.GPT2Config(vocab_size=len(toy_tokenizer()), n_positions=64, n_embd=width, n_layer=layers,
                                  n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # trained-looking statistics: non-trivial LayerNorms and biases
        for name, p in model.named_parameters():
            if name.endswith((".bias", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("width, depth", [(2, None), (1, 4), (2, 3)])
def test_growth_without_noise_preserves_the_function(width, depth):
    model = _tied_toy()
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    grown = grow_gpt2(model, width, depth, noise=0.0).eval()
    assert grown.config.n_embd == width * model.config.n_embd
    assert grown.config.n_layer == (depth or model.config.n_layer)
    assert torch.allclose(_logits(grown, ids), _logits(model, ids), atol=1e-4, rtol=1e-4)


def test_growth_with_noise_changes_the_function_a_little():
    model = _tied_toy()
    ids = torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(2))
    base, grown = _logits(model, ids), _logits(grow_gpt2(model, 2, 3, noise=0.01).eval(), ids)
    assert not torch.allclose(grown, base, atol=1e-6)
    assert (grown.argmax(-1) == base.argmax(-1)).float().mean() > 0.9


def test_growth_refuses_what_it_cannot_preserve():
    model = _tied_toy()
    with pytest.raises(SpecgymError, match="cannot remove blocks"):
        grow_gpt2(model, 1, 1)
    with pytest.raises(SpecgymError, match="width multiplier"):
        grow_gpt2(model, 0)
    _, untied = toy_models(len(toy_tokenizer()))  # the toy pair's target has an untied head
    with pytest.raises(SpecgymError, match="tied"):
        grow_gpt2(untied, 2)

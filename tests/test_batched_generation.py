"""Continuous batching for the data generator (issue 54): greedy rows equal one-row greedy ``generate`` exactly, for
every slot count; a sampled row depends on its prompt and seed only (not on the slots or the other rows' order);
the nucleus and the temperature are the distribution's; models the slotted forward lacks fall back to ``generate``.

Models are tiny RANDOMLY-INITIALISED Hugging Face models (tests/hf_pairs.py), built in memory.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import hf_pairs  # noqa: E402

from specgym.training.models import continuous_batch  # noqa: E402
from specgym.training.models.batched import Generation, generate_rows  # noqa: E402
from specgym.training.models.continuous_batch import (  # noqa: E402
    SlotLlama,
    continuous_generate,
    pick,
    row_seed,
    supported,
)

torch.set_num_threads(1)
STOPS = [0, 5, 9]
MAX_NEW = 40  # past the Mistral pair's 24-token window
_MODELS: dict[str, object] = {}


def _target(arch):
    if arch not in _MODELS:
        tok = hf_pairs.tokenizer(arch in hf_pairs.BOS_ARCHS)
        _MODELS[arch] = hf_pairs.models(arch, len(tok))[1]
    return _MODELS[arch]


def _rows(n=14, seed=1):
    """Prompts of 1 to 34 tokens (ids 3..49), some longer than the Mistral window."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 50, (int(torch.randint(1, 35, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _one_row_greedy(model, row):
    """transformers' greedy ``generate`` of one row, cut after its first stop token."""
    with torch.inference_mode():
        seq = model.generate(torch.tensor([row]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=STOPS,
                             pad_token_id=1)[0, len(row):].tolist()
    for n, t in enumerate(seq):
        if t in STOPS:
            return seq[:n + 1]
    return seq


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_greedy_rows_equal_one_row_generate(arch):
    model = _target(arch)
    assert supported(model)
    rows = _rows()
    refs = [_one_row_greedy(model, r) for r in rows]
    assert any(len(r) == MAX_NEW for r in refs) and any(len(r) < MAX_NEW for r in refs)  # both ends occur
    for slots in (1, 3, 16):
        got = continuous_generate(model, rows, stop_ids=STOPS, max_new_tokens=MAX_NEW, slots=slots)
        assert got == refs, f"{arch}: {slots} slots"


def test_cache_growth_keeps_the_rows(monkeypatch):
    """Columns allocated 8 at a time (doubling as rows get longer): the same greedy rows."""
    model = _target("llama")
    rows = _rows(8)
    ref = continuous_generate(model, rows, stop_ids=STOPS, max_new_tokens=MAX_NEW, slots=3)
    monkeypatch.setattr(SlotLlama, "INITIAL", 8)
    grown = []
    real = SlotLlama._ensure
    monkeypatch.setattr(SlotLlama, "_ensure", lambda self, end: (real(self, end), grown.append(self.k.shape[3])))
    assert continuous_generate(model, rows, stop_ids=STOPS, max_new_tokens=MAX_NEW, slots=3) == ref
    assert grown[0] == 8 and max(grown) >= max(len(r) + len(o) - 1 for r, o in zip(rows, ref))  # it grew


def test_generate_rows_results_and_progress():
    model = _target("llama")
    rows = _rows()
    calls = []
    gens = generate_rows(model, rows, pad_id=1, stop_ids=STOPS, max_new_tokens=MAX_NEW, batch=4,
                         on_batch=lambda r, t: calls.append((r, t)))
    refs = [_one_row_greedy(model, r) for r in rows]
    assert [g.ids for g in gens] == refs
    assert [g.stopped for g in gens] == [r[-1] in STOPS for r in refs]
    assert sum(r for r, _ in calls) == len(rows) and sum(t for _, t in calls) == sum(len(r) for r in refs)
    assert len(calls) > 1 and all(r > 0 for r, _ in calls)  # reported as rows finish, not once at the end


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_sampled_rows_do_not_depend_on_slots_or_order(arch):
    model = _target(arch)
    rows = _rows()
    seeds = [row_seed(7, i) for i in range(len(rows))]
    kw = dict(stop_ids=[0], max_new_tokens=MAX_NEW, temperature=0.9, top_p=0.95)
    ref = continuous_generate(model, rows, seeds=seeds, slots=4, **kw)
    assert continuous_generate(model, rows, seeds=seeds, slots=1, **kw) == ref
    assert continuous_generate(model, rows, seeds=seeds, slots=len(rows), **kw) == ref
    perm = list(range(len(rows)))[::3] + [i for i in range(len(rows)) if i % 3]
    shuffled = continuous_generate(model, [rows[i] for i in perm], seeds=[seeds[i] for i in perm], slots=5, **kw)
    assert shuffled == [ref[i] for i in perm]
    greedy = continuous_generate(model, rows, stop_ids=[0], max_new_tokens=MAX_NEW)
    assert ref != greedy  # it does sample
    other = continuous_generate(model, rows, seeds=[row_seed(8, i) for i in range(len(rows))], slots=4, **kw)
    assert other != ref  # and the seed matters
    via_rows = generate_rows(model, rows, pad_id=1, stop_ids=[0], max_new_tokens=MAX_NEW, temperature=0.9,
                             top_p=0.95, seed=7, batch=3)
    assert [g.ids for g in via_rows] == ref


def test_tiny_nucleus_is_greedy():
    model = _target("qwen2")
    rows = _rows(6)
    kw = dict(stop_ids=STOPS, max_new_tokens=MAX_NEW, slots=3)
    assert continuous_generate(model, rows, temperature=1.5, top_p=1e-6, **kw) == continuous_generate(
        model, rows, **kw)


def test_pick_draws_from_the_nucleus_of_the_scaled_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    n = 4000
    gens = [torch.Generator().manual_seed(3)]
    counts = torch.zeros(4)
    for _ in range(n):
        counts[pick(logits, 1.0, 1.0, gens)[0]] += 1
    assert torch.allclose(counts / n, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)
    counts.zero_()
    for _ in range(n):  # mass before token 2 is 0.8 >= 0.75: tokens 0 and 1 only, renormalised
        counts[pick(logits, 1.0, 0.75, gens)[0]] += 1
    assert counts[2:].sum() == 0 and abs(counts[0] / n - 0.5 / 0.8) < 0.03
    counts.zero_()
    for _ in range(n):  # temperature 2: probabilities proportional to sqrt(p)
        counts[pick(logits, 2.0, 1.0, gens)[0]] += 1
    want = torch.tensor([0.5, 0.3, 0.15, 0.05]).sqrt()
    assert torch.allclose(counts / n, want / want.sum(), atol=0.03)
    assert pick(torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]]), 0.0, 1.0, [None, None]) == [1, 0]


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_pick_past_the_top_tokens(top_p):
    """A flat distribution over 200 tokens: draws past the first TOP tokens (top_p 1) and a nucleus wider than TOP
    (top_p 0.9) follow the distribution too."""
    logits = torch.linspace(0.0, -2.0, 200)[torch.randperm(200, generator=torch.Generator().manual_seed(0))]
    p = torch.softmax(logits.double(), -1)
    assert p[logits.topk(continuous_batch.TOP).indices].sum() < 0.6  # draws often fall past the top tokens
    if top_p < 1:
        sp, order = p.sort(descending=True)
        keep = torch.zeros(200, dtype=torch.bool)
        keep[order[(sp.cumsum(-1) - sp) < top_p]] = True
        p = torch.where(keep, p, 0.0)
        p = p / p.sum()
        assert (p > 0).sum() > continuous_batch.TOP  # a nucleus wider than the top tokens
    n, gens = 8000, [torch.Generator().manual_seed(4)]
    counts = torch.zeros(200, dtype=torch.float64)
    for _ in range(n):
        counts[pick(logits[None], 1.0, top_p, gens)[0]] += 1
    assert counts[p == 0].sum() == 0
    buckets = logits.argsort(descending=True).view(10, 20)  # ten groups of 20 tokens, most likely first
    torch.testing.assert_close((counts / n)[buckets].sum(-1), p[buckets].sum(-1), rtol=0, atol=0.02)


def test_slots_are_independent_caches():
    """A row prefilled into a slot after another row left it, and a row moved between slots, continue as alone."""
    model = _target("llama")
    a, b = _rows(2, seed=5)
    with torch.inference_mode():
        alone = SlotLlama(model, 1, 80)
        alone.prefill(0, b)
        ref = alone.decode([4])[0]
        eng = SlotLlama(model, 2, 80)
        eng.prefill(0, a + a)  # a longer row first: its stale keys stay behind b's in slot 0 (masked)
        eng.prefill(1, b)
        eng.prefill(0, b)
        eng.move(0, 1)  # slot 1 takes b from slot 0
        eng.prefill(0, a)
        assert eng.lens == [len(a), len(b)]
        got = eng.decode([4, 4])[1]
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_generation_config_token_bias_is_applied_and_other_settings_fall_back():
    tok = hf_pairs.tokenizer(True)
    model = hf_pairs.models("llama", len(tok), seed=3)[1]
    rows = _rows(8)
    plain = continuous_generate(model, rows, stop_ids=STOPS, max_new_tokens=MAX_NEW, slots=3)
    model.generation_config.sequence_bias = [[[5], 3.0], [[7], -2.0], [[5], 2.5]]  # the last one for 5 counts
    assert continuous_batch.token_bias(model) == {5: 2.5, 7: -2.0} and supported(model)
    biased = continuous_generate(model, rows, stop_ids=STOPS, max_new_tokens=MAX_NEW, slots=3)
    assert biased == [_one_row_greedy(model, r) for r in rows] and biased != plain
    model.generation_config.repetition_penalty = 1.3
    assert not supported(model)
    gens = generate_rows(model, rows, pad_id=1, stop_ids=STOPS, max_new_tokens=MAX_NEW, batch=8)
    penalised = [_one_row_greedy(model, r) for r in rows]
    assert [g.ids for g in gens] == penalised != biased  # generate's penalty applied: the fallback ran


def test_other_models_fall_back_to_generate():
    tok = hf_pairs.tokenizer(False)
    model = hf_pairs.models("gpt2", len(tok))[1]
    assert not supported(model)
    rows = _rows(5)
    gens = generate_rows(model, rows, pad_id=1, stop_ids=STOPS, max_new_tokens=8, batch=2)
    assert all(isinstance(g, Generation) and 1 <= len(g.ids) <= 8 for g in gens)
    assert [g.ids for g in gens] == [_one_row_greedy(model, r)[:8] for r in rows]

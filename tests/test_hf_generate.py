"""generate() integration: a controller drives transformers' assisted generation (installed transformers 5.x).

Models are tiny RANDOMLY-INITIALISED GPT-2s (specgym.training.models.toy).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym import make_controller  # noqa: E402
from specgym.agents.hf_generate import generate_with_controller  # noqa: E402
from specgym.envs.core.cost import CostProfile  # noqa: E402
from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.training.models.toy import toy_models, toy_tokenizer  # noqa: E402

torch.set_num_threads(1)
PROFILE = CostProfile(name="toy", draft_ms=0.5, verify_ms=tuple(5.0 + 0.1 * n for n in range(17)), source="synthetic")
SPECS = ["fixed:0", "fixed:1", "fixed:4", "assc", "speclane", "hf-heuristic", "confidence", "cumulative", "entropy",
         "ucb"]


@pytest.fixture(scope="module")
def toy():
    tok = toy_tokenizer()
    draft, target = toy_models(len(tok), seed=0)
    # transformers' assistant stops drafting at the draft's own EOS even when the target ignores EOS
    # (eos_token_id=None below); the live engine never does. Take EOS out of the draft's generation config so that
    # both loops see the same rounds.
    draft.generation_config.eos_token_id = None
    return tok, draft, target


def _kw(ids, n):
    return dict(attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, eos_token_id=None,
                pad_token_id=1)


@pytest.mark.parametrize("spec", SPECS)
def test_output_identical_to_plain_greedy(toy, spec):
    tok, draft, target = toy
    for prompt in ["def f(x):\n  return", "the cat sat on", "1 + 2 ="]:
        ids = torch.tensor([tok(prompt)["input_ids"]])
        ref = target.generate(ids, **_kw(ids, 48))
        rounds = []
        out = generate_with_controller(target, draft, ids, make_controller(spec, 8), rounds=rounds, profile=PROFILE,
                                       **_kw(ids, 48))
        assert torch.equal(out, ref)
        assert sum(r.produced for r in rounds) == 48
        assert all(0 <= r.accepted <= r.drafted <= r.planned_k <= 8 for r in rounds)
        assert rounds[-1].done
    assert not hasattr(target, "_get_candidate_generator") or "_get_candidate_generator" not in vars(target)


@pytest.mark.parametrize("spec", ["fixed:3", "assc", "confidence", "entropy"])
def test_rounds_match_live_engine(toy, spec):
    """The same controller sees the same rounds in transformers' loop and in the live engine (greedy)."""
    tok, draft, target = toy
    ids = tok("def f(x):\n  return")["input_ids"]
    rounds = []
    t_ids = torch.tensor([ids])
    generate_with_controller(target, draft, t_ids, make_controller(spec, 8), rounds=rounds, profile=PROFILE,
                             **_kw(t_ids, 40))
    live = LiveEngine(draft, target, k_max=8, timing=PROFILE).run_request(ids, make_controller(spec, 8), 40)
    n = len(live.rounds)
    assert [(r.position, r.planned_k, r.drafted, r.accepted) for r in rounds[:n]] == \
        [(r.position, r.planned_k, r.drafted, r.accepted) for r in live.rounds[:n]]
    for a, b in zip(rounds[:n], live.rounds[:n]):
        torch.testing.assert_close(torch.from_numpy(a.draft_conf), torch.from_numpy(b.draft_conf), rtol=1e-4,
                                   atol=1e-5)


def test_confidence_threshold_disabled(toy):
    """transformers' default assistant_confidence_threshold (0.4) must not cut drafts: fixed:8 drafts 8."""
    tok, draft, target = toy
    ids = torch.tensor([tok("abc")["input_ids"]])
    rounds = []
    generate_with_controller(target, draft, ids, make_controller("fixed:8", 8), rounds=rounds, **_kw(ids, 40))
    assert all(r.drafted == r.planned_k == min(8, 40 - r.position - 1) for r in rounds)


def test_sampling_runs(toy):
    tok, draft, target = toy
    ids = torch.tensor([tok("abc")["input_ids"]])
    rounds = []
    out = generate_with_controller(target, draft, ids, make_controller("fixed:4", 8), rounds=rounds,
                                   attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=True,
                                   temperature=0.8, eos_token_id=None, pad_token_id=1)
    assert out.shape[1] == ids.shape[1] + 30 and sum(r.produced for r in rounds) == 30


def test_no_deprecation_warning_from_transformers(toy, caplog):
    """generate_with_controller passes one generation config (transformers deprecates config + loose arguments)."""
    import logging

    import transformers

    tok, draft, target = toy
    ids = torch.tensor([tok("abc")["input_ids"]])
    transformers.logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            generate_with_controller(target, draft, ids, make_controller("fixed:3", 8), **_kw(ids, 12))
    finally:
        transformers.logging.disable_propagation()
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("spec", ["fixed:3", "fixed:8", "confidence"])
def test_online_signals_equal_the_recorders(toy, spec):
    """generate_with_controller computes the live engine's pre-verification signals: at every correct-prefix draft
    token they equal the recorder's teacher-forced columns (top-8, lookup with rollback); no hidden sketch here."""
    from specgym.envs.engines.live.recorder import trace_columns

    tok, draft, target = toy
    compared = 0
    for prompt in ["def f(x):\n  return", "a b a b a b a"]:
        ids = torch.tensor([tok(prompt)["input_ids"]])
        rounds = []
        out = generate_with_controller(target, draft, ids, make_controller(spec, 8), rounds=rounds, **_kw(ids, 40))
        completion = out[0, ids.shape[1]:].tolist()
        cols = trace_columns(draft, target, ids[0].tolist(), completion, 0.0)
        # the random toy target emits the pad id (1) now and then; transformers' assistant then masks it out of its
        # own input, so its logits leave the teacher-forced ones: compare up to the first generated pad token
        first_pad = completion.index(1) if 1 in completion else len(completion)
        for r in rounds:
            sig = r.signals
            assert sig is not None and len(sig) == r.drafted and sig.hidden_sketch is None
            judged = max(0, min(r.accepted + 1, r.drafted, first_pad - r.position))
            rows = slice(r.position, r.position + judged)
            torch.testing.assert_close(torch.from_numpy(sig.topk[:judged]), torch.from_numpy(cols["draft_topk"][rows]),
                                       rtol=1e-4, atol=1e-5)
            assert sig.lookup_len[:judged].tolist() == cols["lookup_len"][rows].tolist()
            assert sig.lookup_agree[:judged].tolist() == cols["lookup_agree"][rows].tolist()
            compared += judged
    assert compared >= 10


def test_a_cache_folder_model_is_named_as_loaded():
    """A GGUF target converted into the cache (or a draft materialised there) carries the name it was loaded by, so a
    predictor trained on ``smollm2`` accepts transformers' generate() on it (the live bench's HF section refused it)."""
    from types import SimpleNamespace

    from specgym.agents.hf_generate import _model_name

    cached = SimpleNamespace(specgym_name="smollm2", name_or_path="/root/.cache/specgym/gguf/SmolLM2-135M-Instruct")
    assert _model_name(cached) == "smollm2"
    assert _model_name(SimpleNamespace(name_or_path="models/midpair/target")) == "models/midpair/target"

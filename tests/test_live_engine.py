"""Live engine: greedy equals target.generate, exact sampling, replay == live, clear errors.

All models here are tiny RANDOMLY-INITIALISED GPT-2s (specgym.training.models.toy), not trained models; the tests of
the shipped trained pairs are skipped when a pair is absent.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specgym import make_controller  # noqa: E402
from specgym.envs.core.controller import Controller  # noqa: E402
from specgym.envs.core.cost import CostProfile  # noqa: E402
from specgym.envs.core.rounds import DraftStep  # noqa: E402
from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.envs.engines.live.model_loading import check_same_tokenizer, encode_prompt, load_pair  # noqa: E402
from specgym.errors import SpecgymError  # noqa: E402
from specgym.paths import MODELS_DIR  # noqa: E402
from specgym.training.models.toy import save_toy_pair, toy_models, toy_tokenizer  # noqa: E402

torch.set_num_threads(1)

PROFILE = CostProfile(name="toy", draft_ms=0.5, verify_ms=tuple(5.0 + 0.1 * n for n in range(17)), source="synthetic")
CONTROLLERS = ["fixed:0", "fixed:1", "fixed:3", "fixed:8", "assc", "speclane", "hf-heuristic", "confidence",
               "confidence:adaptive", "cumulative", "entropy", "ucb"]
PROMPTS = ["def f(x):\n    return x + 1\n", "the cat sat on the mat. ", "12 + 7 = 19, 3 * 4 ="]


class RandomK(Controller):
    """Random K and random token-level stops (seeded): exercises every clipping and stopping path."""

    name = "random"
    token_level = True

    def __init__(self, seed: int = 0, k_max: int = 8):
        self.rng = np.random.default_rng(seed)
        self.k_max = k_max

    def propose(self) -> int:
        return int(self.rng.integers(0, self.k_max + 1))

    def keep_drafting(self, step: DraftStep) -> bool:
        return bool(self.rng.random() > 0.2)

    def observe(self, outcome) -> None:
        pass


@pytest.fixture(scope="module")
def toy():
    tok = toy_tokenizer()
    draft, target = toy_models(len(tok), seed=0)
    return tok, draft, target


def _greedy_reference(target, prompt, n):
    out = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=1)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("spec", CONTROLLERS + ["random"])
def test_greedy_equals_target_generate(toy, spec):
    tok, draft, target = toy
    eng = LiveEngine(draft, target, k_max=8, timing=PROFILE)
    for p in PROMPTS:
        ids = tok(p)["input_ids"]
        ctl = RandomK(1) if spec == "random" else make_controller(spec, 8)
        res = eng.run_request(ids, ctl, 60)
        assert res.tokens == _greedy_reference(target, ids, 60)
        assert sum(r.produced for r in res.rounds) == 60
        for r in res.rounds:
            assert r.produced == r.accepted + 1 and 0 <= r.accepted <= r.drafted <= r.planned_k
            assert len(r.draft_conf) == r.drafted == len(r.draft_entropy)
            assert r.time_ms == pytest.approx(PROFILE.round_time(r.drafted))
        assert res.rounds[-1].done and not any(r.done for r in res.rounds[:-1])


def test_clipping_and_k0(toy):
    tok, draft, target = toy
    eng = LiveEngine(draft, target, k_max=4, timing=PROFILE)
    res = eng.run_request(tok("abc")["input_ids"], make_controller("fixed:8", 8), 10)
    for r in res.rounds:
        assert r.planned_k == min(4, 10 - r.position - 1)
    plain = eng.run_plain(tok("abc")["input_ids"], 10)
    assert all(r.drafted == 0 and r.produced == 1 for r in plain.rounds) and len(plain.rounds) == 10
    assert plain.tokens == res.tokens


def _chi2_critical(dof: int, z: float = 3.09) -> float:
    """Upper 0.1% quantile of chi-square(dof) (Wilson-Hilferty; z = 3.09 is the normal 99.9% quantile)."""
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def _exact_joint(target, prompt, vocab, temperature):
    """Exact target distribution of the first three sampled tokens (vocab**3 cells)."""
    def probs(prefix):
        with torch.no_grad():
            logits = target(torch.tensor([prefix])).logits[0, -1, :vocab].double()
        return torch.softmax(logits / temperature, -1).numpy()

    joint = np.zeros((vocab,) * 3)
    p1 = probs(prompt)
    for a in range(vocab):
        p2 = probs(prompt + [a])
        for b in range(vocab):
            joint[a, b] = p1[a] * p2[b] * probs(prompt + [a, b])
    return joint


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_sampling_matches_target_distribution(temperature):
    """Chi-square: speculative sampling (K=2, tiny vocab 6) reproduces the target's joint law of 3 tokens."""
    vocab = 6
    draft, target = toy_models(vocab, seed=3, draft_noise=0.6, head_scale=0.8)
    eng = LiveEngine(draft, target, k_max=2, timing=PROFILE)
    prompt = [2, 3, 4]
    joint = _exact_joint(target, prompt, vocab, temperature)
    # power check: the draft's own law is far from the target's, so accepting drafts blindly would fail the test
    draft_joint = _exact_joint(draft, prompt, vocab, temperature)
    assert 0.5 * np.abs(draft_joint.sum(2) - joint.sum(2)).sum() > 0.1
    n = 3000
    counts = np.zeros((vocab,) * 3)
    rejected = 0
    for s in range(n):
        res = eng.run_request(prompt, make_controller("fixed:2", 2), 3, temperature=temperature, seed=s)
        counts[tuple(res.tokens)] += 1
        rejected += sum(r.drafted - r.accepted for r in res.rounds)
    assert rejected > n * 0.2  # the rejection/resampling path is exercised
    # pairwise joint of (x1, x2) and the marginal of x3: cells with enough expected mass
    for observed, expected in ((counts.sum(2), joint.sum(2)), (counts.sum((0, 1)), joint.sum((0, 1)))):
        obs, exp = observed.ravel(), expected.ravel() * n
        keep = exp >= 5
        obs_k = np.append(obs[keep], obs[~keep].sum())
        exp_k = np.append(exp[keep], exp[~keep].sum())
        if exp_k[-1] == 0:
            obs_k, exp_k = obs_k[:-1], exp_k[:-1]
        exp_k = exp_k * obs_k.sum() / exp_k.sum()
        stat = float(((obs_k - exp_k) ** 2 / exp_k).sum())
        assert stat < _chi2_critical(len(obs_k) - 1), (stat, len(obs_k) - 1)


def test_sampling_reproducible(toy):
    tok, draft, target = toy
    eng = LiveEngine(draft, target, k_max=8, timing=PROFILE)
    ids = tok("hello world")["input_ids"]
    a = eng.run_request(ids, make_controller("fixed:4", 8), 40, temperature=0.8, seed=5)
    b = eng.run_request(ids, make_controller("fixed:4", 8), 40, temperature=0.8, seed=5)
    assert a.tokens == b.tokens
    assert all(0 < c <= 1 for r in a.rounds for c in r.draft_conf)


def test_replay_equals_live(toy, tmp_path):
    """The simulator is exact: replaying the recorded greedy trace with the live run's K choices gives identical
    accepted counts round by round (several controllers, random K, token-level stops)."""
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.envs.workloads.prompts import PromptSpec

    draft_path, target_path = save_toy_pair(tmp_path / "pair", seed=0)
    pair = load_pair(str(draft_path), str(target_path))
    specs = [PromptSpec(f"r{i}", p, "toy") for i, p in enumerate(PROMPTS * 2)]
    wl, _ = record_workload(pair, specs, tmp_path / "toy.parquet", RecordingSpec(50, 0.0, PROFILE, gen_k=3))
    live = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE)
    replay = TraceEngine(wl, PROFILE, k_max=8, seed=0)
    ctls = ["fixed:2", "fixed:5", "assc", "hf-heuristic", "confidence", "cumulative", "entropy", "random"]
    n_rounds = 0
    for r, spec in enumerate(specs):
        ids = encode_prompt(pair.tokenizer, spec.text)
        for c in ctls:
            ctl = RandomK(r) if c == "random" else make_controller(c, 8)
            res = live.run_request(ids, ctl, int(wl.lengths[r]))
            rr = replay.start(r)
            for out in res.rounds:
                assert rr.position == out.position
                assert rr.clip(out.planned_k) == out.planned_k
                rep = rr.verify(out.planned_k, out.drafted)
                assert rep.accepted == out.accepted, (spec.request_id, c, out)
                # features of the accepted drafted tokens agree with the correct-prefix trace
                np.testing.assert_allclose(rep.draft_conf[: out.accepted], out.draft_conf[: out.accepted],
                                           rtol=1e-4, atol=1e-5)
                n_rounds += 1
            assert rr.done
    assert n_rounds > 100


def test_lean_forward_equals_transformers(toy):
    """The lean GPT-2 forward gives the transformers forward's logits (prefill, multi-token verify, one token, after
    a crop), and an engine on it decodes exactly as one on transformers, round by round."""
    from transformers import DynamicCache

    from specgym.envs.engines.live.lean_forward import lean_runner

    tok, draft, target = toy
    for model in (draft, target):
        runner = lean_runner(model)
        assert runner is not None
        lean_cache, ref_cache = runner.new_cache(), DynamicCache()
        with torch.inference_mode():
            for ids, crop in (([3, 9, 4, 7, 11, 5], 0), ([8, 2, 6], -2), ([10], 0), ([4, 4, 4, 4, 4], -1)):
                ref = model(input_ids=torch.tensor([ids]), cache=ref_cache, use_cache=True).logits[0]
                got = runner(ids, lean_cache)
                torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
                if crop:
                    ref_cache.crop(crop)
                    lean_cache.crop(crop)
                assert lean_cache.get_seq_length() == ref_cache.get_seq_length()
    assert LiveEngine(draft, target).lean and not LiveEngine(draft, target, lean=False).lean
    ids = tok("def f(x):", add_special_tokens=False)["input_ids"]
    for spec in ("fixed:3", "confidence", "marginal"):
        runs = [LiveEngine(draft, target, k_max=8, timing=PROFILE, lean=lean).run_request(
            ids, make_controller(spec, 8), 40) for lean in (True, False)]
        assert runs[0].tokens == runs[1].tokens
        assert [r.accepted for r in runs[0].rounds] == [r.accepted for r in runs[1].rounds]
        np.testing.assert_allclose(np.concatenate([r.draft_conf for r in runs[0].rounds]),
                                   np.concatenate([r.draft_conf for r in runs[1].rounds]), rtol=1e-4, atol=1e-5)


def test_bad_inputs(toy, tmp_path):
    tok, draft, target = toy
    with pytest.raises(SpecgymError, match="not found"):
        load_pair(str(tmp_path / "missing"), str(tmp_path / "missing2"))
    # tokenizers that differ
    d_path, t_path = save_toy_pair(tmp_path / "pair")
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(str(t_path))
    other.add_tokens(["<extra>"])
    other.save_pretrained(str(t_path))
    with pytest.raises(SpecgymError, match="tokenizers differ"):
        load_pair(str(d_path), str(t_path))
    with pytest.raises(SpecgymError, match="tokenizers differ"):
        check_same_tokenizer(toy_tokenizer(), other)
    # k_max beyond the model's context
    small_d, small_t = toy_models(len(tok), n_positions=8)
    with pytest.raises(SpecgymError, match="context"):
        LiveEngine(small_d, small_t, k_max=8)
    eng = LiveEngine(draft, target, k_max=8)
    with pytest.raises(SpecgymError, match="context"):
        eng.run_request([3] * 200, None, 100)
    with pytest.raises(SpecgymError, match="k_max"):
        LiveEngine(draft, target, k_max=17)


def test_bf16_target_is_exact_in_the_dtype_that_verifies(tmp_path):
    """A float32 draft with a bfloat16 target (per-model dtypes): greedy outputs equal the bf16 target's own greedy
    decoding token for token, and replay of a bf16-recorded trace equals the bf16 live run round by round."""
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.envs.workloads.prompts import PromptSpec

    d, t = save_toy_pair(tmp_path / "pair", seed=1)
    pair = load_pair(str(d), str(t), draft_dtype="float32", target_dtype="bfloat16")
    assert pair.target.dtype == torch.bfloat16 and pair.draft.dtype == torch.float32
    eng = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE)
    specs = [PromptSpec(f"r{i}", p, "toy") for i, p in enumerate(PROMPTS)]
    wl, _ = record_workload(pair, specs, tmp_path / "bf16.parquet", RecordingSpec(40, 0.0, PROFILE, gen_k=3))
    assert wl.source["dtype"] == "float32/bfloat16"
    replay = TraceEngine(wl, PROFILE, k_max=8, seed=0)
    for r, spec in enumerate(specs):
        ids = encode_prompt(pair.tokenizer, spec.text)
        for c in ("fixed:4", "confidence", "random"):
            ctl = RandomK(r) if c == "random" else make_controller(c, 8)
            res = eng.run_request(ids, ctl, 40)
            assert res.tokens == _greedy_reference(pair.target, ids, 40), c
            rr = replay.start(r)
            for out in res.rounds:
                assert rr.verify(out.planned_k, out.drafted).accepted == out.accepted


def test_a_dtype_the_device_cannot_run_is_one_clear_error(tmp_path, monkeypatch):
    """load_model runs one forward after loading; a failure there names the model, the dtype and the device."""
    import transformers

    from specgym.envs.engines.live.model_loading import load_model

    d, _ = save_toy_pair(tmp_path / "pair")

    def refuse(self, *a, **k):
        raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')

    monkeypatch.setattr(transformers.GPT2LMHeadModel, "forward", refuse)
    with pytest.raises(SpecgymError, match=r"--draft .*: cannot run in float16 on cpu \(.*not implemented"):
        load_model(str(d), "draft", "cpu", "fp16")
    with pytest.raises(SpecgymError, match="CUDA is not available|cannot run"):
        load_pair(str(d), str(d), device="cuda:7")


def _shipped(name: str):
    return pytest.param(name, marks=pytest.mark.skipif(
        not (MODELS_DIR / name / "target" / "config.json").exists(), reason=f"shipped pair {name} not built"))


@pytest.mark.parametrize("name", [_shipped("midpair"), _shipped("tinypair")])
def test_shipped_pair_greedy_matches_generate(name):
    """A shipped (trained) pair loads offline from fp16 files as float32 and decodes exactly."""
    pair = load_pair(str(MODELS_DIR / name / "draft"), str(MODELS_DIR / name / "target"))
    assert pair.target.dtype == torch.float32
    assert pair.target.config.eos_token_id == pair.tokenizer.eos_token_id != 50256
    eng = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE)
    ids = encode_prompt(pair.tokenizer, "def parse(self, text):\n")
    for spec in ("fixed:4", "marginal"):
        res = eng.run_request(ids, make_controller(spec, 8), 64)
        assert res.tokens == _greedy_reference(pair.target, ids, 64), spec
        assert res.accepted > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", [_shipped("midpair")])
def test_shipped_recorded_trace_replays_live(name):
    """The shipped greedy workload of a pair is what the pair does live: on test requests (first 48 tokens),
    replaying the recorded trace with the live run's K choices gives the live accepted counts round by round."""
    from specgym.envs.engines.replay.trace_engine import TraceEngine
    from specgym.envs.workloads.trace_format import cached_workload

    pair = load_pair(str(MODELS_DIR / name / "draft"), str(MODELS_DIR / name / "target"))
    wl = cached_workload(f"{name}-greedy")
    live = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE)
    replay = TraceEngine(wl, PROFILE, k_max=8, seed=0)
    test = wl.split_indices("test")
    picked = [int(next(r for r in test if wl.category[r] == cat)) for cat in wl.categories()]
    n_rounds = 0
    for r in picked:
        ids = encode_prompt(pair.tokenizer, wl.prompt_text[r])
        assert len(ids) == int(wl.prompt_len[r])
        for c in ("fixed:3", "marginal", "random"):
            ctl = RandomK(r) if c == "random" else make_controller(c, 8)
            res = live.run_request(ids, ctl, 48)
            rr = replay.start(r)
            for out in res.rounds:
                assert rr.position == out.position
                assert rr.verify(out.planned_k, out.drafted).accepted == out.accepted, (wl.request_id[r], c, out)
                n_rounds += 1
    assert n_rounds > 50


def test_live_gym_env(tmp_path):
    """SpecDecodeLive-v1 runs real rounds; with profile timing its rewards match the replay env's formula."""
    import gymnasium as gym

    import specgym  # noqa: F401  (registers the ids)
    from specgym.envs.gym.live_env import ENV_ID

    assert gym.spec(ENV_ID).nondeterministic
    d, t = save_toy_pair(tmp_path / "pair")
    env = gym.make(ENV_ID, draft=str(d), target=str(t), profile=PROFILE, prompts=["def f(x):", "abc"],
                   max_new_tokens=30)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    total, steps, done = 0, 0, False
    while not done:
        obs, reward, done, trunc, info = env.step(env.action_space.sample())
        assert reward == pytest.approx(info["produced"] - PROFILE.round_time(info["drafted"]) / PROFILE.t_ar_ms)
        total += info["produced"]
        steps += 1
    assert total == 30 and len(info["tokens"]) == 30
    env.close()


# ------------------------------------------------------------------------------------------------ online signals
class StepLog(RandomK):
    """RandomK that keeps the signals of every DraftStep it is shown."""

    def __init__(self, seed: int = 0, k_max: int = 8):
        super().__init__(seed, k_max)
        self.steps: list[DraftStep] = []

    def keep_drafting(self, step: DraftStep) -> bool:
        self.steps.append(step)
        return super().keep_drafting(step)


def assert_online_signals_match(wl, r, rounds, sketch=True):
    """At every draft token whose earlier drafts in the round were all accepted (the correct prefix), the online
    signals equal the recorded columns of that position. Returns the number of positions compared."""
    base, compared = int(wl.offsets[r]), 0
    for out in rounds:
        sig = out.signals
        assert sig is not None and len(sig) == out.drafted
        judged = min(out.accepted + 1, out.drafted)
        rows = slice(base + out.position, base + out.position + judged)
        np.testing.assert_allclose(sig.topk[:judged], wl.draft_topk[rows], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(sig.lookup_len[:judged], wl.lookup_len[rows])
        np.testing.assert_array_equal(sig.lookup_agree[:judged], wl.lookup_agree[rows])
        if sketch:
            np.testing.assert_allclose(sig.hidden_sketch[:judged], wl.hidden_sketch[rows], rtol=1e-3, atol=1e-3)
        compared += judged
    return compared


def test_online_signals_equal_the_recorders(tmp_path):
    """The live engine's online signals (top-8, incremental lookup with rollback, hidden sketch) equal the
    recorder's teacher-forced columns at every correct-prefix draft token; DraftStep carries the same rows."""
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.workloads.prompts import PromptSpec

    d, t = save_toy_pair(tmp_path / "pair", seed=0)
    pair = load_pair(str(d), str(t))
    specs = [PromptSpec(f"r{i}", p, "toy") for i, p in enumerate(PROMPTS)]
    wl, _ = record_workload(pair, specs, tmp_path / "sig.parquet",
                            RecordingSpec(50, 0.0, PROFILE, gen_k=3, hidden_sketch=5))
    live = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE, sketch=wl.sketch_projection())
    compared = 0
    for r, spec in enumerate(specs):
        ids = encode_prompt(pair.tokenizer, spec.text)
        for c in ("fixed:4", "fixed:8", "random"):
            ctl = StepLog(r) if c == "random" else make_controller(c, 8)
            res = live.run_request(ids, ctl, 50)
            assert res.tokens == wl.token_id[wl.span(r)].tolist()
            compared += assert_online_signals_match(wl, r, res.rounds)
            for step in getattr(ctl, "steps", []):
                assert len(step.signals) == step.index
                out = next(o for o in res.rounds if o.position == step.position - step.index + 1)
                np.testing.assert_array_equal(step.signals.topk, out.signals.topk[: step.index])
    assert compared > 100
    # sampling: same definitions at the decoding temperature (values differ from a trace: different draws)
    res = live.run_request(ids, make_controller("fixed:4", 8), 30, temperature=0.8, seed=1)
    topk = np.concatenate([o.signals.topk for o in res.rounds])
    assert np.all(np.diff(topk, axis=1) <= 0) and np.all(topk.sum(1) <= 1 + 1e-4) and np.all(topk[:, 0] > 0)
    off = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE, signals=False).run_request(ids, 4, 20)
    assert all(o.signals is None for o in off.rounds)


@pytest.mark.parametrize("name", [_shipped("midpair")])
def test_shipped_pair_online_signals_equal_the_recorders(name, tmp_path):
    """On a few requests of the shipped midpair (greedy, recorded here with a short completion), the live engine's
    online signals equal the recorder's at every correct-prefix draft token."""
    from specgym.envs.engines.live.recorder import RecordingSpec, record_workload
    from specgym.envs.workloads.prompts import PromptSpec
    from specgym.envs.workloads.trace_format import cached_workload

    pair = load_pair(str(MODELS_DIR / name / "draft"), str(MODELS_DIR / name / "target"))
    shipped = cached_workload(f"{name}-greedy")
    test = shipped.split_indices("test")
    picked = [int(next(r for r in test if shipped.category[r] == cat)) for cat in shipped.categories()]
    specs = [PromptSpec(str(shipped.request_id[r]), shipped.prompt_text[r], str(shipped.category[r]))
             for r in picked]
    wl, _ = record_workload(pair, specs, tmp_path / "mid.parquet", RecordingSpec(48, 0.0, PROFILE, hidden_sketch=16))
    live = LiveEngine.from_pair(pair, k_max=8, timing=PROFILE, sketch=wl.sketch_projection())
    compared = 0
    for r, spec in enumerate(specs):
        ids = encode_prompt(pair.tokenizer, spec.text)
        for c in ("fixed:3", "marginal", "random"):
            ctl = RandomK(r) if c == "random" else make_controller(c, 8)
            res = live.run_request(ids, ctl, 48)
            assert res.tokens == wl.token_id[wl.span(r)].tolist()
            compared += assert_online_signals_match(wl, r, res.rounds)
    assert compared > 100

"""Live speculative decoding with a real Hugging Face draft/target pair (batch size 1).

The live engine runs the models and emits the same :class:`RoundOutcome` records as the trace-replay engine, so
any :class:`Controller` can drive either. Semantics follow REFERENCES section 1:

* the controller's K is clipped to ``min(K, k_max, N - i - 1)`` (drafting past the end is useless);
* the draft proposes tokens one at a time; after token ``j < cap`` a token-level controller may stop;
* the target verifies ``drafted + 1`` positions in one forward; greedy accepts while the draft token equals the
  target's argmax, sampling uses exact rejection sampling (accept x with ``min(1, p(x)/q(x))``, on rejection
  resample from ``normalize(max(0, p - q))``, bonus token from ``p``), so outputs are distributed as the target's;
* the round produces ``accepted + 1`` tokens.

KV caches: both models keep a ``DynamicCache``. The target cache always holds every token but the last one; each
round feeds ``[last, d_1..d_drafted]`` and crops the rejected suffix afterwards. The draft cache holds a prefix of
the accepted sequence and catches up (feeding one or two tokens) at the start of the next round. In transformers
5.x ``DynamicCache.crop(n)`` takes ``n <= 0`` = the number of tokens to remove (a positive value raises), and the
model forward takes ``cache=`` (``past_key_values=`` is deprecated).

Draft features of each drafted token (``RoundOutcome.draft_conf`` / ``draft_entropy``): greedy: the draft's max
probability and entropy of ``softmax(logits)``; sampling: the draft's probability of the token it sampled and the
entropy of ``softmax(logits / T)``. The recorder computes trace columns with exactly the same definitions.

Timing: ``timing="wall"`` measures each round with ``time.perf_counter`` (CUDA-synchronised on GPU);
``timing="cpu"`` measures the calling thread's CPU time (``time.thread_time``): on a CPU shared with other jobs it
excludes the time the process was preempted, and with one torch thread it is the compute the round cost (CPU
device only); passing a :class:`CostProfile` prices each round with the cost model (deterministic, for tests and
simulations).
The engine never stops at EOS unless ``stop_at_eos=True`` (traces need fixed-length completions).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from specgym.baselines.base import Controller
from specgym.envs.cost import CostProfile
from specgym.envs.rounds import DraftStep, RequestContext, RoundOutcome
from specgym.envs.trace_engine import check_k_max
from specgym.errors import SpecgymError



# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------


def _looks_like_path(name: str) -> bool:
    """Hub names are ``model`` or ``org/model``; anything else with a path shape is a local path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def resolve_model_path(name: str, role: str) -> str:
    """Return a loadable model reference; a local path that does not exist is a clear error.

    Hub names (``org/model``) pass through; with ``HF_HUB_OFFLINE=1`` they must be in the local cache.
    """
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise SpecgymError(f"--{role} {name}: folder has no config.json (not a Hugging Face model folder)")
        return str(p)
    if _looks_like_path(name):
        raise SpecgymError(f"--{role} {name}: model path not found")
    return name


def torch_dtype(name: str):
    """Map ``float32``/``bfloat16``/``float16`` to a torch dtype."""
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise SpecgymError(f"--dtype {name!r}: choose one of float32, bfloat16, float16")
    return table[name]


def load_model(name: str, role: str, device: str = "cpu", dtype: str = "float32"):
    """Load a causal LM for inference (eval mode, no grad)."""
    from transformers import AutoModelForCausalLM

    ref = resolve_model_path(name, role)
    try:
        model = AutoModelForCausalLM.from_pretrained(ref, dtype=torch_dtype(dtype))
    except OSError as exc:
        raise SpecgymError(f"--{role} {name}: cannot load model ({str(exc).splitlines()[0]})") from None
    return model.to(device).eval()


def load_tokenizer(name: str, role: str):
    """Load the tokenizer stored with a model."""
    from transformers import AutoTokenizer

    ref = resolve_model_path(name, role)
    try:
        return AutoTokenizer.from_pretrained(ref)
    except (OSError, ValueError) as exc:
        raise SpecgymError(f"--{role} {name}: cannot load tokenizer ({str(exc).splitlines()[0]})") from None


def check_same_tokenizer(tok_draft, tok_target, draft_name: str = "draft", target_name: str = "target") -> None:
    """Speculative decoding needs one token space: the two vocabularies must be identical."""
    vd, vt = tok_draft.get_vocab(), tok_target.get_vocab()
    if vd != vt:
        diff = len(set(vd.items()) ^ set(vt.items()))
        raise SpecgymError(
            f"tokenizers differ: draft {draft_name} ({len(vd)} tokens) vs target {target_name} ({len(vt)} tokens), "
            f"{diff} mismatching entries; the pair must share one tokenizer"
        )


def context_limit(model) -> int:
    """Longest sequence the model accepts (``n_positions``/``max_position_embeddings``), or a large number."""
    cfg = model.config
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return 1 << 30


@dataclass
class LivePair:
    """A loaded draft/target pair sharing one tokenizer."""

    draft: Any
    target: Any
    tokenizer: Any
    draft_name: str
    target_name: str
    device: str = "cpu"
    dtype: str = "float32"


def load_pair(draft: str, target: str, device: str = "cpu", dtype: str = "float32") -> LivePair:
    """Load both models and check that they share a tokenizer (local paths or hub names)."""
    tok_d = load_tokenizer(draft, "draft")
    tok_t = load_tokenizer(target, "target")
    check_same_tokenizer(tok_d, tok_t, draft, target)
    d = load_model(draft, "draft", device, dtype)
    t = load_model(target, "target", device, dtype)
    return LivePair(d, t, tok_t, draft, target, device, dtype)


# ----------------------------------------------------------------------------------------------------------------
# Engine
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class LiveResult:
    """One request decoded by the live engine.

    Attributes:
        tokens: The completion token ids (``N`` of them, fewer if ``stop_at_eos`` fired).
        rounds: One :class:`RoundOutcome` per round.
        time_ms: Total decode time (sum of round times), excluding the prompt prefill.
        prefill_ms: Prompt prefill time of both models (wall clock).
    """

    tokens: list[int]
    rounds: list[RoundOutcome] = field(default_factory=list)
    time_ms: float = 0.0
    prefill_ms: float = 0.0

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def acceptance(self) -> float:
        """Accepted / drafted over the request (NaN when nothing was drafted)."""
        d = self.drafted
        return self.accepted / d if d else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / (self.time_ms / 1000.0) if self.time_ms > 0 else float("nan")


class LiveEngine:
    """Speculative decoding with a real pair; one request at a time.

    Args:
        draft: The draft model (``PreTrainedModel``, causal LM).
        target: The target model; same tokenizer as the draft.
        k_max: Largest draft cap (1..16).
        timing: ``"wall"`` (measured) or a :class:`CostProfile` (each round priced by the cost model).
        profile: Cost profile given to controllers in their :class:`RequestContext` (defaults to ``timing`` when
            it is a profile, else a flat placeholder: pass a measured profile for cost-aware controllers).
        eos_token_id: Used only with ``stop_at_eos``.
    """

    def __init__(self, draft, target, k_max: int = 8, timing: str | CostProfile = "wall",
                 profile: CostProfile | None = None, eos_token_id: int | None = None):
        import torch

        check_k_max(k_max)
        self.draft = draft
        self.target = target
        self.k_max = k_max
        self.context = min(context_limit(draft), context_limit(target))
        if k_max + 2 > self.context:
            raise SpecgymError(f"k_max={k_max} is beyond the models' context of {self.context} tokens")
        if isinstance(timing, CostProfile):
            timing.check_k_max(k_max)
        elif timing not in ("wall", "cpu"):
            raise SpecgymError(f"timing must be 'wall', 'cpu' or a CostProfile, got {timing!r}")
        self.timing = timing
        self.profile = profile if profile is not None else (timing if isinstance(timing, CostProfile) else None)
        if self.profile is not None:
            self.profile.check_k_max(k_max)
        self.eos_token_id = eos_token_id
        self.device = target.device
        self._cuda = self.device.type == "cuda"
        if timing == "cpu" and self._cuda:
            raise SpecgymError("timing='cpu' measures CPU time and is meaningless on a CUDA device; use 'wall'")
        self._clock = time.thread_time if timing == "cpu" else time.perf_counter
        self.vocab = min(draft.get_output_embeddings().weight.shape[0], target.get_output_embeddings().weight.shape[0])
        self._torch = torch

    @classmethod
    def from_pair(cls, pair: LivePair, **kw) -> "LiveEngine":
        """Engine over a :class:`LivePair` (EOS id taken from its tokenizer)."""
        kw.setdefault("eos_token_id", pair.tokenizer.eos_token_id)
        return cls(pair.draft, pair.target, **kw)

    # ------------------------------------------------------------------------------------------ helpers
    def context_for(self, request_id: str, prompt_len: int, temperature: float, category: str = "live") -> RequestContext:
        """The :class:`RequestContext` a controller sees (costs from the engine's profile, if any)."""
        if self.profile is not None:
            draft_ms, verify = self.profile.draft_ms, self.profile.verify_table(self.k_max)
            overhead = self.profile.round_overhead_ms
        else:
            draft_ms, verify, overhead = 1.0, (0.0,) + (10.0,) * (self.k_max + 1), 0.0
        return RequestContext(request_id, category, float(temperature), int(prompt_len), self.k_max, draft_ms,
                              verify, overhead)

    def _sync(self) -> None:
        if self._cuda:
            self._torch.cuda.synchronize()

    def _fwd(self, model, ids: list[int], cache):
        """Logits ``(len(ids), V)`` of one cached forward (float32)."""
        torch = self._torch
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = model(input_ids=x, cache=cache, use_cache=True)
        return out.logits[0, :, : self.vocab].float()

    def check_request(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise if a request does not fit the models' context."""
        if prompt_len < 1:
            raise SpecgymError("prompt must contain at least one token")
        if max_new_tokens < 1:
            raise SpecgymError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if prompt_len + max_new_tokens > self.context:
            raise SpecgymError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the models' context "
                f"of {self.context} tokens"
            )

    # ------------------------------------------------------------------------------------------ decoding
    def start(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
              stop_at_eos: bool = False) -> "LiveRequest":
        """Prefill both models with the prompt and return a request to play round by round."""
        return LiveRequest(self, prompt_ids, max_new_tokens, temperature, seed, stop_at_eos)

    def run_request(self, prompt_ids: Sequence[int], controller: Controller | None, max_new_tokens: int,
                    temperature: float = 0.0, seed: int = 0, request_id: str = "live", category: str = "live",
                    stop_at_eos: bool = False, k_schedule: Sequence[int] | None = None) -> LiveResult:
        """Decode one request with speculative decoding driven by ``controller``.

        Args:
            prompt_ids: Prompt token ids.
            controller: Chooses K each round (``None`` = plain autoregressive decoding, K = 0).
            max_new_tokens: Completion length N.
            temperature: 0 = greedy; > 0 = exact speculative sampling at that temperature.
            seed: Seed of the sampling generator (sampling only).
            request_id, category: Passed to the controller's :class:`RequestContext`.
            stop_at_eos: Stop after the target emits EOS.
            k_schedule: Instead of a controller, the draft cap of each round in order (tests, replays).

        Returns:
            A :class:`LiveResult` with the completion tokens and one :class:`RoundOutcome` per round.
        """
        req = self.start(prompt_ids, max_new_tokens, temperature, seed, stop_at_eos)
        if controller is not None:
            controller.reset(self.context_for(request_id, len(req.prompt), temperature, category))
        keep = controller.keep_drafting if controller is not None and getattr(controller, "token_level", False) \
            else None
        sched = list(k_schedule) if k_schedule is not None else None
        rnd = 0
        while not req.done:
            if sched is not None:
                k = sched[rnd] if rnd < len(sched) else 0
            elif controller is not None:
                k = int(controller.propose())
            else:
                k = 0
            outcome = req.play(k, keep)
            if controller is not None:
                controller.observe(outcome)
            rnd += 1
        return req.result

    def run_plain(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                  seed: int = 0) -> LiveResult:
        """Plain autoregressive decoding with the target alone (KV cache), the baseline of every speedup."""
        return self.run_request(prompt_ids, None, max_new_tokens, temperature, seed)


class LiveRequest:
    """One request being decoded: call :meth:`play` with a draft cap until :attr:`done` (like ``ReplayRequest``).

    Attributes:
        position: Next completion position ``i``.
        length: Completion length ``N``.
        done: True once the completion is finished.
        result: The :class:`LiveResult` so far (tokens, rounds, time).
    """

    def __init__(self, engine: LiveEngine, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float,
                 seed: int, stop_at_eos: bool):
        import torch
        from transformers import DynamicCache

        self.engine = engine
        self.prompt = [int(t) for t in prompt_ids]
        self.length = int(max_new_tokens)
        engine.check_request(len(self.prompt), self.length)
        if temperature < 0 or not math.isfinite(temperature):
            raise SpecgymError(f"temperature must be >= 0, got {temperature}")
        self.temperature = float(temperature)
        self.greedy = temperature == 0
        self.gen = None
        if not self.greedy:
            self.gen = torch.Generator(device=engine.device)
            self.gen.manual_seed(int(seed))
        self.stop_at_eos = stop_at_eos
        self.position = 0
        self.done = False
        with torch.inference_mode():
            t0 = engine._clock()
            self.tcache = DynamicCache()
            self.dcache = DynamicCache()
            self.seq = list(self.prompt)
            if len(self.seq) > 1:
                engine._fwd(engine.target, self.seq[:-1], self.tcache)
                engine._fwd(engine.draft, self.seq[:-1], self.dcache)
            engine._sync()
            self.result = LiveResult(tokens=[], prefill_ms=(engine._clock() - t0) * 1000.0)

    def clip(self, k: int) -> int:
        """The draft cap the engine will use for a requested ``k``."""
        if k < 0:
            raise SpecgymError(f"draft length K must be >= 0, got {k}")
        return min(int(k), self.engine.k_max, self.length - self.position - 1)

    def play(self, k: int, keep_drafting: Callable[[DraftStep], bool] | None = None) -> RoundOutcome:
        """Play one round with draft cap ``k``; ``keep_drafting`` may stop after draft token ``j < cap``."""
        if self.done:
            raise SpecgymError("request already finished; start a new one")
        eng = self.engine
        torch = eng._torch
        with torch.inference_mode():
            return self._play(eng, torch, self.clip(k), keep_drafting)

    def _play(self, eng: LiveEngine, torch, cap: int, keep_drafting) -> RoundOutcome:
        i, n, seq = self.position, self.length, self.seq
        greedy, temperature, gen = self.greedy, self.temperature, self.gen
        tcache, dcache = self.tcache, self.dcache
        r0 = eng._clock()
        drafts: list[int] = []
        q_probs: list = []
        confs: list[float] = []
        ents: list[float] = []
        if cap > 0:
            # catch the draft cache up with the accepted sequence, then propose one token at a time
            feed = seq[dcache.get_seq_length():]
            for j in range(1, cap + 1):
                logits = eng._fwd(eng.draft, feed, dcache)[-1]
                if greedy:
                    probs = torch.softmax(logits, -1)
                    tok = int(torch.argmax(logits))
                else:
                    probs = torch.softmax(logits / temperature, -1)
                    tok = int(torch.multinomial(probs, 1, generator=gen))
                    q_probs.append(probs)
                conf = float(probs[tok])
                ent = float(-(probs * torch.log(probs.clamp_min(1e-30))).sum())
                drafts.append(tok)
                confs.append(conf)
                ents.append(ent)
                if j < cap and keep_drafting is not None and not keep_drafting(DraftStep(j, cap, i + j - 1, conf, ent)):
                    break
                feed = [tok]
        drafted = len(drafts)
        # verify: the target sees [last token, d_1..d_drafted]
        tlogits = eng._fwd(eng.target, [seq[-1]] + drafts, tcache)
        if greedy:
            targ = torch.argmax(tlogits, -1).tolist()
            accepted = 0
            while accepted < drafted and drafts[accepted] == targ[accepted]:
                accepted += 1
            extra = targ[accepted]
        else:
            p_all = torch.softmax(tlogits / temperature, -1)
            accepted = 0
            extra = None
            while accepted < drafted:
                x = drafts[accepted]
                p, q = p_all[accepted], q_probs[accepted]
                px, qx = float(p[x]), float(q[x])
                u = float(torch.rand((), generator=gen, device=eng.device))
                if qx > 0 and u < min(1.0, px / qx):
                    accepted += 1
                    continue
                resid = torch.clamp(p - q, min=0)
                s = float(resid.sum())
                resid = resid / s if s > 0 else p
                extra = int(torch.multinomial(resid, 1, generator=gen))
                break
            if extra is None:
                extra = int(torch.multinomial(p_all[drafted], 1, generator=gen))
        new = drafts[:accepted] + [extra]
        # roll back both caches to the accepted prefix (transformers 5.x: crop takes minus the tokens to remove)
        if drafted > accepted:
            tcache.crop(-(drafted - accepted))
        dlen = dcache.get_seq_length()
        keep = len(seq) + min(accepted, max(drafted - 1, 0))
        if dlen > keep:
            dcache.crop(-(dlen - keep))
        seq.extend(new)
        eng._sync()
        measured_ms = (eng._clock() - r0) * 1000.0
        produced = accepted + 1
        i_end = i + produced
        if self.stop_at_eos and eng.eos_token_id is not None and eng.eos_token_id in new:
            produced = new.index(eng.eos_token_id) + 1  # tokens after EOS are discarded
            accepted = produced - 1
            new = new[:produced]
            i_end = n
        time_ms = eng.timing.round_time(drafted) if isinstance(eng.timing, CostProfile) else measured_ms
        self.position = i_end
        self.done = i_end >= n
        outcome = RoundOutcome(i, cap, drafted, accepted, produced, time_ms, np.asarray(confs, dtype=np.float32),
                               np.asarray(ents, dtype=np.float32), done=self.done)
        res = self.result
        res.tokens.extend(new)
        if len(res.tokens) > n:
            del res.tokens[n:]
        res.rounds.append(outcome)
        res.time_ms += time_ms
        return outcome

"""Loading a Hugging Face draft/target pair for the live engine: model references, dtypes, tokenizers, kernels.

A pair is two causal LMs sharing one tokenizer (:func:`check_same_tokenizer`), each in its own dtype, checked to run
on the device they are loaded on, with the linear kernels measured fastest on this machine
(:mod:`specgym.envs.engines.live.fast_linear`). Local folders and hub names are accepted; a missing folder, a folder
that
is not a model, a dtype the device cannot compute in or a tokenizer mismatch is one line naming the option.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specgym.catalogue import external_target
from specgym.envs.engines.live.draft_head import load_head, pair_head_folder
from specgym.envs.engines.live.draft_vocab import restrict_draft_vocab
from specgym.envs.engines.live.fast_linear import engine_forward, pack_linears, select_kernels
from specgym.envs.engines.live.model_cache import borrowing, gguf_folder, materialized_draft
from specgym.errors import SpecgymError
from specgym.paths import portable_name


def _looks_like_path(name: str) -> bool:
    """Hub names are ``model`` or ``org/model``; anything else with a path shape is a local path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def resolve_model_path(name: str, role: str) -> str:
    """Return a loadable model reference; a local path that does not exist is a clear error.

    A ``.gguf`` file, or the short name of a shipped pair whose target a package installs (``smollm2``), becomes its
    converted folder in specgym's cache; a draft folder that borrows tensors from its target becomes its
    materialized copy there (:mod:`specgym.envs.engines.live.model_cache`). A folder named ``*.gguf`` is a model folder
    when it holds ``config.json``, else an error saying it is not a GGUF file. Hub names (``org/model``) pass
    through; with ``HF_HUB_OFFLINE=1`` they must be in the local cache.
    """
    p = Path(name).expanduser()
    if p.suffix == ".gguf" and not (p / "config.json").is_file():
        return str(gguf_folder(p, f"--{role}"))
    if not p.exists() and (packaged := external_target(name)) is not None:
        return str(gguf_folder(packaged, f"--{role}"))
    if p.exists():
        if (rec := borrowing(p)) is not None:
            return str(materialized_draft(p, resolve_model_path(rec["target"], "target")))
        if not (p / "config.json").exists():
            raise SpecgymError(f"--{role} {name}: folder has no config.json (not a Hugging Face model folder)")
        return str(p)
    if _looks_like_path(name):
        raise SpecgymError(f"--{role} {name}: model path not found")
    return name


DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
                  "float16": "float16", "fp16": "float16"}


def dtype_name(name: str, option: str = "--dtype") -> str:
    """The canonical name (``float32``/``bfloat16``/``float16``) of a dtype option value."""
    canon = _DTYPE_ALIASES.get(str(name).lower())
    if canon is None:
        raise SpecgymError(f"{option} {name!r}: choose one of {', '.join(DTYPES)}")
    return canon


def torch_dtype(name: str, option: str = "--dtype"):
    """The torch dtype of a dtype option value."""
    import torch

    return getattr(torch, dtype_name(name, option))


def native_bf16_cpu() -> bool:
    """True when this CPU computes bfloat16 matrix products natively (AVX512-BF16 or AMX)."""
    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX512_BF16", "AMX") or _cpu_flag("amx_bf16") \
        or _cpu_flag("avx512_bf16")


def _cpu_flag(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and f" {flag}" in line for line in f)
    except OSError:
        return False


#: What the engine runs, for the error naming an unsupported family.
SUPPORTED_FAMILIES = ("decoder-only causal LMs with a key/value cache transformers can crop (tested: gpt2, llama, "
                      "qwen2, mistral, gpt_neox, phi)")
#: State-space and recurrent families: they load as causal LMs but keep a recurrent state, not a croppable cache.
_RECURRENT = ("mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm", "jamba", "zamba", "zamba2",
              "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h", "lfm2")


def unsupported_family(name: str, role: str, family: str, why: str) -> SpecgymError:
    """The one-line error of a model family the engine cannot run: names the family and what is supported."""
    return SpecgymError(f"--{role} {name}: model family {family!r} ({why}) is not supported; specgym runs "
                        f"{SUPPORTED_FAMILIES}")


def check_family(name: str, role: str, ref: str) -> Any:
    """The model's config, after refusing families the engine cannot run (before any weight is loaded)."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(ref)
    except (OSError, ValueError, KeyError) as exc:
        raise SpecgymError(f"--{role} {name}: cannot load model config ({_first_line(exc)})") from None
    family = str(getattr(cfg, "model_type", "") or type(cfg).__name__)
    if getattr(cfg, "is_encoder_decoder", False):
        raise unsupported_family(name, role, family, "encoder-decoder")
    if family in _RECURRENT:
        raise unsupported_family(name, role, family, "state-space/recurrent, no key/value cache")
    return cfg


def _probe_cache(model: Any, device: str) -> None:
    """Decode two tokens through a ``DynamicCache``, crop one and decode it again: the engine's cache moves."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    x = torch.zeros((1, 3), dtype=torch.long, device=device)
    with torch.inference_mode():
        model(input_ids=x[:, :2], cache=cache, use_cache=True)
        cache.crop(-1)
        if cache.get_seq_length() != 1:
            raise RuntimeError("the cache did not crop")
        model(input_ids=x[:, 1:3], cache=cache, use_cache=True)


def load_model(name: str, role: str, device: str = "cpu", dtype: str = "float32"):
    """Load a causal LM for inference (eval mode) in ``dtype`` on ``device``; check that it runs there.

    A dtype the device cannot compute in raises one clear line naming the model, the dtype and the device; a model
    family the engine cannot run (encoder-decoder, state-space, no croppable cache) one line naming the family and
    what is supported.
    """
    import torch
    from transformers import AutoModelForCausalLM

    ref = resolve_model_path(name, role)
    dt = torch_dtype(dtype, f"--{role}-dtype")
    cfg = check_family(name, role, ref)
    family = str(getattr(cfg, "model_type", "") or type(cfg).__name__)
    try:
        model = AutoModelForCausalLM.from_pretrained(ref, dtype=dt)
    except OSError as exc:
        raise SpecgymError(f"--{role} {name}: cannot load model ({_first_line(exc)})") from None
    except (ValueError, KeyError) as exc:  # no causal-LM class for this config
        raise unsupported_family(name, role, family, f"no causal LM: {_first_line(exc)[:120]}") from None
    except Exception as exc:  # noqa: BLE001 - a folder transformers cannot build (mismatched shapes, missing code)
        raise SpecgymError(f"--{role} {name}: cannot load model ({type(exc).__name__}: {_first_line(exc)})") from None
    if role == "draft":  # a draft whose folder names a reduced vocabulary scores only those tokens
        restrict_draft_vocab(model, ref)
    try:
        model = model.to(device).eval()  # type: ignore[arg-type]  # transformers stub of .to
        with torch.inference_mode():
            model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device))
    except (RuntimeError, TypeError) as exc:
        raise SpecgymError(f"--{role} {name}: cannot run in {dtype_name(dtype)} on {device} "
                           f"({_first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - a forward that fails otherwise: the family cannot run here
        raise unsupported_family(name, role, family, f"its forward fails: {type(exc).__name__}") from None
    try:
        _probe_cache(model, device)
    except Exception as exc:  # noqa: BLE001 - any failure of a cached decode step means the family cannot run
        raise unsupported_family(name, role, family, f"its cache cannot be cropped: {type(exc).__name__}") from None
    # the name the user gave (``smollm2``, ``models/smollm2/draft``): a converted or materialised folder in the cache
    # is the same model, and predictors name it so (hf_generate's signal source reads this)
    model.specgym_name = portable_name(name)
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_tokenizer(name: str, role: str):
    """Load the tokenizer stored with a model."""
    from transformers import AutoTokenizer

    ref = resolve_model_path(name, role)
    try:
        return AutoTokenizer.from_pretrained(ref)
    except Exception as exc:  # noqa: BLE001 - OSError, ValueError, a broken tokenizer file: one line either way
        raise SpecgymError(f"--{role} {name}: cannot load tokenizer ({_first_line(exc)})") from None


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """A prompt's token ids as the model's users send it. A tokenizer with a chat template (an instruct model such
    as SmolLM2-135M-Instruct) gets the text as one user turn followed by the assistant's generation prompt
    (``apply_chat_template``); any other tokenizer encodes the text by default, with the special tokens it adds (the
    BOS token of Llama- and Mistral-style tokenizers; nothing for GPT-2's). Every live path (record, generate, the
    live env, the live bench, drafter training) encodes prompts here, so a trace and its live replay see the same
    ids."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
        return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    return [int(t) for t in tokenizer(text)["input_ids"]]


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
    """A loaded draft/target pair sharing one tokenizer.

    Attributes:
        draft, target: The models (eval mode).
        tokenizer: The shared tokenizer.
        draft_name, target_name: Where they came from (paths or hub names).
        device: Where they run.
        draft_dtype, target_dtype: The dtype each model computes in.
        packed: Linear layers given kernels chosen by measurement (:mod:`specgym.envs.engines.live.fast_linear`).
        kernels: The measured kernel plan of each model (``{"draft": plan, "target": plan}``; empty when no layer
            was swapped).
        head: The draft head trained for the target (:mod:`~specgym.envs.engines.live.draft_head`; a pair folder's
            ``head/``), or None.
    """

    draft: Any
    target: Any
    tokenizer: Any
    draft_name: str
    target_name: str
    device: str = "cpu"
    draft_dtype: str = "float32"
    target_dtype: str = "float32"
    packed: int = 0
    kernels: dict[str, Any] = field(default_factory=dict)
    head: Any = None

    def kernel_summary(self) -> str:
        """Which linear kernel each model uses per row count, and what the candidates cost (one line per model)."""
        head = [] if self.head is None else [f"draft head kernel (a 3-token proposal, measured): {self.head.kernel}"]
        if not self.kernels:
            return "\n".join(["kernels: framework default (no layer swapped: not a float32 CPU model, or fast kernels "
                              "off)", *head])
        return "\n".join([*(f"{role} kernels (whole forward, context {plan.context}): {plan.summary()}"
                            for role, plan in self.kernels.items()), *head])

    @property
    def dtypes(self) -> str:
        """``draft/target`` dtypes, e.g. ``float32/bfloat16`` (or one name when equal)."""
        return self.draft_dtype if self.draft_dtype == self.target_dtype else f"{self.draft_dtype}/{self.target_dtype}"


def load_pair(draft: str, target: str, device: str = "cpu", dtype: str = "float32",
              draft_dtype: str | None = None, target_dtype: str | None = None, fast_kernels: bool = True,
              head: bool = True) -> LivePair:
    """Load both models and check that they share a tokenizer (local paths or hub names).

    Args:
        draft, target: Model folders or hub names.
        device: ``cpu``, ``cuda``, ``cuda:1`` ...
        dtype: Dtype of both models unless ``draft_dtype`` / ``target_dtype`` say otherwise.
        fast_kernels: On CPU, give float32 linear layers the kernel measured fastest on this machine for each row
            count (one token for plain decoding and drafting, several for verification; same outputs up to float
            rounding). The measurement takes about a second per model, once per architecture and process.
        head: Load the draft head of the draft's pair folder when it has one (``<pair>/head``,
            :func:`~specgym.envs.engines.live.draft_head.pair_head_folder`).
    """
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SpecgymError(f"--device {device}: CUDA is not available on this machine")
    d_dtype = dtype_name(draft_dtype or dtype, "--draft-dtype")
    t_dtype = dtype_name(target_dtype or dtype, "--target-dtype")
    tok_d = load_tokenizer(draft, "draft")
    tok_t = load_tokenizer(target, "target")
    check_same_tokenizer(tok_d, tok_t, draft, target)
    d = load_model(draft, "draft", device, d_dtype)
    t = load_model(target, "target", device, t_dtype)
    packed = 0
    kernels: dict[str, Any] = {}
    if fast_kernels:
        for role, model in (("draft", d), ("target", t)):
            n = pack_linears(model)
            packed += n
            plan = select_kernels(model, *engine_forward(model)) if n else None
            if plan is not None:
                kernels[role] = plan
    head_dir = pair_head_folder(draft) if head else None
    draft_head = load_head(head_dir, t, fast_kernels) if head_dir is not None else None
    return LivePair(d, t, tok_t, draft, target, device, d_dtype, t_dtype, packed, kernels, draft_head)

"""Loading a Hugging Face draft/target pair for the live engine: model references, dtypes, tokenizers, kernels.

A pair is two causal LMs sharing one tokenizer (:func:`check_same_tokenizer`), each in its own dtype, checked to run
on the device they are loaded on, with the linear kernels measured fastest on this machine
(:mod:`specgym.envs.engines.fast_linear`). Local folders and hub names are accepted; a missing folder, a folder that
is not a model, a dtype the device cannot compute in or a tokenizer mismatch is one line naming the option.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specgym.envs.engines.fast_linear import engine_forward, pack_linears, select_kernels
from specgym.errors import SpecgymError


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


def load_model(name: str, role: str, device: str = "cpu", dtype: str = "float32"):
    """Load a causal LM for inference (eval mode) in ``dtype`` on ``device``; check that it runs there.

    A dtype the device cannot compute in raises one clear line naming the model, the dtype and the device.
    """
    import torch
    from transformers import AutoModelForCausalLM

    ref = resolve_model_path(name, role)
    dt = torch_dtype(dtype, f"--{role}-dtype")
    try:
        model = AutoModelForCausalLM.from_pretrained(ref, dtype=dt)
    except OSError as exc:
        raise SpecgymError(f"--{role} {name}: cannot load model ({str(exc).splitlines()[0]})") from None
    try:
        model = model.to(device).eval()  # type: ignore[arg-type]  # transformers stub of .to
        with torch.inference_mode():
            model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device))
    except (RuntimeError, TypeError) as exc:
        raise SpecgymError(f"--{role} {name}: cannot run in {dtype_name(dtype)} on {device} "
                           f"({str(exc).splitlines()[0]})") from None
    return model


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
    """A loaded draft/target pair sharing one tokenizer.

    Attributes:
        draft, target: The models (eval mode).
        tokenizer: The shared tokenizer.
        draft_name, target_name: Where they came from (paths or hub names).
        device: Where they run.
        draft_dtype, target_dtype: The dtype each model computes in.
        packed: Linear layers given kernels chosen by measurement (:mod:`specgym.envs.engines.fast_linear`).
        kernels: The measured kernel plan of each model (``{"draft": plan, "target": plan}``; empty when no layer
            was swapped).
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

    def kernel_summary(self) -> str:
        """Which linear kernel each model uses per row count, and what the candidates cost (one line per model)."""
        if not self.kernels:
            return "kernels: framework default (no layer swapped: not a float32 CPU model, or fast kernels off)"
        return "\n".join(f"{role} kernels (whole forward, context {plan.context}): {plan.summary()}"
                         for role, plan in self.kernels.items())

    @property
    def dtypes(self) -> str:
        """``draft/target`` dtypes, e.g. ``float32/bfloat16`` (or one name when equal)."""
        return self.draft_dtype if self.draft_dtype == self.target_dtype else f"{self.draft_dtype}/{self.target_dtype}"


def load_pair(draft: str, target: str, device: str = "cpu", dtype: str = "float32",
              draft_dtype: str | None = None, target_dtype: str | None = None, fast_kernels: bool = True) -> LivePair:
    """Load both models and check that they share a tokenizer (local paths or hub names).

    Args:
        draft, target: Model folders or hub names.
        device: ``cpu``, ``cuda``, ``cuda:1`` ...
        dtype: Dtype of both models unless ``draft_dtype`` / ``target_dtype`` say otherwise.
        fast_kernels: On CPU, give float32 linear layers the kernel measured fastest on this machine for each row
            count (one token for plain decoding and drafting, several for verification; same outputs up to float
            rounding). The measurement takes about a second per model, once per architecture and process.
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
    return LivePair(d, t, tok_t, draft, target, device, d_dtype, t_dtype, packed, kernels)

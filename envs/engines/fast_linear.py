"""Faster CPU verification: linear layers with pre-packed oneDNN weights for multi-token forwards.

On a CPU a one-token forward streams every weight from memory once (a matrix-vector product, memory bound), so
verifying ``n`` draft tokens in one forward could cost little more than one token. PyTorch's default path for
``n > 1`` is a general matrix multiply that re-packs the weights on every call, and at ``n = 2..9`` it costs 1.5-2.5x
the one-token step on an AVX2 machine (measured: ``specgym bench --sections kernels``). Packing each weight once,
in oneDNN's blocked layout, removes that cost; one-token calls keep the matrix-vector path, which is faster there.

:func:`pack_linears` swaps the layers of a loaded model in place. It only applies to float32 models on CPU builds of
torch that ship oneDNN; elsewhere it changes nothing. Outputs equal the unpacked layers' up to float rounding.
"""

from __future__ import annotations

from typing import Any

_BATCH_HINT = 8  # oneDNN picks its blocking for this many rows; any row count works


def packing_available() -> bool:
    """True when this torch build can pack linear weights with oneDNN on the CPU."""
    import torch

    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") \
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _packed_module(weight: Any, bias: Any):
    import torch
    import torch.nn.functional as F

    class PackedLinear(torch.nn.Module):
        """``y = x W^T + b``: matrix-vector product for one row, pre-packed oneDNN kernel for several."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = weight.detach().contiguous()
            self.bias = None if bias is None else bias.detach().contiguous()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, _BATCH_HINT)
            self.in_features = self.weight.shape[1]

        def forward(self, x: Any) -> Any:
            rows = x.reshape(-1, self.in_features)
            if rows.shape[0] == 1:
                y = F.linear(rows, self.weight, self.bias)
            else:
                y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
            return y.view(*x.shape[:-1], y.shape[-1])

    return PackedLinear()


def pack_linears(model: Any) -> int:
    """Replace the model's linear layers (``nn.Linear`` and GPT-2's ``Conv1D``) by packed ones; returns how many.

    Only for float32 models on the CPU with oneDNN available; otherwise returns 0 and leaves the model unchanged.
    """
    import torch

    try:
        from transformers.pytorch_utils import Conv1D

        conv_types: tuple[type, ...] = (Conv1D,)
    except ImportError:  # pragma: no cover - transformers without GPT-2's Conv1D
        conv_types = ()
    first = next(model.parameters())
    if first.device.type != "cpu" or first.dtype != torch.float32 or not packing_available():
        return 0
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, torch.nn.Linear):
                swaps.append((parent, name, child.weight, child.bias))
            elif isinstance(child, conv_types):  # Conv1D stores W as (in, out)
                conv: Any = child
                swaps.append((parent, name, conv.weight.t(), conv.bias))
    with torch.no_grad():
        for parent, name, w, b in swaps:
            setattr(parent, name, _packed_module(w, b))
    return len(swaps)

"""A TensorRT-LLM style off-switch: speculate with a fixed K until the batch passes a concurrency, then decode
plainly (TensorRT-LLM's ``max_concurrency`` of its speculative decoding config: above that many active requests
the step runs without drafts, since verification turns compute-bound). Spec ``trtllm-off:K:MAX_CONCURRENCY``.
"""

from __future__ import annotations

from specgym.envs.core.batch import BatchController, BatchState


class TRTLLMOffSwitch(BatchController):
    """K drafts per request while the batch is at most ``max_concurrency``, none above it."""

    def __init__(self, k: int = 3, max_concurrency: int = 32):
        self.k, self.max_concurrency = int(k), int(max_concurrency)
        self.name = f"trtllm-off:{self.k}:{self.max_concurrency}"

    def propose(self, state: BatchState) -> int:
        return self.k if state.batch <= self.max_concurrency else 0

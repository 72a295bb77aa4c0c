"""A draft head on the target's own last hidden state: EAGLE's recurrence without its attention layer.

EAGLE (Li et al., 2024) drafts from the target's features rather than from a second language model: from the
feature ``f_t`` that produced token ``x_{t+1}`` and that token's embedding, a small network predicts the next feature
``f_{t+1}``, the target's own output layer scores it, and the head repeats on its own predictions. The feature already
holds what the target knows of the context, which is why such a head accepts far more often than a draft model of
the same cost.

specgym's head keeps that recurrence and replaces EAGLE's decoder layer by a gated MLP over ``[f_t, e(x_{t+1})]``::

    u = W_in [f_t ; e(x_{t+1})]                  # (2w -> w)
    f_{t+1} = u + W_down (silu(W_gate n(u)) * W_up n(u))   # n = RMSNorm
    logits = E_sub f_{t+1}                      # the target's (tied) output rows of the draft vocabulary

so it needs no cache of its own: a ``K``-token proposal from a round start is ``K`` small matrix products, and the
proposals of every start of a recorded completion are computed at once (:meth:`DraftHead.propose_batch`, what
``runs_head`` of a recording is). The features are the target's last hidden state after its final norm, the vector
its output layer scores. The output rows are those of the draft vocabulary the shipped draft uses
(:mod:`~specgym.envs.engines.live.draft_vocab`): a drafted token outside it is never proposed, and verification stays
exact (greedy compares with the target's argmax over the full vocabulary).

A head folder: ``config.json`` (:data:`HEAD_CONFIG`: ``width``, ``mlp``, ``vocab_file``, ``target``, provenance),
``head.safetensors`` (the trained weights; the embedding is the target's, borrowed at load, never shipped), the
vocabulary file and a ``README.md`` card. A shipped pair keeps its head in ``<pair>/head``
(:func:`pair_head_folder`); ``load_pair`` loads it with the pair and the live engine serves it as the drafter
``head``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specgym.envs.engines.live.fast_linear import kernel_linear, packing_available
from specgym.errors import SpecgymError

#: A head folder's config file.
HEAD_CONFIG = "config.json"
#: A head folder's weights.
HEAD_WEIGHTS = "head.safetensors"


def pair_head_folder(draft: str | Path) -> Path | None:
    """The draft head of a pair folder (``<pair>/head`` beside ``<pair>/draft``), or None."""
    folder = Path(draft).parent / "head"
    return folder if (folder / HEAD_CONFIG).is_file() else None


class _OneStart:
    """A :class:`DraftHead`'s proposals from one round start (what the live engine asks each round), built on its
    batch methods. Kept outside the torch module, which :func:`build_head` defines on first use (importing this module
    does not import torch)."""

    ids: Any

    def propose_batch(self, f: Any, last: Any, k: int) -> Any:  # pragma: no cover - DraftHead's own
        raise NotImplementedError

    def step(self, f: Any, tokens: Any) -> Any:  # pragma: no cover - DraftHead's own
        raise NotImplementedError

    def scores(self, f: Any) -> Any:  # pragma: no cover - DraftHead's own
        raise NotImplementedError

    def sample_batch(self, f: Any, last: Any, k: int, temperature: float,
                     u: Any) -> tuple[Any, Any]:  # pragma: no cover - DraftHead's own
        raise NotImplementedError

    def propose(self, f: Any, last: int, k: int) -> list[int]:
        """Greedy proposal of ``k`` tokens from one round start (``f``: ``(width,)``)."""
        import torch

        if k <= 0:
            return []
        t = torch.tensor([int(last)], dtype=torch.long, device=f.device)
        return [int(x) for x in self.propose_batch(f.reshape(1, -1), t, k)[0].tolist()]

    def propose_confident(self, f: Any, last: int, k: int,
                          keep: Callable[[int, float, Any], bool] | None = None) -> tuple[list[int], list[float]]:
        """Greedy proposal of up to ``k`` tokens from one round start with the head's confidence in each: its softmax
        maximum over the draft vocabulary there (what ``topk_head[g, j, 0]`` of a recording holds along the
        completion). The tokens are :meth:`propose`'s, the same steps one at a time; ``keep(j, conf, probs)``, asked
        after token ``j < k`` with the head's softmax there (``(1, draft vocabulary)``), stops the proposal there when
        False, before the head computes the next token (without it, the values are read once at the end)."""
        import torch

        if k <= 0:
            return [], []
        tokens: list[Any] = []
        confs: list[Any] = []
        tok = torch.tensor([int(last)], dtype=torch.long, device=f.device)
        f = f.reshape(1, -1)
        for j in range(1, k + 1):
            f = self.step(f, tok)
            s = self.scores(f)
            c = s.argmax(-1)
            tok = self.ids[c]
            probs = torch.softmax(s.float(), -1)
            conf = probs[0, c[0]]
            if keep is None:
                tokens.append(tok)
                confs.append(conf)
                continue
            tokens.append(int(tok[0]))
            confs.append(float(conf))
            if j < k and not keep(j, confs[-1], probs):
                break
        if keep is None:
            return [int(t) for t in torch.cat(tokens).tolist()], [float(c) for c in torch.stack(confs).tolist()]
        return tokens, confs

    def propose_sampled(self, f: Any, last: int, k: int, temperature: float, vocab: int,
                        generator: Any) -> tuple[list[int], list[Any]]:
        """A sampled proposal of ``k`` tokens from one round start, the uniforms drawn from ``generator``; returns the
        tokens and, per token, the head's distribution over the target's first ``vocab`` ids (zero outside the draft
        vocabulary), what :meth:`LiveRequest._accept` verifies against."""
        import torch

        if k <= 0:
            return [], []
        u = torch.rand((1, k), generator=generator, device=getattr(generator, "device", None) or "cpu")
        t = torch.tensor([int(last)], dtype=torch.long, device=f.device)
        toks, dists = self.sample_batch(f.reshape(1, -1), t, k, temperature, u.to(f.device))
        full = dists.new_zeros((k, vocab))
        full[:, self.ids] = dists[0]
        return [int(x) for x in toks[0].tolist()], list(full)


def build_head(width: int, mlp: int, embedding: Any, ids: list[int]) -> Any:
    """A fresh :class:`DraftHead` over ``embedding`` (the target's ``(V, width)`` input/output embedding, frozen)."""
    import torch

    class DraftHead(_OneStart, torch.nn.Module):
        """The recurrent draft head (module docstring). ``ids``: the draft vocabulary, sorted token ids."""

        embedding: torch.Tensor  # buffers (the target's, not saved with the head)
        ids: torch.Tensor
        rows: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.width, self.mlp = int(width), int(mlp)
            self.fc = torch.nn.Linear(2 * width, width, bias=False)
            self.norm = torch.nn.RMSNorm(width, eps=1e-5)
            self.gate = torch.nn.Linear(width, mlp, bias=False)
            self.up = torch.nn.Linear(width, mlp, bias=False)
            self.down = torch.nn.Linear(mlp, width, bias=False)
            self.register_buffer("embedding", embedding.detach(), persistent=False)
            idx = torch.tensor(ids, dtype=torch.long)
            if int(idx.max()) >= embedding.shape[0]:
                raise SpecgymError(f"draft head: token id {int(idx.max())} is outside the target's vocabulary of "
                                   f"{embedding.shape[0]}")
            self.register_buffer("ids", idx, persistent=False)
            self.register_buffer("rows", embedding.detach()[idx].clone(), persistent=False)
            self.out: Any = None  # the rows as a linear layer with a measured kernel (:func:`pack_head`)

        def step(self, f: Any, tokens: Any) -> Any:
            """The next features ``(n, width)`` from features ``f`` ``(n, width)`` and the tokens they produced."""
            u = self.fc(torch.cat([f, self.embedding[tokens]], dim=-1))
            n = self.norm(u)
            return u + self.down(torch.nn.functional.silu(self.gate(n)) * self.up(n))

        def scores(self, f: Any) -> Any:
            """Logits over the draft vocabulary ``(n, len(ids))`` (column ``c`` is token ``ids[c]``)."""
            return f @ self.rows.T if self.out is None else self.out(f)

        def propose_batch(self, f: Any, last: Any, k: int) -> Any:
            """Greedy proposals ``(n, k)`` (token ids) from ``n`` round starts: features ``f`` ``(n, width)`` of the
            position before each start's last token, and that token ``last`` ``(n,)``."""
            out = []
            tok = last
            for _ in range(k):
                f = self.step(f, tok)
                tok = self.ids[self.scores(f).argmax(-1)]
                out.append(tok)
            return torch.stack(out, dim=1) if out else last.new_zeros((len(last), 0))

        def sample_batch(self, f: Any, last: Any, k: int, temperature: float, u: Any) -> tuple[Any, Any]:
            """Sampled proposals from ``n`` round starts (as :meth:`propose_batch`) at ``temperature > 0``: each
            token drawn from the head's softmax over the draft vocabulary by inverse CDF of the uniforms ``u``
            ``(n, k)``, the chain fed its own draws. Returns the tokens ``(n, k)`` and the head's distributions
            ``(n, k, len(ids))`` they were drawn from (what exact speculative sampling divides by)."""
            toks, dists = [], []
            tok = last
            for j in range(k):
                f = self.step(f, tok)
                probs = torch.softmax(self.scores(f).float() / temperature, -1)
                cdf = probs.cumsum(-1)
                col = torch.searchsorted(cdf, (u[:, j: j + 1].to(cdf) * cdf[:, -1:]).contiguous())
                tok = self.ids[col[:, 0].clamp_max(probs.shape[1] - 1)]
                toks.append(tok)
                dists.append(probs)
            if not toks:
                return last.new_zeros((len(last), 0)), f.new_zeros((len(last), 0, len(self.ids)))
            return torch.stack(toks, dim=1), torch.stack(dists, dim=1)

    return DraftHead()


def pack_head(head: Any, repeats: int = 15) -> str:
    """Give the head's linear layers (and its output rows) the kernel of :mod:`~specgym.envs.engines.live.fast_linear`
    that drafts fastest here, measured: ``gemm`` or oneDNN's ``packed`` (a 3-token proposal, the median of
    ``repeats``; on one AVX2 machine packed drafts 3 tokens in 1.8 ms where the default takes 3.4). Returns the
    kernel kept, or ``default`` where packing does not apply (not a float32 CPU head)."""
    import torch

    if not packing_available() or head.rows.device.type != "cpu" or head.rows.dtype != torch.float32:
        return "default"
    for name in ("fc", "gate", "up", "down"):
        lin = getattr(head, name)
        setattr(head, name, kernel_linear(lin.weight, None))
    head.out = kernel_linear(torch.nn.Parameter(head.rows, requires_grad=False), None)
    layers = [head.fc, head.gate, head.up, head.down, head.out]
    f = torch.zeros(head.width, dtype=head.rows.dtype)
    best, best_ms = "gemm", float("inf")
    with torch.inference_mode():
        for kernel in ("gemm", "packed"):
            for layer in layers:
                layer.set_plan([kernel] * 3)
            head.propose(f, 0, 3)  # build the layout, warm up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                head.propose(f, 0, 3)
                times.append(time.perf_counter() - t0)
            ms = 1000 * statistics.median(times)
            if ms < best_ms:
                best, best_ms = kernel, ms
        for layer in layers:
            layer.set_plan([best] * 3)
    return best


def load_head(folder: str | Path, target: Any, fast_kernels: bool = True) -> Any:
    """The head stored in ``folder``, over ``target``'s embedding, in eval mode on the target's device and dtype
    (with ``fast_kernels``, its layers' kernel measured: :func:`pack_head`); a missing or inconsistent file raises
    one line naming it."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / HEAD_CONFIG
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        ids = json.loads((folder / cfg["vocab_file"]).read_text(encoding="utf-8"))
        width, mlp = int(cfg["width"]), int(cfg["mlp"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecgymError(f"{cfg_path}: cannot read the draft head ({type(exc).__name__}: {exc})") from None
    emb = target.get_input_embeddings().weight
    if int(emb.shape[1]) != width:
        raise SpecgymError(f"{cfg_path}: the head's width {width} is not the target's hidden size {emb.shape[1]}")
    head = build_head(width, mlp, emb, sorted(set(int(i) for i in ids)))
    try:
        state = load_file(str(folder / HEAD_WEIGHTS))
        head.load_state_dict(state)
    except (OSError, RuntimeError) as exc:
        first = str(exc).splitlines()[0]
        raise SpecgymError(f"{folder / HEAD_WEIGHTS}: cannot load the draft head ({first})") from None
    head.name = str(cfg.get("target", ""))
    head = head.to(device=emb.device, dtype=emb.dtype).eval().requires_grad_(False)
    head.kernel = pack_head(head) if fast_kernels else "default"
    return head


def head_runs(head: Any, features: Any, ids: list[int], prompt_len: int, k: int) -> np.ndarray:
    """Per-start runs of the head on a greedy completion (``runs_head``): ``run[g]`` = how many of the ``k``
    proposals from the start at completion position ``g`` match the completion before the first difference.

    Args:
        head: A loaded head.
        features: The target's last hidden states ``(len(ids), width)`` over ``ids`` (teacher-forced).
        ids: Prompt then completion token ids.
        prompt_len: Prompt length (at least 2: the first start needs the feature before the prompt's last token).
        k: Proposal length.
    """
    import torch

    n = len(ids) - prompt_len
    if n <= 0:
        return np.zeros(0, dtype=np.int16)
    if prompt_len < 2:
        raise SpecgymError("draft head runs need a prompt of at least 2 tokens")
    seq = torch.tensor(ids, dtype=torch.long, device=features.device)
    starts = torch.arange(prompt_len, len(ids), device=features.device)  # the token the round produces first
    with torch.inference_mode():
        prop = head.propose_batch(features[starts - 2], seq[starts - 1], k)  # (n, k)
    comp = np.asarray(ids[prompt_len:], dtype=np.int64)
    padded = np.concatenate([comp, np.full(k, -1)])
    want = np.lib.stride_tricks.sliding_window_view(padded, k)[:n]  # completion[g : g + k]
    match = prop.cpu().numpy() == want
    return np.where(match.all(axis=1), k, match.argmin(axis=1)).astype(np.int16)


def target_features(target: Any, ids: list[int]) -> Any:
    """The target's last hidden states ``(len(ids), width)`` over ``ids`` in one teacher-forced forward (after its
    final norm: transformers' ``hidden_states[-1]``, what the live engine's lean forward returns)."""
    import torch

    x = torch.tensor([ids], dtype=torch.long, device=target.device)
    with torch.inference_mode():
        return target(input_ids=x, output_hidden_states=True).hidden_states[-1][0]


def recorded_head_runs(target: Any, head: Any, prompt: list[int], completion: list[int], k: int) -> np.ndarray:
    """``runs_head`` of one greedy request (:func:`head_runs` over one teacher-forced target forward)."""
    ids = [int(t) for t in prompt] + [int(t) for t in completion]
    return head_runs(head, target_features(target, ids), ids, len(prompt), k)

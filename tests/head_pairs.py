"""A tiny target with a fitted draft head, for the live tests of the head (trees, confidence rules).

The pair is the tiny RANDOM Llama of tests/conftest.py (its weights scaled by 8 so that its greedy text varies) and a
head built with ``build_head`` whose input layer is a least-squares fit of the target's next feature on the prompts'
plain completions (its MLP zeroed): a synthetic, untrained stand-in that ranks the target's token first often and
lower often enough to exercise every tree and stop (not a trained head).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The prompts the head is fitted on (and the tests decode).
TEXTS = ("def f(x):\n    return x + 1\n", "the cat sat on the mat. ", "12 + 7 = 19, 3 * 4 =")


def tiny_head_pair(tiny_target: Path, profile: Any, n: int, k_max: int = 8,
                   texts: Sequence[str] = TEXTS) -> tuple[Any, Any, list[list[int]], dict[tuple[int, ...], list[int]]]:
    """``(tokenizer, engine with the head, prompt ids, plain completions of n tokens by prompt)``."""
    import torch
    import transformers

    from specgym.envs.engines.live.draft_head import build_head, target_features
    from specgym.envs.engines.live.engine import LiveEngine

    torch.set_num_threads(1)
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_target))
    target = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_target)).eval().requires_grad_(False)
    with torch.no_grad():
        for p in target.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    plain_eng = LiveEngine(target, target, k_max=k_max, timing=profile)
    prompts = [tok(t)["input_ids"] for t in texts]
    plain = {tuple(ids): plain_eng.run_plain(ids, n).tokens for ids in prompts}
    emb = target.get_input_embeddings().weight
    seqs = [list(ids) + plain[tuple(ids)] for ids in prompts]
    vocab = sorted(set(t for s in seqs for t in s[2:]) | set(range(0, len(tok), 4)))  # a reduced draft vocabulary
    head = build_head(int(emb.shape[1]), 16, emb, vocab)
    xs, ys = [], []
    for s in seqs:
        h = target_features(target, s)
        xs.append(torch.cat([h[:-1], emb[torch.tensor(s[1:])]], -1))
        ys.append(h[1:])
    w = torch.linalg.lstsq(torch.cat(xs).detach(), torch.cat(ys).detach()).solution
    with torch.no_grad():
        head.fc.weight.copy_(w.T)
        head.down.weight.zero_()
    head.eval().requires_grad_(False)
    return tok, LiveEngine(target, target, k_max=k_max, timing=profile, head=head), prompts, plain

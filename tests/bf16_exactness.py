"""Measurement (not a test): how often speculative greedy decoding differs from plain greedy decoding, float32 vs
bfloat16, on the tiny RANDOMLY-INITIALISED pairs of tests/hf_pairs.py (10 prompts x K = 2, 4, 6, 48 tokens each).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python tests/bf16_exactness.py [FOLDER]`` (docs/guides/own-pair.md).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import hf_pairs  # noqa: E402

from specgym.envs.engines.live.engine import LiveEngine  # noqa: E402
from specgym.envs.engines.live.model_loading import encode_prompt, load_pair  # noqa: E402

TEXTS = ["def f(x):\n", "the cat sat ", "for i in range(", "x = y + ", "print(a, b)", "import os\n", "class a:\n",
         "if a == b:", "return [x for", "while true:"]


def main() -> None:
    torch.set_num_threads(1)
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    out = {}
    for arch in hf_pairs.ARCHS:
        d, t = hf_pairs.build_pair(arch, root / arch)
        for dtype in ("float32", "bfloat16"):
            pair = load_pair(str(d), str(t), dtype=dtype)
            eng = LiveEngine.from_pair(pair)
            runs = differ = 0
            for text in TEXTS:
                ids = encode_prompt(pair.tokenizer, text)
                plain = eng.run_plain(ids, 48).tokens
                for k in (2, 4, 6):
                    runs += 1
                    differ += eng.run_request(ids, k, 48).tokens != plain
            out[f"{arch}/{dtype}"] = f"{differ}/{runs}"
            print(f"{arch} {dtype} (lean forward: {eng.lean}): {differ}/{runs} differ from plain", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Export a trained pair in Hugging Face format: fp16 safetensors (sharded below 50 MB), config, tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specgym.training.models.corpus import log
from specgym.training.models.tokenizer import load_tokenizer


def export_pair(work: Path, name: str, target_role: str = "target", draft_role: str = "draft",
                models_dir: Path = Path("data/models"), max_shard: str = "40MB") -> Path:
    """Write both models to ``models_dir/<name>/{target,draft}``: fp16 safetensors, config, tokenizer, state.

    Weights are stored in fp16 to keep the repository small (and sharded into files of at most ``max_shard``); the
    config says float32 so that ``from_pretrained(path)`` casts them back: fp16 matmuls are slow on a CPU.
    """
    import torch
    from transformers import GPT2LMHeadModel

    out = models_dir / name
    tok = load_tokenizer(work / "tokenizer")
    for role, src in (("target", target_role), ("draft", draft_role)):
        model = GPT2LMHeadModel.from_pretrained(str(work / f"{src}_ckpt"), dtype=torch.float32)
        model = model.to(torch.float16)  # type: ignore[arg-type]  # transformers stub of .to
        dest = out / role
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        model.save_pretrained(str(dest), safe_serialization=True, max_shard_size=max_shard)
        tok.save_pretrained(str(dest))
        cfg_path = dest / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["dtype"] = "float32"
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        st = json.loads((work / f"{src}_ckpt" / "state.json").read_text())
        keep = ("step", "tokens", "elapsed_s", "heldout_loss", "n_params", "spec", "batch", "block", "peak_lr",
                "teacher", "init", "precision")
        (dest / "training_state.json").write_text(json.dumps({k: st.get(k) for k in keep}, indent=2) + "\n")
    log.info("exported pair to %s", out)
    return out

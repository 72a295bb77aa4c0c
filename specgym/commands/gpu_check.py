"""``specgym gpu-check``: the prepared GPU run of :mod:`specgym.eval.gpu_check` (``make gpu-check``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specgym.commands.args import path_type
from specgym.errors import SpecgymError
from specgym.eval.gpu_check import BUDGET_S, run_check
from specgym.io import check_output


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpu-check``."""
    p = sub.add_parser("gpu-check", help="the prepared GPU check: profile, recording, live bench on the GPU; one "
                                         "JSON of figures")
    p.add_argument("--device", default="cuda", help="cuda, cuda:1 ..., or cpu (default %(default)s)")
    p.add_argument("--out", type=path_type, default=Path("out/gpu-check.json"), help="the JSON (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="toy sizes (the CPU dry run of the test suite)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if not args.device.startswith(("cpu", "cuda")):
        raise SpecgymError(f"--device {args.device!r}: expected cuda, cuda:N or cpu")
    try:
        import torch
    except ImportError as exc:
        raise SpecgymError(f"gpu-check needs the 'hf' extra (pip install 'specgym[hf]'): {exc}") from None
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecgymError(f"--device {args.device}: CUDA is not available on this machine (torch "
                           f"{torch.__version__}; the check needs a CUDA build of torch and a GPU)")
    out = check_output(args.out, True, "file", "--out", suffixes=(".json",))
    figures = run_check(args.device, out, args.quick)
    print(f"wrote {out}: {figures['machine'].get('gpu', figures['machine']['device'])}, "
          f"{figures['seconds']['total_s']:.0f} s (budget {BUDGET_S} s)")
    return 0

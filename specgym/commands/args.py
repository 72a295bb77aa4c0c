"""Checked argument types for the CLI: a bad number is refused by argparse with one line naming the option."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import NoReturn

from specgym.envs.core.rounds import K_MAX_LIMIT
from specgym.errors import SpecgymError
from specgym.io import check_not_input

#: The options that name where a command writes (argparse ``dest`` -> option); every other path is an input.
OUTPUT_OPTIONS = {"out": "--out", "json": "--json", "plot": "--plot", "md": "--md", "profile_out": "--profile-out",
                  "prompts_out": "--prompts-out", "vllm_out": "--vllm-out", "log_file": "--log-file"}


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``specgym eval: error: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def path_type(text: str) -> Path:
    """An argparse type: a path, never empty (``Path('')`` would silently be ``.``, the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path: name a file or folder")
    return Path(text)


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[lo, hi]``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {_range(lo, hi)}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_range(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_bad = lo is not None and (value <= lo if lo_open else value < lo)
        if not math.isfinite(value) or low_bad or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {_range(lo, hi, lo_open)}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _range(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    return f"<= {hi:g}"


#: Bootstrap resamples: 0 (no intervals) or 100..100,000. Fewer than 100 resamples give a "95% interval" that can
#: exclude its own estimate; above 100,000 the resample index matrix alone would take gigabytes (MemoryError).
MIN_BOOTSTRAP, MAX_BOOTSTRAP = 100, 100_000

#: Requests of a synthetic workload: above a million (~200 million positions, gigabytes) generation runs out of
#: memory on a typical machine.
MAX_SYNTHETIC_REQUESTS = 1_000_000


def bootstrap_type(text: str) -> int:
    """An argparse type: 0 or a resample count in ``[MIN_BOOTSTRAP, MAX_BOOTSTRAP]``."""
    value = int_range(0, MAX_BOOTSTRAP)(text)
    if 0 < value < MIN_BOOTSTRAP:
        raise argparse.ArgumentTypeError(f"must be 0 (no intervals) or {MIN_BOOTSTRAP}..{MAX_BOOTSTRAP:,}, got "
                                         f"{value}: so few resamples give an interval that may exclude its estimate")
    return value


bootstrap_type.__name__ = "integer"
positive_int = int_range(1)
nonneg_int = int_range(0)
k_max_type = int_range(1, K_MAX_LIMIT)
temperature_type = float_range(0.0)


def parse_length(text: str | int) -> tuple[int, int]:
    """``--max-new-tokens``: ``"200"`` -> (200, 200); ``"128-256"`` -> (128, 256) (each request draws its length
    from the range, :class:`~specgym.envs.engines.live.recorder.RecordingSpec`)."""
    s = str(text)
    try:
        if "-" in s:
            lo, hi = (int(v) for v in s.split("-", 1))
        else:
            lo = hi = int(s)
    except ValueError:
        raise SpecgymError(f"--max-new-tokens: expected N or LO-HI, got {text!r}") from None
    if lo < 1 or hi < lo:
        raise SpecgymError(f"--max-new-tokens: need 1 <= LO <= HI, got {text!r}")
    return lo, hi


def parse_splits(text: str) -> tuple[float, float, float]:
    """``--splits``: ``"0.7,0.1,0.2"`` -> the train, val and test fractions (non-negative, summing to 1)."""
    try:
        parts = tuple(float(v) for v in str(text).split(","))
    except ValueError:
        raise SpecgymError(f"--splits: expected TRAIN,VAL,TEST fractions, got {text!r}") from None
    if len(parts) != 3 or any(not math.isfinite(v) or v < 0 for v in parts) or abs(sum(parts) - 1.0) > 1e-6:
        raise SpecgymError(f"--splits: need three fractions >= 0 summing to 1, got {text!r}")
    return parts[0], parts[1], parts[2]



def check_outputs_not_inputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output option naming one of the command's inputs, whatever the flags.

    Every other argument that names an existing path is an input: an option's value, each item of a comma-separated
    list, and what follows a ``:`` in a spec (``table:FILE``, ``ppo:DIR``). With ``--force`` a folder output is
    replaced as a whole, so an input inside it is refused too, with or without ``--force`` (whose "already exists"
    advice would lead nowhere); ``keeps_out_folder``: a command that only adds files to an existing ``--out``
    folder, ``resume``: one that continues in it.
    """
    values = vars(args)
    inputs = [p for dest, value in values.items() if dest not in OUTPUT_OPTIONS for p in _path_texts(value)]
    replaces = not values.get("resume") and not values.get("keeps_out_folder")  # (without --force: a dead end)
    for dest, option in OUTPUT_OPTIONS.items():
        if isinstance(values.get(dest), (str, PurePath)) and str(values[dest]):  # (a flag of the same name: not a path)
            check_not_input(values[dest], inputs, option, replaces_folder=replaces)


def _path_texts(value: object) -> list[str]:
    """The texts in an argument value that may name a path (see :func:`check_outputs_not_inputs`)."""
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _path_texts(v)]
    if not isinstance(value, (str, PurePath)) or str(value) == "":
        return []
    text = str(value)
    out = {text}
    for part in text.split(","):
        while part:
            out.add(part.strip())
            part = part.partition(":")[2]
    return sorted(t for t in out if t)

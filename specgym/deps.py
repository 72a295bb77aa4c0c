"""Optional dependencies: one clear line telling the user which extra to install."""

from __future__ import annotations

import importlib

from specgym.errors import SpecgymError

#: extra -> the modules it provides
EXTRAS = {"hf": ("torch", "transformers"), "train": ("torch", "stable_baselines3")}


def require(extra: str, what: str) -> None:
    """Raise :class:`SpecgymError` naming ``pip install 'specgym[EXTRA]'`` if the extra's modules are missing."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError:
            raise SpecgymError(f"{what} needs {module}: pip install 'specgym[{extra}]'") from None

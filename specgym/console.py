"""Rich consoles that stay readable in logs: no wrapping at 80 columns when output is piped."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console


def make_console(stderr: bool = False, quiet: bool = False) -> Any:
    """A ``rich.console.Console``; when the stream is not a terminal, lines and tables get 200 columns."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(stderr=stderr, quiet=quiet, width=width, soft_wrap=width is not None)

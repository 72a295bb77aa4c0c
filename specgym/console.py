"""Rich consoles that stay readable in logs: no wrapping at 80 columns when output is piped."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def make_console(stderr: bool = False, quiet: bool = False) -> Any:
    """A ``rich.console.Console``; when the stream is not a terminal, lines and tables get 200 columns."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(stderr=stderr, quiet=quiet, width=width, soft_wrap=width is not None)


def make_progress(console: Any = None, transient: bool = False, disable: bool = False) -> Any:
    """The progress bar of every long step (``rich.progress``): what it does, how far, time spent and time left."""
    return Progress(TextColumn("{task.description:<28}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), console=console or make_console(stderr=True),
                    transient=transient, disable=disable)

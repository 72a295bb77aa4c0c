"""Rich consoles that stay readable in logs: no wrapping at 80 columns when output is piped."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as _RichProgress


def make_console(stderr: bool = False, quiet: bool = False) -> Any:
    """A ``rich.console.Console``; when the stream is not a terminal, lines and tables get 200 columns."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 200
    return Console(stderr=stderr, quiet=quiet, width=width, soft_wrap=width is not None)


class Progress(_RichProgress):
    """``rich.progress.Progress`` that prints nothing when it shows nothing.

    Off a terminal rich ends every bar with an empty line, so a command that fails before its first step (a bad
    profile found inside the work) would print a blank line above its one-line error.
    """

    def stop(self) -> None:
        """Stop the display; the closing empty line only once a task was shown."""
        if self.tasks or self.console.is_interactive:
            super().stop()
        else:
            self.live.stop()


def make_progress(console: Any = None, transient: bool = False, disable: bool = False) -> Any:
    """The progress bar of every long step (``rich.progress``): what it does, how far, time spent and time left."""
    return Progress(TextColumn("{task.description:<28}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), console=console or make_console(stderr=True),
                    transient=transient, disable=disable)

"""The ``specgym`` console command: one entry point, one subcommand per job.

Each subcommand lives in its own module and registers itself through an ``add_parser(subparsers)`` function;
heavy imports (torch, transformers, stable-baselines3) happen inside handlers so ``specgym --help`` stays fast.
User errors (:class:`SpecgymError`) print one line and exit with status 2, never a traceback; so do the file
system's refusals (``OSError``) and running out of memory, where no check caught them first.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from specgym.commands.args import Parser, check_outputs_not_inputs
from specgym.errors import SpecgymError
from specgym.version import __version__

#: Modules that contribute subcommands, in help order, by group: ``specgym --help`` lists each group's commands under
#: its heading (none for the first). A module missing its optional dependencies still registers its parsers; the
#: handler reports what to install.
COMMAND_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("", (
        "specgym.commands.workloads",
        "specgym.commands.eval",
        "specgym.commands.train",
        "specgym.commands.live",
        "specgym.commands.predictor",
        "specgym.commands.tune",
        "specgym.commands.bench",
        "specgym.commands.demo",
        "specgym.commands.gpu_check",
    )),
    ("model building", (
        "specgym.commands.models",
        "specgym.commands.data",
        "specgym.commands.train_draft",
    )),
)
SUBCOMMAND_MODULES = tuple(module for _, modules in COMMAND_GROUPS for module in modules)


class _GroupedHelp(argparse.HelpFormatter):
    """The top parser's help formatter: the heading of a command group (:data:`COMMAND_GROUPS`) on its own line
    before the group's first command."""

    headings: dict[str, str] = {}  # first command of a group -> its heading (set by build_parser)

    def _format_action(self, action: argparse.Action) -> str:
        text = super()._format_action(action)
        heading = self.headings.get(action.dest) if not action.option_strings else None
        return f"\n{' ' * max(self._current_indent - 2, 0)}{heading}:\n{text}" if heading else text


def _grouped_help(headings: dict[str, str]) -> type[_GroupedHelp]:
    """The formatter of a parser whose command groups start at the commands ``headings`` names."""
    return type("GroupedHelp", (_GroupedHelp,), {"headings": headings})


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (all subcommands)."""
    parser = Parser(
        prog="specgym",
        description="Learn, compare and deploy speculation-length controllers for speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"specgym {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    headings: dict[str, str] = {}
    for heading, modules in COMMAND_GROUPS:
        before = len(sub.choices)
        for name in modules:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name == name:
                    continue
                raise
            module.add_parser(sub)
        if heading and len(sub.choices) > before:
            headings[list(sub.choices)[before]] = heading
    parser.formatter_class = _grouped_help(headings)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # bad options (one line on stderr) or --help / --version
        return int(exc.code or 0)
    except KeyboardInterrupt:
        print("specgym: interrupted", file=sys.stderr)
        return 130
    finally:
        _python_handles_sigint()
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        check_outputs_not_inputs(args)
        return int(args.func(args) or 0)
    except SpecgymError as exc:
        print(f"specgym {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specgym {args.command}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # a size no check foresaw: one line, not a traceback
        print(f"specgym {args.command}: error: out of memory (ask for less: fewer requests, resamples or "
              f"timesteps)", file=sys.stderr)
        return 2
    except OSError as exc:  # the file system said no (read-only folder, full disk) somewhere not checked before
        print(f"specgym {args.command}: error: {exc.filename or ''}{': ' if exc.filename else ''}"
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2


def _python_handles_sigint() -> None:
    """Hand SIGINT back to Python (KeyboardInterrupt) once start-up is over: each command cleans up on it."""
    try:
        handler = signal.getsignal(signal.SIGINT)  # the front door's start-up handler (cli may not import it)
        if getattr(handler, "__module__", None) == "specgym" and getattr(handler, "__name__", "") == "_startup_sigint":
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        pass


if __name__ == "__main__":
    sys.exit(main())

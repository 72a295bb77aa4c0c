"""The exception types the CLI turns into one-line error messages."""


class SpecgymError(Exception):
    """A user-facing error: bad input file, field, value or option. The message names what is wrong."""


class InvalidAction(SpecgymError, ValueError):
    """An environment action outside the action space (out of range, or not an integer)."""

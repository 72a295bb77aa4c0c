"""The one exception type the CLI turns into a one-line error message."""


class SpecgymError(Exception):
    """A user-facing error: bad input file, field, value or option. The message names what is wrong."""

"""One module per ``specgym`` subcommand; each registers its parsers through ``add_parser(subparsers)``."""

"""``python -m specgym`` = the ``specgym`` command."""

import sys

from specgym.cli import main

sys.exit(main())

"""``python -m perfutils ...``: see :mod:`perfutils.cli`."""

import sys

from .cli import main

sys.exit(main())

"""``python -m kvest``: see :mod:`kvest.cli`."""

import sys

from kvest.cli import main

sys.exit(main())

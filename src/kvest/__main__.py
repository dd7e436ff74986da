"""``python -m kvest``: see :mod:`kvest.cli`."""

import os
import sys

from kvest.cli import main

try:
    status = main()
    sys.stdout.flush()
except BrokenPipeError:
    # The reader went away (`python -m kvest | head`): stop quietly, as Unix
    # tools do.  Point stdout at devnull so the interpreter's own flush at exit
    # does not fail a second time.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    status = 1
sys.exit(status)

"""``python -m jobs.sweep``: see ``jobs.sweep.cli``."""

import sys

from jobs.sweep.cli import main

sys.exit(main())

"""``python -m jobs.tune``: see ``jobs.tune.cli``."""

import sys

from jobs.tune.cli import main

sys.exit(main())

"""``python -m jobs.deploy``: see ``jobs.deploy.cli``."""

import sys

from jobs.deploy.cli import main

sys.exit(main())

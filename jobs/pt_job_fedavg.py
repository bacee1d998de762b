"""Synchronous FedAvg on simulated edge devices: ``python jobs/pt_job_fedavg.py --help``.

Every selected device's update is awaited before the next global model (selection = updates per model =
min hole to fill), which is what makes this FedAvg rather than FedBuff.
"""

from __future__ import annotations

import sys

from common.choices import ConfigError
from jobs.cli import build_parser, config_from_args
from jobs.driver import run


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args, "fedavg")
    except ConfigError as ex:
        parser.error(str(ex))
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())

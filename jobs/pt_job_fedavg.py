"""Synchronous FedAvg on simulated edge devices: ``python jobs/pt_job_fedavg.py --help``.

Every selected device's update is awaited before the next global model (selection = updates per model =
min hole to fill), which is what makes this FedAvg rather than FedBuff.
"""

from __future__ import annotations

import sys

from jobs.cli import build_parser, config_from_args
from jobs.config import JobConfig
from jobs.driver import run


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0], JobConfig(method="fedavg"))
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args, "fedavg")
    except ValueError as ex:
        parser.error(str(ex))
    if cfg.num_updates_for_model != cfg.device_selection_size or cfg.min_hole_to_fill != cfg.device_selection_size:
        parser.error(
            "synchronous FedAvg waits for every selected device: leave --num-updates-for-model and "
            "--min-hole-to-fill at the selection size, or use jobs/pt_job_fedrevive.py --method fedbuff for async"
        )
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())

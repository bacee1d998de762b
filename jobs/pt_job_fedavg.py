"""Synchronous FedAvg on simulated edge devices: ``python jobs/pt_job_fedavg.py --help``.

Every selected device's update is awaited before the next global model (selection = updates per model =
min hole to fill), which is what makes this FedAvg rather than FedBuff.
"""

from __future__ import annotations

if __name__ == "__main__":  # the imports below, torch's among them, without the garbage collector (common.startup_gc)
    from common import startup_gc

    startup_gc.pause()

from jobs.cli import job_main  # noqa: E402
from jobs.run.process_guard import exit_now  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return job_main(__doc__, argv, method="fedavg")


if __name__ == "__main__":
    exit_now(main())

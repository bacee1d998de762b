"""Asynchronous FL on simulated edge devices: FedRevive (default), FedBuff, or FedAvg with the paper's presets.

``python jobs/pt_job_fedrevive.py --method fedrevive|fedbuff|fedavg --help``. Presets follow the FedRevive paper's
reference runs (concurrent devices / updates buffered per global model / server learning rate):
FedAvg 100 / 100 / 1.4, FedBuff 100 / 2 / 0.05, FedRevive 100 / 1 / 0.10 (``jobs.methods``); FedBuff and
FedRevive also take the paper's delays (--delays paper) unless a delay flag is given (--delays none: every update
at time 0, a serial chain; docs/simulated-time.md). Any preset value given as a flag wins; the presets applied
are printed at start. FedRevive's knobs are the ``--fr-*`` flags (one per ``FedReviveConfig`` field). Your own
method: ``--method package.module:Name`` (a ``jobs.methods.Method`` subclass; docs/bring-your-own.md).
"""

from __future__ import annotations

if __name__ == "__main__":  # the imports below, torch's among them, without the garbage collector (common.startup_gc)
    from common import startup_gc

    startup_gc.pause()

from jobs.cli import job_main  # noqa: E402
from jobs.run.process_guard import exit_now  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return job_main(__doc__, argv)


if __name__ == "__main__":
    exit_now(main())

"""Watches a SimEnv run from the driver: notices a dead server, and a job that will not end after its outcome.

NVFlare's simulator runs the server in one process and each leaf in a ``simulator_worker`` process below it. If
the server process dies (a crash, an out-of-memory kill, ``kill -9``) nothing else notices: the leaves and the
driver wait forever. And once the server has decided the run's outcome (``metrics.json``'s ``outcome``), NVFlare
may still wait at shutdown for a leaf that is gone. The watchdog samples the process tree every ``interval``
seconds and, in either case, stops every process of the job (the driver's ``recipe.run`` then returns), recording
what happened in ``reason``.
"""

from __future__ import annotations

import threading
import time

import psutil

from jobs.process_guard import stop_processes
from jobs.results import read_metrics


class Watchdog:
    """Args:
    results_dir: the run's results folder (its ``metrics.json`` says when the server decided the outcome).
    shutdown_grace: seconds the job may take to end after its outcome.
    interval: seconds between checks.
    """

    def __init__(self, results_dir: str, shutdown_grace: float = 60.0, interval: float = 1.0):
        self.results_dir = results_dir
        self.shutdown_grace = shutdown_grace
        self.interval = interval
        self.reason = ""  # set when the watchdog stopped the job
        self._server: psutil.Process | None = None
        self._outcome_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _outcome_decided(self) -> bool:
        return "outcome" in read_metrics(self.results_dir)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval):
            try:
                tree = me.children(recursive=True)
            except psutil.Error:
                continue
            if self._server is None:  # the server is the parent of the leaf processes
                for p in tree:
                    try:
                        if "simulator_worker" in " ".join(p.cmdline()):
                            self._server = p.parent()
                            break
                    except psutil.Error:
                        pass
            if self._outcome_at is None and self._outcome_decided():
                self._outcome_at = time.time()
            if self._server is not None and self._outcome_at is None and not _alive(self._server):
                if self._outcome_decided():  # it wrote the outcome just before ending: a normal end
                    self._outcome_at = time.time()
                else:
                    self.reason = f"the NVFlare server process (pid {self._server.pid}) died"
                    stop_processes(tree, grace_seconds=5)
                    return
            if self._outcome_at is not None and time.time() - self._outcome_at > self.shutdown_grace:
                self.reason = f"NVFlare did not end the job within {self.shutdown_grace:g} s of its outcome"
                stop_processes(tree, grace_seconds=5)
                return


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

"""Watches a SimEnv run from the driver: notices a dead server, and a job that will not end after its outcome.

NVFlare's simulator runs the server in one process and each leaf in a ``simulator_worker`` process below it. If
the server process dies (a crash, an out-of-memory kill, ``kill -9``) nothing else notices: the leaves and the
driver wait forever. And once the server has decided the run's outcome (``metrics.json``'s ``outcome``), NVFlare
may still wait at shutdown for a leaf that is gone. The watchdog samples the process tree every ``interval``
seconds and, in either case, stops every process of the job (the driver's ``recipe.run`` then returns), recording
what happened in ``reason``.

After the outcome the server still evaluates and records the run's last version, which for a large model on a
CPU takes minutes. So the grace period counts from the outcome or from the last change of ``metrics.json``,
whichever is later, and grows by twice the longest evaluation recorded so far: a job is stopped only when it has
recorded nothing for longer than an evaluation could take.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

from common.result_files import METRICS
from jobs.run.process_guard import stop_processes
from jobs.run.results import read_metrics


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
        self._outcome_at: float | None = None  # when the outcome was seen, or metrics.json last changed after it
        self._mtime = 0.0  # of metrics.json at the last look
        self._decided = False  # metrics.json has the outcome
        self._longest_eval = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _look(self) -> bool:
        """Read ``metrics.json`` if it changed since the last look (whether the outcome is decided, the longest
        evaluation); True if it changed."""
        try:
            mtime = os.path.getmtime(os.path.join(self.results_dir, METRICS))
        except OSError:
            return False
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        metrics = read_metrics(self.results_dir)
        self._decided = self._decided or "outcome" in metrics
        evals = [r.get("eval_seconds") or 0.0 for r in metrics.get("versions", [])]
        self._longest_eval = max([self._longest_eval, *evals])
        return True

    @property
    def grace(self) -> float:
        """Seconds the job may record nothing after its outcome before it is stopped."""
        return self.shutdown_grace + 2 * self._longest_eval

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
            changed = self._look()
            if self._decided and (self._outcome_at is None or changed):
                self._outcome_at = time.time()  # decided, or still recording its last versions: not hanging
            if self._server is not None and self._outcome_at is None and not _alive(self._server):
                if self._look() and self._decided:  # it wrote the outcome just before ending: a normal end
                    self._outcome_at = time.time()
                else:
                    self.reason = f"the NVFlare server process (pid {self._server.pid}) died"
                    stop_processes(tree, grace_seconds=5)
                    return
            if self._outcome_at is not None and time.time() - self._outcome_at > self.grace:
                self.reason = f"NVFlare did not end the job within {self.grace:.0f} s of its last record"
                stop_processes(tree, grace_seconds=5)
                return


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

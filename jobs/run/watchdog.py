"""Watches a SimEnv run from the driver: notices a dead server, and a job that makes no progress after its outcome.

NVFlare's simulator runs the server in one process and each leaf in a ``simulator_worker`` process below it. If
the server process dies (a crash, an out-of-memory kill, ``kill -9``) nothing else notices: the leaves and the
driver wait forever. And once the server has decided the run's outcome (``metrics.json``'s ``outcome``), NVFlare
may still wait at shutdown for a leaf that is gone. The watchdog samples the process tree every ``interval``
seconds and, in either case, stops every process of the job (the driver's ``recipe.run`` then returns), recording
what happened in ``reason``.

Progress, not silence, decides. After the outcome the server still evaluates and records the run's last versions,
which for a large model on a busy CPU takes minutes per version, with nothing recorded meanwhile; so the server
beats while it works (``common.heartbeat``: ``working.json``). The grace counts from the outcome, from the last
change of ``metrics.json`` or from the last beat, whichever is latest: a job is stopped only when it has neither
recorded nor beaten for ``shutdown_grace`` seconds. A server that dies is noticed at the next look, before or
after the outcome (after it, unless it had already recorded the run's summary: its normal end).

A pack (several runs in one job, ``jobs.run.pack``) is watched through all its runs' folders: its outcome is
decided once every run's is, progress in any run counts, and it has finished once every run has.

``check`` is one look, given the time and whether the server lives, so its rules are tested without waiting.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import psutil

from common.heartbeat import read_heartbeat
from common.result_files import METRICS
from jobs.run.process_guard import stop_processes
from jobs.run.results import read_metrics


class RunWatch:
    """What the watchdog knows of one run's results folder, from its last look."""

    def __init__(self, results_dir: str):
        self.results_dir = results_dir
        self.mtime = 0.0  # of metrics.json at the last look
        self.beat: dict | None = None  # the last beat seen
        self.decided = False  # metrics.json has the outcome
        self.finished = False  # metrics.json has the run's summary (the server's END_RUN)

    def look(self) -> bool:
        """Read ``metrics.json`` if it changed since the last look (outcome, summary) and the heartbeat; True if
        either changed."""
        beat = read_heartbeat(self.results_dir)
        beaten = beat is not None and beat != self.beat
        self.beat = beat if beat is not None else self.beat
        try:
            mtime = os.path.getmtime(os.path.join(self.results_dir, METRICS))
        except OSError:
            return beaten
        if mtime == self.mtime:
            return beaten
        self.mtime = mtime
        metrics = read_metrics(self.results_dir)
        self.decided = self.decided or "outcome" in metrics
        self.finished = self.finished or "summary" in metrics
        return True


class Watchdog:
    """Args:
    results_dir: the run's results folder (its ``metrics.json`` says when the server decided the outcome and
        finished; its ``working.json`` that the server is at work); a pack's: every run's folder.
    shutdown_grace: seconds without progress (no record, no beat) the job may take after its outcome.
    interval: seconds between checks.
    """

    def __init__(self, results_dir: str | Sequence[str], shutdown_grace: float = 60.0, interval: float = 1.0):
        folders = [results_dir] if isinstance(results_dir, str) else list(results_dir)
        self.runs = [RunWatch(folder) for folder in folders]
        self.shutdown_grace = shutdown_grace
        self.interval = interval
        self.reason = ""  # set when the watchdog stopped the job
        self._server: psutil.Process | None = None
        self._progress_at: float | None = None  # the outcome's first sight, or the last progress after it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def grace(self) -> float:
        """Seconds the job may make no progress after its outcome before it is stopped."""
        return self.shutdown_grace

    def check(self, now: float, server_alive: bool | None) -> str:
        """One look at the run (every run of a pack): why to stop the job now ("": go on). ``server_alive``: None
        while the server process is not known yet. Called with the server's state sampled first, so an outcome or
        summary the server wrote just before it ended is seen by this look."""
        progressed = [run.look() for run in self.runs]  # every folder looked at, each time
        decided = all(run.decided for run in self.runs)
        if decided and (self._progress_at is None or any(progressed)):
            self._progress_at = now  # decided, or still recording or working on its last versions: not hanging
        if server_alive is False and not all(run.finished for run in self.runs):
            if decided:
                return "the NVFlare server process died after the run's outcome, before it finished its results"
            return "the NVFlare server process died"
        if self._progress_at is not None and now - self._progress_at > self.grace:
            beat = next((run.beat for run in self.runs if run.beat), None)
            what = f" (last at work: {beat['what']} version {beat['version']})" if beat else ""
            return f"NVFlare's job made no progress for {self.grace:.0f} s after its last record or beat{what}"
        return ""

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
            alive = None if self._server is None else _alive(self._server)
            reason = self.check(time.time(), alive)
            if reason:
                self.reason = reason if alive is not False else f"{reason} (pid {self._server.pid})"
                stop_processes(tree, grace_seconds=5)
                return


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False

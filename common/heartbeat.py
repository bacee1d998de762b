"""A run's sign of life while it works without recording anything: the heartbeat file ``working.json``.

After a run's outcome the server may work for minutes before it records anything (a ResNet-18 evaluation takes
over 100 s on a busy 2-core CPU; a checkpoint of a large model takes seconds). The driver's watchdog
(``jobs.run.watchdog``) stops a job that has made no progress for its grace period; silence is not progress,
but neither is it a hang when something is at work. So whoever does such work wraps it in ``Heartbeat``: a thread
rewrites ``working.json`` in the results folder every ``interval`` seconds while the work lasts, and once more when
it ends. The watchdog reads it (``read_heartbeat``) and counts any new beat as progress.

A beat is ``{"what": "evaluating", "version": 3, "at": <epoch seconds>, "beat": <n>, "pid": <writer>, "done":
false}``; it is written atomically (``common.jsonio``), so a reader never sees half of one. Several workers may
beat at once (the evaluator and a checkpoint): the file holds the latest beat, and every beat is a change.

It beats from a thread of its own, not from the work: a beat says the process is alive and at that work, not how
far it got. A hang inside the work (a deadlock) would keep beating; the work this wraps is bounded (one evaluation,
one checkpoint write), and a server that dies stops beating at once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time

from common.jsonio import write_json_atomic
from common.result_files import HEARTBEAT

BEAT_SECONDS = 2.0  # well under any watchdog grace (at least 60 s in a run; a few seconds in the load test)
_beats = itertools.count(1)  # one count per process: every beat differs from the one before, even within a tick
_write_lock = threading.Lock()  # two workers of one process never write the same temporary file at once


class Heartbeat:
    """Beats into ``folder/working.json`` while the ``with`` block runs; a folder of "" beats nowhere.

    Args:
        folder: the run's results folder (the watchdog's).
        what: the work, in a word or two ("evaluating", "checkpoint").
        version: the model version it works on, if any.
        interval: seconds between beats.
    """

    def __init__(self, folder: str, what: str, version: int | None = None, interval: float = BEAT_SECONDS):
        self.folder = folder
        self.what = what
        self.version = version
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{what}", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self.folder:
            self.beat()
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.folder:
            self._stop.set()
            self._thread.join()
            self.beat(done=True)

    def beat(self, done: bool = False) -> None:
        """Write one beat now (an unwritable folder is not the work's failure: the beat is skipped)."""
        payload = {
            "what": self.what,
            "version": self.version,
            "at": round(time.time(), 3),
            "beat": next(_beats),
            "pid": os.getpid(),
            "done": done,
        }
        with _write_lock, contextlib.suppress(OSError):
            write_json_atomic(os.path.join(self.folder, HEARTBEAT), payload)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()


def read_heartbeat(folder: str) -> dict | None:
    """The latest beat in ``folder`` (None without one, or one that cannot be read)."""
    try:
        with open(os.path.join(folder, HEARTBEAT)) as f:
            beat = json.load(f)
    except (OSError, ValueError):
        return None
    return beat if isinstance(beat, dict) else None


def clear_heartbeat(folder: str) -> None:
    """Remove the heartbeat once the job has ended (the driver): it is no result of the run."""
    with contextlib.suppress(OSError):
        os.remove(os.path.join(folder, HEARTBEAT))

"""Leaves no process behind: whatever ends a run (normal exit, Ctrl-C, SIGTERM, an exception), every process the
job started is stopped.

NVFlare's simulator runs the server and each leaf in subprocesses, and the leaf workers start their own process
groups, so a Ctrl-C in the terminal never reaches them and killing the driver orphans them (after ``timeout``
killed a driver, its server and its leaf workers kept running). The guard turns
SIGTERM into a normal exit and, on the way out, terminates the driver's descendants, then kills those that do
not stop within the grace period. ``exit_now`` ends a job script's process once all of that is done, without
the interpreter's slow teardown.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import psutil


def stop_processes(processes: list[psutil.Process], grace_seconds: float = 10.0) -> None:
    """SIGTERM every process, then SIGKILL those still running after ``grace_seconds``. List a whole tree before
    calling this, so no process is re-parented away when its parent dies."""
    for p in processes:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_seconds)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_seconds)


def descendants() -> set[tuple[int, float]]:
    """This process's descendants now, as (pid, start time): a pid alone may be reused."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            found.add((p.pid, p.create_time()))
        except psutil.NoSuchProcess:
            pass
    return found


def stop_descendants(grace_seconds: float = 10.0, spare: set[tuple[int, float]] = frozenset()) -> int:
    """Terminate (then kill) every descendant of this process but ``spare`` (``descendants()`` taken earlier) and
    theirs; returns how many there were."""
    children = []
    for p in psutil.Process().children(recursive=True):
        try:
            line = [p, *p.parents()]
            if not any((q.pid, q.create_time()) in spare for q in line):
                children.append(p)
        except psutil.NoSuchProcess:
            pass
    stop_processes(children, grace_seconds)
    return len(children)


class Interrupts:
    """Which signal (if any) ended the guarded block. NVFlare's simulator catches the KeyboardInterrupt itself and
    reports a failed run instead, so the driver asks here whether a failure was really an interrupt."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)

    def on_sigint(self, signum, _frame) -> None:
        self.signum = signum
        raise KeyboardInterrupt

    def on_sigterm(self, signum, _frame) -> None:
        self.signum = signum
        raise SystemExit(128 + signum)


@contextmanager
def no_orphans(grace_seconds: float = 10.0) -> Iterator[Interrupts]:
    """Stops, on the way out, every process started inside the block; those running before it (a tracker's
    service, ``jobs.tracking``) are not the job's and are left to their owner."""
    before = descendants()
    interrupts = Interrupts()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    if in_main_thread:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, interrupts.on_sigint)
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, interrupts.on_sigterm)
    try:
        yield interrupts
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stopped = stop_descendants(grace_seconds, spare=before)
        if stopped:
            print(f"[edgesim] stopped {stopped} process(es) the job left running")


def exit_now(code: int) -> NoReturn:
    """End a job's process with ``code`` as soon as its results are written: flush the console and the logs, then
    skip the interpreter's teardown. That teardown (a full garbage collection over torch's and NVFlare's modules,
    then freeing them) took 2 to 6 s after a run's last line on a shared 2-core machine, with nothing left to do:
    every process of the job has stopped and every result is on disk when ``job_main`` returns."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    logging.shutdown()
    os._exit(code)

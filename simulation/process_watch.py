"""Notices a task processor that starts child processes while the leaf's devices train, and says so once.

A ``torch.utils.data.DataLoader`` with ``num_workers > 0`` (NVFlare's example processors use 2) starts its worker
processes anew every time a device iterates it, unless they are persistent and made once. On a leaf that trains
several devices at once, that is several process starts per device, each a copy of the leaf's memory, competing
for the cores the leaf's plan shared out among its workers and torch threads. A simulator cannot remove that cost,
only show it: ``ChildProcessWatch`` samples the leaf process's children on a background thread and logs one
warning naming the fix when new ones appear.
"""

from __future__ import annotations

import logging
import threading

import psutil

SAMPLE_SECONDS = 0.5


class ChildProcessWatch:
    """Args:
    logger: where the warning goes.
    interval: seconds between samples of the process's children.
    process: the process to watch (default: this one).
    """

    def __init__(self, logger: logging.Logger, interval: float = SAMPLE_SECONDS, process: psutil.Process | None = None):
        self.logger = logger
        self.interval = interval
        self.process = process or psutil.Process()
        self.seen: set[int] = set()  # child pids that appeared after start
        self.warned = False
        self._baseline: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ChildProcessWatch:
        self._baseline = self._children()
        self._thread = threading.Thread(target=self._loop, name="child-process-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sample(self) -> int:
        """Record the children started since ``start``; warn the first time there are any. Returns how many
        have been seen in all."""
        new = self._children() - self._baseline
        self.seen |= new
        if new and not self.warned:
            self.warned = True
            self.logger.warning(
                f"the task processor starts child processes while devices train ({len(new)} seen at once, e.g. a "
                "DataLoader with num_workers > 0, which starts its workers anew for every device): each start costs "
                "a process launch and competes with the leaf's planned threads; use num_workers=0 in the "
                "processor's DataLoader (in-memory data needs no workers), or create persistent workers once in "
                "setup()"
            )
        return len(self.seen)

    def _children(self) -> set[int]:
        try:
            return {p.pid for p in self.process.children(recursive=True)}
        except psutil.Error:
            return set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

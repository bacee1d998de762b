"""Virtual clock of one leaf: device results are reported in simulated finish-time order, without sleeping.

Each dispatched task gets a simulated finish time (leaf clock at dispatch + sampled training and upload
seconds). A trained result is held until no task that would finish earlier is still training, then reported;
the leaf clock advances to its finish time. Ties (e.g. no heterogeneity: every task takes 0 s) release at once.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable


class ReleaseQueue:
    def __init__(self, release: Callable[[object, float], None]):
        self._release = release  # called as release(payload, finish_time), in finish-time order
        self._lock = threading.Lock()
        self._release_lock = threading.Lock()
        self._seq = itertools.count()
        self._outstanding: dict[int, float] = {}  # tasks dispatched, not yet trained
        self._ready: list[tuple[float, int, object]] = []
        self.now = 0.0  # the leaf's simulated clock, seconds

    def dispatch(self, duration: float, start: float | None = None) -> tuple[int, float]:
        """Register a task starting at ``start`` (default: now on the simulated clock); returns (ticket, finish)."""
        with self._lock:
            ticket = next(self._seq)
            finish = (self.now if start is None else start) + max(duration, 0.0)
            self._outstanding[ticket] = finish
            return ticket, finish

    def complete(self, ticket: int, payload: object) -> None:
        """A task finished training; report it and anything it was holding back, in order."""
        with self._lock:
            finish = self._outstanding.pop(ticket)
            heapq.heappush(self._ready, (finish, ticket, payload))
        self._drain()

    def _drain(self) -> None:
        # one releaser at a time keeps reports in order; others leave their results for it
        with self._release_lock:
            while True:
                with self._lock:
                    bound = min(self._outstanding.values(), default=float("inf"))
                    if not self._ready or self._ready[0][0] > bound:
                        return
                    finish, _, payload = heapq.heappop(self._ready)
                    self.now = max(self.now, finish)
                self._release(payload, finish)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._outstanding) + len(self._ready)

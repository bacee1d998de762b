"""Calls functions at wall-clock due times, earliest first, on one background thread.

With ``--time-scale`` > 0 a trained result must reach the leaf only when its scaled delay has passed. Sleeping
in the training worker would hold that worker (and with the vectorised engine its whole group) for the delay,
so new tasks would queue behind sleeping ones and results of one group would leave in group order instead of
due order. Handing the result to this timer frees the worker at once.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable


class DueTimer:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable, tuple]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._running = 0  # callbacks popped but not finished
        self._thread: threading.Thread | None = None

    def call_at(self, due: float, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` at wall time ``due`` (at once if it has passed)."""
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="due-timer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing is pending or running; False if ``timeout`` passed first."""
        deadline = time.time() + timeout
        with self._cond:
            while self._heap or self._running:
                left = deadline - time.time()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                wait = self._heap[0][0] - time.time()
                if wait > 0:
                    self._cond.wait(wait)  # woken early by an earlier due time, or by timeout
                    continue
                _, _, fn, args = heapq.heappop(self._heap)
                self._running += 1
            try:
                fn(*args)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

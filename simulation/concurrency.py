"""A concurrency limit that can be lowered while running (after a GPU out-of-memory error)."""

from __future__ import annotations

import threading


class AdjustableLimit:
    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self._active = 0
        self._cond = threading.Condition()

    def __enter__(self) -> AdjustableLimit:
        with self._cond:
            while self._active >= self.limit:
                self._cond.wait()
            self._active += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def halve(self) -> int:
        with self._cond:
            self.limit = max(1, self.limit // 2)
            return self.limit

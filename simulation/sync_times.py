"""The round trips of a leaf's (or relay's) syncs with its parent: each from the report made to its reply taken,
summed up in one log line at the task's end (``SYNC_SUMMARY``; ``benchmarks/perf/bench_protocol.py`` reads it)."""

from __future__ import annotations

import time

SYNC_SUMMARY = "syncs with the parent: {count}, round trip p50 {p50} ms, p99 {p99} ms"


class SyncTimes:
    def __init__(self) -> None:
        self.round_trips: list[float] = []  # seconds
        self._sent_at: float | None = None

    @property
    def count(self) -> int:
        return len(self.round_trips)

    def sent(self) -> None:
        """A report is being made."""
        self._sent_at = time.monotonic()

    def replied(self) -> None:
        """Its reply is being taken."""
        if self._sent_at is not None:
            self.round_trips.append(time.monotonic() - self._sent_at)
            self._sent_at = None

    def summary(self) -> str:
        """``SYNC_SUMMARY`` of the round trips so far."""
        ordered = sorted(self.round_trips)

        def at(q: float) -> str:
            return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0:.2f}"

        return SYNC_SUMMARY.format(count=len(ordered), p50=at(0.5), p99=at(0.99))

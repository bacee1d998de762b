"""Which of the server's children have news (newly selected devices on their leaves) they have not heard yet, and
the waker that tells them when the applier waits (``scheduling.waker``). One per job: a standalone job's assessor
and a pack's share it, since every run's devices sit on the same leaves.

A child hears its news in the reply to its next report (``heard``); a child still unaware when the applier waits for
an update is woken, with the child holding the awaited device."""

from __future__ import annotations

import threading
from collections.abc import Callable

from scheduling.leaf_watch import LeafWatch
from scheduling.waker import Waker


class ChildNews:
    """Args:
    leaves: the job's leaves and the children that carry them.
    leaf_of: the leaf a device is on (None: unknown), from the schedule's device pool.
    """

    def __init__(self, leaves: LeafWatch, leaf_of: Callable[[str], str | None]):
        self.leaves = leaves
        self.leaf_of = leaf_of
        self.waker: Waker | None = None  # from the run's start (it needs the engine)
        self._news: set[str] = set()  # children with newly selected devices they have not heard of yet
        self._lock = threading.Lock()

    def start(self, engine, log_warning: Callable[[str], None]) -> None:
        self.waker = Waker(engine, engine.new_context, log_warning)

    def note(self, devices: list[str]) -> None:
        """Newly selected ``devices``: the children above their leaves have news (they hear it on their next sync,
        or are woken when the applier waits)."""
        with self._lock:
            self._news.update(self.leaves.child_of(leaf) for leaf in map(self.leaf_of, devices) if leaf is not None)

    def note_leaves(self, leaves: set[str]) -> None:
        """The children above ``leaves`` have news (a pack's release: ``PackAssessor``)."""
        with self._lock:
            self._news.update(self.leaves.child_of(leaf) for leaf in leaves)

    def heard(self, child: str) -> None:
        """``child``'s reply is being built from the view as of now: it carries the news."""
        with self._lock:
            self._news.discard(child)

    def wake_for(self, awaited: str) -> None:
        """The applier waits for ``awaited``'s update: wake every child that has not heard of its newly selected
        devices yet, and the one holding ``awaited`` (an idle leaf sleeps until woken; a busy one batches its
        results, except an awaited device's)."""
        leaf = self.leaf_of(awaited)
        holder = self.leaves.child_of(leaf) if leaf is not None else None
        with self._lock:
            news, self._news = self._news, set()
        if self.waker is not None:
            self.waker.wake(news, holder, awaited)

    @property
    def wakes_sent(self) -> int:
        return self.waker.sent if self.waker is not None else 0

    def stop(self) -> None:
        if self.waker is not None:
            self.waker.stop()

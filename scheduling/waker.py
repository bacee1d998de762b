"""Wakes the server's children when it waits for an update that has not come: a fire-and-forget ``WAKE_TOPIC``
aux message, saying which children have news (newly selected devices: they sync at once) and which device is
awaited (its leaf sends that device's update the moment it has it).

The assessor hands the names here; one thread sends the messages, so the applier never waits on the network, and
what is handed over while a message is being sent goes together in the next one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from nvflare.apis.shareable import Shareable

from common.protocol import AWAITED, NEWS_FOR, WAKE_TOPIC


class Waker:
    """Args:
    engine: the server engine (``send_aux_request``).
    new_context: makes an ``FLContext`` for the waker's thread.
    log_error: reports a wake that could not be sent.
    """

    def __init__(self, engine, new_context: Callable, log_error: Callable[[str], None] = print):
        self.engine = engine
        self.new_context = new_context
        self.log_error = log_error
        self.sent = 0  # wake messages sent (to one child each)
        self._pending: set[str] = set()  # children to wake
        self._news: set[str] = set()  # of them, those with news
        self._awaited: list[str] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="waker", daemon=True)
        self._thread.start()

    def wake(self, news: Iterable[str], holder: str | None = None, awaited: str | None = None) -> None:
        """Wake the children with ``news``, and ``holder`` (the child holding the ``awaited`` device)."""
        with self._cond:
            news = set(news)
            self._news |= news
            self._pending |= news | ({holder} if holder else set())
            if awaited is not None:
                self._awaited = [awaited]
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(5)

    def _run(self) -> None:
        fl_ctx = self.new_context()
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                targets, self._pending = sorted(self._pending), set()
                request = Shareable()
                request[NEWS_FOR], request[AWAITED] = sorted(self._news), list(self._awaited)
                self._news = set()
            try:
                self.engine.send_aux_request(
                    targets=targets, topic=WAKE_TOPIC, request=request, timeout=0, fl_ctx=fl_ctx, optional=True
                )
            except Exception as ex:  # a wake is an optimisation: the child's heartbeat sync brings the news anyway
                self.log_error(f"could not wake {targets}: {type(ex).__name__}: {ex}")
                continue
            self.sent += len(targets)

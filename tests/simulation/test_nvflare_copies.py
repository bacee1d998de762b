"""What our copies of NVFlare's bodies, and the fixes that rely on NVFlare's own, must still do, run as NVFlare
runs them (``common/nvflare_private.py``, ``simulation/nvflare_private.py``; their sources' digests: ``tests/simulation/test_nvflare_guard.py``)."""

from __future__ import annotations

import threading

from common import nvflare_private


def test_a_real_nvflare_retry_loop_sleeps_at_most_the_cap_once_installed(monkeypatch):
    """The behaviour, on NVFlare's own function (not a stand-in of the same name): ClientRunner._send_task_result
    retries a result its server could not take after sleeping ``task_check_interval`` (5 s); capped, it sleeps
    SIMULATOR_POLL, and goes on retrying as before."""
    import time

    from nvflare.private.fed.client import client_runner

    monkeypatch.setattr(client_runner, "time", time)  # NVFlare's own, restored after the test
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    nvflare_private.quick_simulator_polls()
    outcomes = iter([client_runner._TASK_CHECK_RESULT_TRY_AGAIN, client_runner._TASK_CHECK_RESULT_OK])

    class Runner:
        task_check_interval = 5.0
        run_abort_signal = type("Signal", (), {"triggered": False})()

        def log_debug(self, *_):
            pass

        def log_info(self, *_):
            pass

        def _try_send_result_once(self, *_):
            return next(outcomes)

    assert client_runner.ClientRunner._send_task_result(Runner(), None, "task", None) is True
    assert slept == [nvflare_private.SIMULATOR_POLL]


def test_the_copied_sync_loop_reports_again_at_once_after_sync_now_and_ends_when_its_task_is_done():
    """Fix 6's copy of NVFlare's ``_do_task``, run as NVFlare runs it: with a heartbeat of 60 s, a ``sync_now()``
    sends the next report at once, each reply reaches the updater and ``after_parent_reply``, and a finished task
    ends the loop (with the final report, as NVFlare's does)."""
    import math
    from types import SimpleNamespace

    from nvflare.apis.shareable import ReturnCode, Shareable
    from nvflare.apis.signal import Signal

    from simulation.nvflare_private import EventDrivenSync

    sent: list[str] = []
    arrived = threading.Condition()

    class Engine:
        def send_aux_request(self, targets, topic, request, timeout, fl_ctx):
            with arrived:
                sent.append(request)
                arrived.notify_all()
            reply = Shareable()
            reply.set_return_code(ReturnCode.OK)
            return {targets: reply}

    class Updater:
        replies = 0

        def process_parent_update_reply(self, reply, fl_ctx):
            self.replies += 1
            return True

    class Leaf(EventDrivenSync):
        update_timeout = 5.0

        def __init__(self):
            self.sync_cond, self.sync_due = threading.Condition(), math.inf
            self._pending_task = SimpleNamespace(update_interval=60.0, name="train", seq=1)
            self._task_done = self._process_error = False
            self._parent_name, self._num_children, self._updater = "parent", 0, Updater()
            self.changes: list[bool] = []

        def _make_update_report(self, task_info, fl_ctx):
            return f"report {len(sent) + 1}"

        def _pending_clients_status(self):
            return 0, 0

        def after_parent_reply(self, changed, fl_ctx):
            self.changes.append(changed)

        def log_info(self, *_):
            pass

        log_error = log_exception = log_info

    def wait_for(count: int) -> bool:
        with arrived:
            return arrived.wait_for(lambda: len(sent) >= count, timeout=10)

    leaf = Leaf()
    result = []
    thread = threading.Thread(
        target=lambda: result.append(leaf._do_task(SimpleNamespace(get_engine=Engine), Signal())), daemon=True
    )
    thread.start()
    assert wait_for(1)
    leaf.sync_now()  # a device's result: the next report goes now, not after the 60 s heartbeat
    assert wait_for(2)
    leaf._task_done = True
    leaf.sync_now()
    thread.join(10)
    assert not thread.is_alive()
    assert sent == ["report 1", "report 2"] and result == ["report 3"]
    assert leaf._updater.replies == 2 and leaf.changes == [True, True]

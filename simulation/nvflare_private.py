"""The leaf's fixes to NVFlare 2.9 (fixes 1, 6 and 16 of ``docs/nvflare-upstream.md``): its executor renders no
payload and syncs when there is news, and its plan counts NVFlare's job processes by their command line.

Every private NVFlare name a leaf's own code touches lives here; what every process installs is in
``common.nvflare_private``. Each name, copy and relied-on body is checked by ``tests/simulation/test_nvflare_private.py``
and ``tests/simulation/test_nvflare_guard.py`` (digests in ``NVFLARE_COPIES``, ``NVFLARE_RELIED_ON``).
"""

from __future__ import annotations

import math
import threading
import time

from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.job_def import JobMetaKey
from nvflare.apis.shareable import ReturnCode, Shareable, make_reply
from nvflare.apis.signal import Signal
from nvflare.edge.constants import EdgeApiStatus, EdgeContextKey, EdgeTaskHeaderKey
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.utils import message_topic_for_task_update
from nvflare.edge.web.models.job_response import JobResponse

# module.Class.function -> digest of its source in TESTED_NVFLARE (``jobs.nvflare_guard.source_digest``)
NVFLARE_COPIES = {  # bodies a fix copies, with its one change (each copy names its original)
    "nvflare.edge.executors.hug.HierarchicalUpdateGatherer._do_task": "9bc74a20b409322f",
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_request": "37e246d09f8ceb2f",
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_job_request": "2b0675c596a5ff40",
}
NVFLARE_RELIED_ON = {  # bodies whose behaviour a fix depends on (the fix's number)
    "nvflare.private.fed.client.client_executor.JobExecutor.start_app": "4502e22529d7b38c",  # 16
}
NVFLARE_CLIENT_JOB_MODULE = "nvflare.private.fed.app.client.worker_process"  # fix 16: one per client per job
NVFLARE_SIMULATOR_WORKER_MODULE = "nvflare.private.fed.app.simulator.simulator_worker"  # fix 16: one per SimEnv leaf
NVFLARE_PRIVATE_OVERRIDES = {
    "nvflare.edge.executors.hug.HierarchicalUpdateGatherer._do_task": ("self", "fl_ctx", "abort_signal"),
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_request": (
        "self",
        "event_type",
        "fl_ctx",
        "process_f",
        "no_task_reply",
    ),
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_job_request": ("self", "event_type", "fl_ctx"),
}
NVFLARE_PRIVATE_ATTRIBUTES = {
    "nvflare.edge.executors.hug.HierarchicalUpdateGatherer": (
        "_pending_task",
        "_task_done",
        "_process_error",
        "_parent_name",
        "_num_children",
        "_updater",
        "_make_update_report",
        "_pending_clients_status",
    ),
}


class NoPayloadRendering:
    """Mixin for an ``EdgeTaskExecutor``: its device-request handlers without rendering requests or replies."""

    def _handle_edge_request(self, event_type: str, fl_ctx: FLContext, process_f, no_task_reply):
        # a copy of EdgeTaskExecutor._handle_edge_request (NVFLARE_COPIES), without its two payload-rendering logs
        task_info = self.get_current_task(fl_ctx)
        if not task_info:
            reply = no_task_reply
        else:
            request = fl_ctx.get_prop(EdgeContextKey.REQUEST_FROM_EDGE)
            reply = process_f(request=request, fl_ctx=fl_ctx, current_task=task_info)
        fl_ctx.set_prop(EdgeContextKey.REPLY_TO_EDGE, reply, private=True, sticky=False)

    def _handle_edge_job_request(self, event_type: str, fl_ctx: FLContext):
        # a copy of EdgeTaskExecutor._handle_edge_job_request (NVFLARE_COPIES), without its payload-rendering log
        job_name = fl_ctx.get_prop(FLContextKey.JOB_META).get(JobMetaKey.JOB_NAME)
        reply = JobResponse(EdgeApiStatus.OK, fl_ctx.get_job_id(), job_name, job_data={})
        fl_ctx.set_prop(EdgeContextKey.REPLY_TO_EDGE, reply, private=True, sticky=False)


class EventDrivenSync:
    """Mixin for a ``HierarchicalUpdateGatherer`` (an edge executor): its sync loop (``_do_task``), waking when a
    sync is asked for instead of sleeping a fixed interval (fix 6). The class sets
    ``self.sync_cond = threading.Condition()`` and ``self.sync_due = math.inf`` in its constructor."""

    sync_cond: threading.Condition
    sync_due: float

    def sync_now(self) -> None:
        """Report to the parent at once (there is something to send, or news to fetch)."""
        self.sync_soon(0.0)

    def sync_soon(self, delay: float) -> None:
        """Report to the parent within ``delay`` seconds (what else arrives by then goes in the same report)."""
        with self.sync_cond:
            self.sync_due = min(self.sync_due, time.monotonic() + delay)
            self.sync_cond.notify()

    def _wait_for_sync(self, interval: float) -> None:
        """Until a sync is due, or ``interval`` (the heartbeat) has passed."""
        heartbeat = time.monotonic() + interval
        with self.sync_cond:
            while (due := min(self.sync_due, heartbeat)) > time.monotonic():
                self.sync_cond.wait(due - time.monotonic())
            self.sync_due = math.inf

    def after_parent_reply(self, changed: bool, fl_ctx: FLContext) -> None:
        """Called with what ``process_parent_update_reply`` returned, after each reply."""

    def _do_task(self, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        # a copy of HierarchicalUpdateGatherer._do_task (NVFLARE_COPIES), with its sleep replaced by the event
        task_info = self._pending_task
        update_interval = task_info.update_interval
        engine = fl_ctx.get_engine()
        while not (self._task_done or self._process_error):
            report = self._make_update_report(task_info, fl_ctx)
            replies = engine.send_aux_request(
                targets=self._parent_name,
                topic=message_topic_for_task_update(task_info.name),
                request=report,
                timeout=self.update_timeout,
                fl_ctx=fl_ctx,
            )
            if len(replies) != 1:
                self.log_error(fl_ctx, f"no reply from parent {self._parent_name}")
                self._process_error = True
                break
            reply = next(iter(replies.values()))
            if not isinstance(reply, Shareable):
                self.log_error(fl_ctx, f"bad reply from parent {self._parent_name}: {type(reply)}")
                self._process_error = True
                break
            rc = reply.get_return_code()
            if rc == ReturnCode.TASK_ABORTED:
                self.log_info(fl_ctx, f"task {task_info.seq} is done: parent task is gone")
                break
            if rc != ReturnCode.OK:
                if not (rc == ReturnCode.TIMEOUT and self._task_done):
                    self.log_error(fl_ctx, f"error updating parent {self._parent_name}: {rc}")
                break
            if reply.get_header(EdgeTaskHeaderKey.TASK_SEQ, task_info.seq) != task_info.seq:
                self.log_info(fl_ctx, f"task {task_info.seq} is done: the parent moved on")
                break
            if self._num_children > 0 and self._pending_clients_status()[0] >= self._num_children:
                self.log_info(fl_ctx, f"task {task_info.seq} is done: all child clients are done")
                break
            try:
                changed = self._updater.process_parent_update_reply(reply, fl_ctx)
            except Exception as ex:
                self.log_exception(fl_ctx, f"processing the parent's reply failed: {ex}")
            else:
                self.after_parent_reply(bool(changed), fl_ctx)
            if abort_signal.triggered:
                return make_reply(ReturnCode.TASK_ABORTED)
            self._wait_for_sync(update_interval)
        if self._process_error:
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        return self._make_update_report(task_info, fl_ctx)


class QuietEdgeModelExecutor(NoPayloadRendering, EdgeModelExecutor):
    """NVFlare's stock leaf executor (``EdgeModelExecutor``: summing aggregators, the newest model), without
    rendering payloads. Same arguments."""

"""Every use of NVFlare's private names in this project, in one place (NVFlare 2.9).

``tests/simulation/test_nvflare_private.py`` fails, naming the name, if an NVFlare upgrade renames or reshapes
any of them, before a run silently changes behaviour.

1. **No payload rendering.** ``EdgeTaskExecutor._handle_edge_request`` evaluates ``f"received edge request:
   {request}"`` and ``f"Reply to edge: {reply}"`` for every device request, even with debug logging off; each
   renders a whole model or diff with numpy's ``repr`` (about 15 ms per device each, measured as most of a leaf's
   CPU). ``NoPayloadRendering`` overrides the two handlers with the same behaviour minus the rendering; our leaf
   executor uses it, and ``QuietEdgeModelExecutor`` is NVFlare's stock leaf executor with it (``use_fast_simulator``
   puts it in place of a recipe's ``EdgeModelExecutor``).
2. **A built job's apps.** ``FedJob`` keeps each target's app in ``_deploy_map`` and has no public way to replace a
   component it holds; ``use_fast_simulator`` replaces the clients' runner and executor there
   (``client_app_config``, ``server_app_config``), and reaches a recipe's job through ``Recipe._job``
   (``recipe_job``).
3. **The leaves' sync interval.** ``ScatterAndGatherForEdge`` keeps ``update_interval`` and ``assess_interval`` as
   ``_update_interval`` and ``_assess_interval`` (NVFlare exports a component's arguments from those attributes);
   ``set_sync_interval`` changes them on a built job.
4. **One thread for finished streams.** NVFlare streams every aux message (each leaf sync and its reply), and each
   received stream's ``RxTask._schedule_remove_task`` starts a ``threading.Timer`` thread that sleeps 65 s before
   removing the finished stream. A process receiving a few syncs a second thus holds hundreds of idle threads
   (``benchmarks/bench_soak.py``: a leaf went from 129 to 297 threads in 150 FedBuff versions), and a faster
   protocol would hold thousands. ``share_stream_cleanup_thread`` gives every finished stream's removal, with the
   same delay, to one scheduler thread per process; our server and leaf components install it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.job_def import ALL_SITES, SERVER_SITE_NAME, JobMetaKey
from nvflare.edge.constants import EdgeApiStatus, EdgeContextKey
from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.job_config.api import FedJob
from nvflare.recipe.spec import Recipe

from simulation.due_timer import DueTimer

NVFLARE_PRIVATE_OVERRIDES = {
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_request": (
        "self",
        "event_type",
        "fl_ctx",
        "process_f",
        "no_task_reply",
    ),
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_job_request": ("self", "event_type", "fl_ctx"),
}
NVFLARE_PRIVATE_PATCHES = {
    "nvflare.fuel.f3.streaming.byte_receiver.RxTask._schedule_remove_task": ("self", "ttl"),
    "nvflare.fuel.f3.streaming.byte_receiver.RxTask._remove_task": ("self",),
}
NVFLARE_PRIVATE_ATTRIBUTES = {
    "nvflare.job_config.api.FedJob": ("_deploy_map",),
    "nvflare.recipe.spec.Recipe": ("_job",),
    "nvflare.edge.controllers.sage.ScatterAndGatherForEdge": ("_update_interval", "_assess_interval"),
}


class NoPayloadRendering:
    """Mixin for an ``EdgeTaskExecutor``: its device-request handlers without rendering requests or replies."""

    def _handle_edge_request(self, event_type: str, fl_ctx: FLContext, process_f, no_task_reply):
        task_info = self.get_current_task(fl_ctx)
        if not task_info:
            reply = no_task_reply
        else:
            request = fl_ctx.get_prop(EdgeContextKey.REQUEST_FROM_EDGE)
            reply = process_f(request=request, fl_ctx=fl_ctx, current_task=task_info)
        fl_ctx.set_prop(EdgeContextKey.REPLY_TO_EDGE, reply, private=True, sticky=False)

    def _handle_edge_job_request(self, event_type: str, fl_ctx: FLContext):
        job_name = fl_ctx.get_prop(FLContextKey.JOB_META).get(JobMetaKey.JOB_NAME)
        reply = JobResponse(EdgeApiStatus.OK, fl_ctx.get_job_id(), job_name, job_data={})
        fl_ctx.set_prop(EdgeContextKey.REPLY_TO_EDGE, reply, private=True, sticky=False)


class QuietEdgeModelExecutor(NoPayloadRendering, EdgeModelExecutor):
    """NVFlare's stock leaf executor (``EdgeModelExecutor``: summing aggregators, the newest model), without
    rendering payloads. Same arguments."""


def recipe_job(recipe: Recipe) -> FedJob:
    """The job a recipe builds (and runs)."""
    return recipe._job  # noqa: SLF001 - see the module docstring (2)


def _apps(job: FedJob) -> dict:
    return job._deploy_map  # noqa: SLF001 - see the module docstring (2)


def client_app_config(job: FedJob):
    """The ``ClientAppConfig`` every client runs (``components``: id -> component; ``executors``)."""
    app = _apps(job).get(ALL_SITES)
    if app is None:
        raise ValueError(
            "the job has no app for all clients (@ALL): configure its clients and its device simulation "
            "first (EdgeJob.configure_client, EdgeJob.configure_simulation)"
        )
    return app.app_config


def server_app_config(job: FedJob):
    """The ``ServerAppConfig`` of the server (``components``; ``workflows``)."""
    app = _apps(job).get(SERVER_SITE_NAME)
    if app is None:
        raise ValueError("the job has no server app")
    return app.app_config


def set_sync_interval(controller: ScatterAndGatherForEdge, update_interval: float) -> None:
    """Leaves sync with their parents every ``update_interval`` seconds; the server assesses at least as often."""
    controller._update_interval = update_interval  # noqa: SLF001 - see the module docstring (3)
    controller._assess_interval = min(controller._assess_interval, update_interval)  # noqa: SLF001


class _Scheduled:
    """A delayed removal on ``STREAM_CLEANUP``; what ``RxTask`` keeps as its ``cleanup_timer`` (``cancel()``)."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def run(self, fn: Callable[[], None]) -> None:
        if not self.cancelled:
            try:
                fn()
            except Exception:  # a stream already gone: nothing left to remove
                pass


STREAM_CLEANUP = DueTimer()  # every finished stream's delayed removal, on one thread per process
ORIGINALS: dict[str, Callable] = {}  # NVFlare's own methods this process replaced, by name


def share_stream_cleanup_thread() -> None:
    """Make every finished stream's delayed removal a call on ``STREAM_CLEANUP`` instead of a ``threading.Timer``
    thread of its own (see the module docstring, 4). Same delay, same removal; idempotent, once per process."""
    from nvflare.fuel.f3.streaming.byte_receiver import RxTask

    if "RxTask._schedule_remove_task" in ORIGINALS:
        return
    ORIGINALS["RxTask._schedule_remove_task"] = RxTask._schedule_remove_task  # noqa: SLF001

    def _schedule_remove_task(self, ttl: float = None):
        with self.stop_lock:
            if self.cleanup_timer:
                return
            scheduled = _Scheduled()
            delay = self.completed_task_ttl if ttl is None else ttl
            STREAM_CLEANUP.call_at(time.time() + delay, scheduled.run, self._remove_task)
            self.cleanup_timer = scheduled

    RxTask._schedule_remove_task = _schedule_remove_task  # noqa: SLF001 - see the module docstring (4)

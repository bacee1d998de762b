"""The leaf's device simulator: trains its selected devices as fast as the machine allows.

Each leaf runs one ``FastSimulator`` (started by ``simulation.leaf_runner.FastDeviceRunner``). It reaches the
leaf through a channel (``simulation.leaf_channels``): through the leaf executor's gateway when the executor is
ours (tasks of every newly selected device taken at once, the moment the leaf learns of them, a group's results
given back in one call and sent up at once), or through NVFlare's edge protocol, as real devices do, when it is
not (``use_fast_simulator`` on someone else's recipe). Either way:

* devices the server released together (``scheduling.applier``: a synchronous round, or every device an
  asynchronous run selected since the server last needed one it had not released) are trained together, each
  from its own model version: sorted by (selection, device) and cut into groups of at most ``group_size`` for one
  training call (the vectorised engine); a release of several selections is cut into at least one group per
  worker. Releases are a function of the schedule, not of when the leaf syncs, so the groups, and the bits of
  every diff, are the same in every run with the same workers; each device still reports its own result. A
  channel that cannot tell releases (NVFlare's edge requests) groups the devices of one selection. In a pack
  (``docs/packs.md``) on exact time the channel hands out release n of every run together once every run has made
  it (lock-step, ``GatewayChannel``), and the runs that can share a step train release n in cross-run groups
  (``processors.pack_trainer``); otherwise a group holds one run's devices;
* nothing waits on simulated time: the server orders the updates (``scheduling.exact_assessor``). Only the
  real-time mode (``time_scale`` > 0, for load tests) holds each result for its delays x ``time_scale`` wall
  seconds after dispatch, on a timer (``due_timer``) so the worker is freed at once;
* a task that raises is retried, then logged with the device id and reported as a zero-weight update when the
  channel offers one (its slot is freed, the mean of the others unchanged), else with an error status; either way
  its last error goes with it, one short line (``common.protocol.short_error``), so a server whose devices keep
  failing stops the run naming it (``scheduling.failure_streak``); a GPU out-of-memory error halves the leaf's
  concurrency (or group size) for the rest of the run;
* no request, task or result is ever rendered as text (NVFlare's debug f-strings do: ``simulation.nvflare_private``,
  fix 1).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nvflare.fuel.utils.log_utils import get_obj_logger
from nvflare.security.logging import secure_format_exception

from common.delays import DeviceDelays
from common.due_timer import DueTimer
from common.protocol import short_error
from simulation.concurrency import AdjustableLimit
from simulation.leaf_channels import DeviceTask, LeafChannel

MAX_ATTEMPTS = 3
WORK_WAIT = 0.5  # seconds a look for new tasks may wait before the loop checks whether the run is over


def is_out_of_memory(ex: BaseException) -> bool:
    return "out of memory" in str(ex).lower() or type(ex).__name__ == "OutOfMemoryError"


def make_groups(
    tasks: list[DeviceTask], group_size: int, workers: int = 1, run_classes: dict[int, int] | None = None
) -> list[list[DeviceTask]]:
    """Tasks of one run and release (else of one run and selection), sorted by (run, selection, device), cut into
    groups of at most ``group_size``: the same groups whatever order the tasks came in. A release of several
    selections (an asynchronous run's pending devices, of several model versions) is cut into at least ``workers``
    groups of equal size (as far as it has devices), so every worker trains; one selection is cut as it always was.
    ``run_classes`` (a pack in lock-step, ``GatewayChannel``): run -> the first run it shares a step with; release
    n of the runs of one class is one release here, cut into cross-run groups. Without it a pack's runs never
    share a group."""
    classes = run_classes or {}
    by_key: dict[tuple[int, int, int], list[DeviceTask]] = {}
    for t in tasks:
        key = (classes.get(t.run, t.run), 0, t.release) if t.release is not None else (t.run, 1, t.selection_id)
        by_key.setdefault(key, []).append(t)
    groups = []
    for key in sorted(by_key):
        same = sorted(by_key[key], key=lambda t: (t.run, t.selection_id, t.device))
        size = group_size
        if len({(t.run, t.selection_id) for t in same}) > 1:
            parts = max(math.ceil(len(same) / group_size), min(workers, len(same)))
            size = math.ceil(len(same) / parts)
        groups += [same[i : i + size] for i in range(0, len(same), size)]
    return groups


class FastSimulator:
    """Args:
    channel: how the simulator reaches its leaf (``simulation.leaf_channels``).
    num_workers: threads that train (the pool's size).
    get_job_timeout: seconds to wait for the job to reach the leaf.
    delays: the run's delay model (the real-time mode's holding times).
    time_scale: 0: report at once; S > 0: hold each result for its delays x S wall seconds.
    on_report: called with one dict per device report (wall time, device, version, selection, ok, group, the
        group's training seconds).
    group_size: devices a worker trains together (1: one at a time).
    """

    def __init__(
        self,
        channel: LeafChannel,
        num_workers: int,
        get_job_timeout: float,
        delays: DeviceDelays,
        time_scale: float = 0.0,
        on_report: Callable[[dict], None] | None = None,
        group_size: int = 1,
    ):
        self.channel = channel
        self.get_job_timeout = get_job_timeout
        self.delays = delays
        self.time_scale = time_scale
        self.group_size = max(1, group_size)
        self.num_workers = num_workers
        self.worker_pool = ThreadPoolExecutor(num_workers, thread_name_prefix="device-worker")
        self.limit = AdjustableLimit(num_workers)
        self.logger = get_obj_logger(self)
        self.done = False
        self.failed_tasks = 0
        self._due = DueTimer()
        self._task_counts: dict[str, int] = {}  # the real-time mode's task numbers
        self._on_report = on_report
        self._lock = threading.Lock()

    # -- NVFlare's SimulationRunner contract ----------------------------------------------------------------------
    def set_send_func(self, send_f, **kwargs) -> None:
        """NVFlare's runner hands every simulator its send function; only the edge-request channel uses it."""
        if hasattr(self.channel, "set_send_func"):
            self.channel.set_send_func(send_f, **kwargs)

    def stop(self) -> None:
        self.done = True

    def start(self) -> None:
        try:
            self._control_flow()
            # the job is over: tasks still queued would train for nothing, running ones finish
            self.worker_pool.shutdown(wait=True, cancel_futures=True)
            self.channel.close()
        finally:
            if self.failed_tasks:
                self.logger.error(f"{self.failed_tasks} device task(s) failed; see the errors above")

    # -- control loop -------------------------------------------------------------------------------------------
    def _control_flow(self) -> None:
        if not self.channel.open(self.get_job_timeout):
            return
        while not self.done:
            tasks = self.channel.next_tasks(WORK_WAIT)
            if tasks is None:
                return
            self.submit(tasks)

    def submit(self, tasks: list[DeviceTask]) -> None:
        """Hand tasks to the worker pool, in groups of one release (or selection) each."""
        classes = getattr(self.channel, "run_classes", None)
        for group in make_groups(tasks, self.group_size, self.num_workers, classes):
            self.worker_pool.submit(self._run_group, group)

    # -- training -----------------------------------------------------------------------------------------------
    def _run_group(self, group: list[DeviceTask]) -> None:
        if len(group) == 1:
            self._finish(self._run_task(group[0]))
            return
        try:
            with self.limit:
                started = time.perf_counter()
                results = self.channel.train(group)
                seconds = time.perf_counter() - started
        except Exception as ex:
            # train them one by one instead: per-device retries, failure reports and OOM handling apply
            if is_out_of_memory(ex):
                self._free_gpu_cache()
                self.group_size = max(1, self.group_size // 2)
                self.logger.warning(f"group of {len(group)}: out of memory; group size lowered to {self.group_size}")
            else:
                self.logger.error(f"group of {len(group)} failed ({secure_format_exception(ex)}); training one by one")
            self._finish([pair for t in group for pair in self._run_task(t)])
            return
        for t in group:
            t.trained_with, t.train_seconds = len(group), seconds
        self._finish(list(zip(group, results, strict=True)))

    def _run_task(self, t: DeviceTask) -> list[tuple[DeviceTask, Any]]:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                with self.limit:
                    started = time.perf_counter()
                    result = self.channel.train([t])[0]
                    t.train_seconds = time.perf_counter() - started
                    return [(t, result)]
            except Exception as ex:
                t.error = short_error(f"{type(ex).__name__}: {ex}")
                if is_out_of_memory(ex):
                    self._free_gpu_cache()
                    self.logger.warning(
                        f"device {t.device}: out of memory; concurrency lowered to {self.limit.halve()} "
                        "for the rest of the run"
                    )
                else:
                    self.logger.error(
                        f"device {t.device}: task failed (attempt {attempt}/{MAX_ATTEMPTS}): "
                        f"{secure_format_exception(ex)}"
                    )
        with self._lock:
            self.failed_tasks += 1
        t.failed = True
        return [(t, self._failure_report(t))]

    def _failure_report(self, t: DeviceTask) -> Any | None:
        try:
            result = self.channel.failure(t)
        except Exception as ex:
            self.logger.error(f"device {t.device}: no zero-weight report ({secure_format_exception(ex)})")
            return None
        if result is not None:
            self.logger.error(f"device {t.device}: reported as a zero-weight update so its slot is freed")
        return result

    # -- reports ------------------------------------------------------------------------------------------------
    def _finish(self, finished: list[tuple[DeviceTask, Any]]) -> None:
        if self.time_scale <= 0:
            self._report(finished)
            return
        for t, result in finished:
            with self._lock:
                n = self._task_counts.get(t.device, 0)
                self._task_counts[t.device] = n + 1
            due = t.dispatched + self.delays.durations(t.device, n).total * self.time_scale
            self._due.call_at(due, self._report, [(t, result)])

    def _report(self, finished: list[tuple[DeviceTask, Any]]) -> None:
        if self._on_report is not None:  # before the updates go up: the lines travel with them or earlier
            now = time.time()
            for t, result in finished:
                line = {
                    "wall": now,
                    "device": t.device,
                    "version": t.version,
                    "selection": t.selection_id,
                    "ok": result is not None and not t.failed,
                    "group": t.trained_with,
                    "train_seconds": round(t.train_seconds, 6),
                }
                if t.run:  # a pack's later run: the server files the line in that run's leaf log
                    line["run"] = t.run
                self._on_report(line)
        self.channel.report(finished)

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait for every submitted task to be trained and reported (a test's way to run tasks to completion
        without the control loop); False if ``timeout`` passed first."""
        self.worker_pool.shutdown(wait=True)
        return self._due.wait_idle(timeout)

    @staticmethod
    def _free_gpu_cache() -> None:
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:
            pass

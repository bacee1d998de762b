"""The leaf's device simulator: trains its selected devices as fast as the machine allows, through NVFlare's
device protocol.

Each leaf runs one ``FastSimulator`` (started by ``simulation.leaf_runner.FastDeviceRunner``). It speaks NVFlare's
edge protocol to the leaf's executor exactly as devices do (job, selection, task and result requests, through the
send function NVFlare's ``SimulationRunner`` gives it), so server and leaf logic stay NVFlare's. It differs from
NVFlare's stock ``Simulator`` in what it does between requests:

* the leaf's device range is registered once, with the first selection request;
* tasks of every newly selected device are requested at once, with no ``sleep(0.5)`` per device; the loop backs
  off only when there is nothing to do;
* devices selected together (one selection id, hence one model version) are trained together: sorted by id and
  cut into groups of ``group_size`` for one call of the leaf's ``GroupTrainer`` (the vectorised engine), so the
  groups, and the bits of every diff, are the same in every run; each device still reports its own result;
* nothing waits on simulated time: the server orders the updates (``scheduling.exact_assessor``). Only the
  real-time mode (``time_scale`` > 0, for load tests) holds each result for its delays x ``time_scale`` wall
  seconds after dispatch, on a timer (``due_timer``) so the worker is freed at once;
* a task that raises is retried, then logged with the device id and reported as a zero-weight update when the
  trainer offers one (its slot is freed, the mean of the others unchanged), else with an error status; a GPU
  out-of-memory error halves the leaf's concurrency (or group size) for the rest of the run;
* no request, task or result is ever rendered as text (NVFlare's debug f-strings do, at ~15 ms per device).

Without a ``GroupTrainer`` (any NVFlare ``DeviceTaskProcessor``), each device trains through its own processor
copy (``device.do_task``), one at a time per worker, as NVFlare's stock simulator does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nvflare.edge.constants import CookieKey, EdgeApiStatus, SpecialDeviceId
from nvflare.edge.simulation.simulated_device import DeviceFactory, SimulatedDevice
from nvflare.edge.web.models.job_request import JobRequest
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.result_report import ResultReport
from nvflare.edge.web.models.selection_request import SelectionRequest
from nvflare.edge.web.models.selection_response import SelectionResponse
from nvflare.edge.web.models.task_request import TaskRequest
from nvflare.edge.web.models.task_response import TaskResponse
from nvflare.fuel.utils.log_utils import get_obj_logger
from nvflare.security.logging import secure_format_exception

from common.delays import DeviceDelays
from simulation.concurrency import AdjustableLimit
from simulation.due_timer import DueTimer
from simulation.trainer import GroupTrainer

MIN_IDLE_WAIT = 0.02
MAX_IDLE_WAIT = 0.5
MAX_ATTEMPTS = 3


def is_out_of_memory(ex: BaseException) -> bool:
    return "out of memory" in str(ex).lower() or type(ex).__name__ == "OutOfMemoryError"


@dataclass
class DeviceTask:
    """A task a device received, waiting to be trained and reported."""

    task: TaskResponse
    device: SimulatedDevice
    selection_id: int
    dispatched: float  # wall time of the task request (the real-time mode's start)
    trained_with: int = 1  # devices in the call that trained it
    failed: bool = False

    @property
    def model_version(self):
        return self.task.cookie.get(CookieKey.MODEL_VERSION) if isinstance(self.task.cookie, dict) else None


def make_groups(tasks: list[DeviceTask], group_size: int) -> list[list[DeviceTask]]:
    """Tasks of one selection (one model version), sorted by device id, cut into groups of at most
    ``group_size``: the same groups whatever order the tasks were requested in."""
    by_selection: dict[int, list[DeviceTask]] = {}
    for t in tasks:
        by_selection.setdefault(t.selection_id, []).append(t)
    groups = []
    for sid in sorted(by_selection):
        same = sorted(by_selection[sid], key=lambda t: t.device.device_id)
        groups += [same[i : i + group_size] for i in range(0, len(same), group_size)]
    return groups


class FastSimulator:
    """Args:
    job_name: the job to ask for.
    device_factory: makes the simulated devices (with a processor copy each when there is no trainer).
    device_id_prefix: this leaf's device ids are ``<prefix>#0`` ... ``<prefix>#<num_devices - 1>``.
    num_devices: devices on this leaf.
    num_workers: threads that train (the pool's size).
    get_job_timeout: seconds to wait for the job to reach the leaf.
    delays: the run's delay model (the real-time mode's holding times).
    trainer: trains groups and reports failures (``GroupTrainer``); None: each device's own processor trains.
    time_scale: 0: report at once; S > 0: hold each result for its delays x S wall seconds.
    on_report: called with one dict per device report (wall time, device, version, selection, ok, group).
    group_size: devices a worker trains together (with a trainer).
    """

    def __init__(
        self,
        job_name: str,
        device_factory: DeviceFactory,
        device_id_prefix: str,
        num_devices: int,
        num_workers: int,
        get_job_timeout: float,
        delays: DeviceDelays,
        trainer: GroupTrainer | None = None,
        time_scale: float = 0.0,
        on_report: Callable[[dict], None] | None = None,
        group_size: int = 1,
    ):
        self.job_name = job_name
        self.device_factory = device_factory
        self.device_id_prefix = device_id_prefix
        self.num_devices = num_devices
        self.get_job_timeout = get_job_timeout
        self.delays = delays
        self.trainer = trainer
        self.time_scale = time_scale
        self.group_size = max(1, group_size) if trainer is not None else 1
        self.worker_pool = ThreadPoolExecutor(num_workers, thread_name_prefix="device-worker")
        self.limit = AdjustableLimit(num_workers)
        self.logger = get_obj_logger(self)
        self.done = False
        self.failed_tasks = 0
        self._send_f = None
        self._send_kwargs: dict = {}
        self._due = DueTimer()
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # dispatched, not yet reported
        self._reported: dict[str, int] = {}  # device -> the selection id it last reported on
        self._devices: dict[str, SimulatedDevice] = {}  # kept only for per-device processors (no trainer)
        self._task_counts: dict[str, int] = {}  # the real-time mode's task numbers
        self._probes: dict[str, SimulatedDevice] = {}  # the devices job and selection requests are sent as
        self._on_report = on_report

    # -- NVFlare's SimulationRunner contract ----------------------------------------------------------------------
    def set_send_func(self, send_f, **kwargs) -> None:
        if not callable(send_f):
            raise ValueError("send_f is not callable")
        self._send_f, self._send_kwargs = send_f, kwargs

    def stop(self) -> None:
        self.done = True

    def start(self) -> None:
        if self._send_f is None:
            raise ValueError("send_f has not been set - please call set_send_func before start")
        try:
            self._control_flow()
            # the job is over: tasks still queued would train for nothing, running ones finish
            self.worker_pool.shutdown(wait=True, cancel_futures=True)
            for device in self._devices.values():
                device.shutdown()
            self.device_factory.shutdown()
        finally:
            if self.failed_tasks:
                self.logger.error(f"{self.failed_tasks} device task(s) failed; see the errors above")

    # -- requests to the leaf -----------------------------------------------------------------------------------
    def _send(self, req, device: SimulatedDevice | None, default):
        try:
            return self._send_f(req, device, **self._send_kwargs)
        except Exception as ex:
            self.logger.warning(f"exception sending request: {secure_format_exception(ex)}")
            return default

    def _probe(self, device_id: str) -> SimulatedDevice:
        """The device a job or selection request is sent as: made once (NVFlare's factory deep-copies a
        foreign processor into every device it makes, and these requests are sent on every sync)."""
        device = self._probes.get(device_id)
        if device is None:
            device = self._probes[device_id] = self.device_factory.make_device(device_id)
        return device

    def _ask_for_job(self) -> JobResponse:
        device = self._probe(SpecialDeviceId.DUMMY)
        req = JobRequest(self.job_name, device.get_device_info(), device.get_user_info(), device.get_capabilities())
        return self._send(req, device, JobResponse(EdgeApiStatus.RETRY))

    def _ask_for_selection(self, job_id: str, device_id: str) -> SelectionResponse:
        device = self._probe(device_id)
        return self._send(
            SelectionRequest(device.get_device_info(), job_id), device, SelectionResponse(EdgeApiStatus.RETRY)
        )

    def _ask_for_task(self, device: SimulatedDevice) -> TaskResponse:
        req = TaskRequest(device.get_device_info(), device.get_user_info(), device.get_job_id(), device.cookie)
        return self._send(req, device, TaskResponse(EdgeApiStatus.RETRY))

    # -- control loop -------------------------------------------------------------------------------------------
    def _wait_for_job(self) -> JobResponse | None:
        deadline = time.time() + self.get_job_timeout
        while not self.done:
            resp = self._ask_for_job()
            if resp and resp.status == EdgeApiStatus.OK:
                return resp
            if resp and resp.status not in (EdgeApiStatus.RETRY, EdgeApiStatus.NO_JOB):
                self.logger.error(f"stopping: bad JobResponse status {resp.status}")
                return None
            if time.time() > deadline:
                self.logger.error(
                    f"no job within --job-timeout {self.get_job_timeout}s (this is only the wait for the job "
                    "to reach the leaf); raise --job-timeout on a slow or busy machine"
                )
                return None
            time.sleep(0.2)
        return None

    def _my_new_devices(self, selection: dict) -> dict[str, int]:
        """This leaf's selected devices that are neither training nor already reported for their selection."""
        mine = {}
        prefix = self.device_id_prefix + SpecialDeviceId.NUM_INDICATOR
        with self._lock:
            for did, sid in selection.items():
                if did.startswith(prefix) and did not in self._busy and self._reported.get(did) != sid:
                    mine[did] = sid
            self._reported = {d: s for d, s in self._reported.items() if d in selection}
        return mine

    def _control_flow(self) -> None:
        job = self._wait_for_job()
        if job is None:
            return
        registration = f"{self.device_id_prefix}{SpecialDeviceId.MAX_INDICATOR}{self.num_devices}"
        idle_wait = MIN_IDLE_WAIT
        while not self.done:
            resp = self._ask_for_selection(job.job_id, registration)
            if resp and resp.status == EdgeApiStatus.NO_JOB:
                self.logger.info("job is gone: device simulator exiting")
                return
            if resp and resp.status == EdgeApiStatus.OK:
                registration = SpecialDeviceId.DUMMY  # the device range is registered once
            ready: list[DeviceTask] = []
            if resp and resp.selection:
                for did, sid in sorted(self._my_new_devices(resp.selection).items()):
                    outcome = self._dispatch(job, did, sid)
                    if outcome == "stop":
                        self._submit(ready)
                        return
                    if isinstance(outcome, DeviceTask):
                        ready.append(outcome)
            self._submit(ready)
            if ready:
                idle_wait = MIN_IDLE_WAIT
            else:
                time.sleep(idle_wait)
                idle_wait = min(idle_wait * 2, MAX_IDLE_WAIT)

    def _device(self, job: JobResponse, did: str) -> SimulatedDevice:
        device = self._devices.get(did)
        if device is None:
            device = self.device_factory.make_device(did)
            device.set_job(job_id=job.job_id, job_name=job.job_name, job_data=job.job_data, method=job.method)
            if self.trainer is None:  # its processor copy may hold state across tasks
                self._devices[did] = device
        return device

    def _dispatch(self, job: JobResponse, did: str, sid: int) -> DeviceTask | str:
        device = self._device(job, did)
        resp = self._ask_for_task(device)
        if resp.status == EdgeApiStatus.NO_JOB:
            return "stop"
        if resp.status != EdgeApiStatus.OK:
            if resp.status not in (EdgeApiStatus.RETRY, EdgeApiStatus.DONE):
                self.logger.error(f"stopping: bad TaskResponse status {resp.status} for device {did}")
                return "stop"
            return "skipped"
        device.cookie = resp.cookie
        sid = (resp.cookie or {}).get(CookieKey.DEVICE_SELECTION_ID, sid)
        with self._lock:
            self._busy.add(did)
        return DeviceTask(resp, device, sid, time.time())

    def _submit(self, ready: list[DeviceTask]) -> None:
        for group in make_groups(ready, self.group_size):
            self.worker_pool.submit(self._run_group, group)

    # -- training -----------------------------------------------------------------------------------------------
    def _run_group(self, group: list[DeviceTask]) -> None:
        if len(group) == 1 or self.trainer is None:
            for t in group:
                self._run_task(t)
            return
        try:
            with self.limit:
                results = self.trainer.process_group([t.device.device_id for t in group], group[0].task)
        except Exception as ex:
            # train them one by one instead: per-device retries, failure reports and OOM handling apply
            if is_out_of_memory(ex):
                self._free_gpu_cache()
                self.group_size = max(1, self.group_size // 2)
                self.logger.warning(f"group of {len(group)}: out of memory; group size lowered to {self.group_size}")
            else:
                self.logger.error(f"group of {len(group)} failed ({secure_format_exception(ex)}); training one by one")
            for t in group:
                self._run_task(t)
            return
        for t, result in zip(group, results, strict=True):
            t.trained_with = len(group)
            self._finish(t, result, EdgeApiStatus.OK)

    def _run_task(self, t: DeviceTask) -> None:
        device = t.device
        result, status = {}, EdgeApiStatus.ERROR
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                with self.limit:
                    if self.trainer is not None:
                        result = self.trainer.process_group([device.device_id], t.task)[0]
                    else:
                        result = device.do_task(t.task)
                status = EdgeApiStatus.OK
                break
            except Exception as ex:
                if is_out_of_memory(ex):
                    self._free_gpu_cache()
                    self.logger.warning(
                        f"device {device.device_id}: out of memory; concurrency lowered to {self.limit.halve()} "
                        "for the rest of the run"
                    )
                else:
                    self.logger.error(
                        f"device {device.device_id}: task failed (attempt {attempt}/{MAX_ATTEMPTS}): "
                        f"{secure_format_exception(ex)}"
                    )
        if status != EdgeApiStatus.OK:
            self.failed_tasks += 1
            t.failed = True
            result, status = self._failure_report(t)
        self._finish(t, result, status)

    def _failure_report(self, t: DeviceTask) -> tuple[dict, str]:
        if self.trainer is None:
            return {}, EdgeApiStatus.ERROR
        try:
            result = self.trainer.failed_result(t.device.device_id, t.task)
        except Exception as ex:
            self.logger.error(f"device {t.device.device_id}: no zero-weight report ({secure_format_exception(ex)})")
            return {}, EdgeApiStatus.ERROR
        self.logger.error(f"device {t.device.device_id}: reported as a zero-weight update so its slot is freed")
        return result, EdgeApiStatus.OK

    # -- reports ------------------------------------------------------------------------------------------------
    def _finish(self, t: DeviceTask, result, status: str) -> None:
        if self.time_scale > 0:
            did = t.device.device_id
            n = self._task_counts.get(did, 0)
            self._task_counts[did] = n + 1
            due = t.dispatched + self.delays.durations(did, n).total * self.time_scale
            self._due.call_at(due, self._report, t, result, status)
        else:
            self._report(t, result, status)

    def _report(self, t: DeviceTask, result, status: str) -> None:
        task, device = t.task, t.device
        report = ResultReport(
            device_info=device.get_device_info(),
            user_info=device.get_user_info(),
            job_id=task.job_id,
            task_id=task.task_id,
            task_name=task.task_name,
            result=result if isinstance(result, dict) else {},
            status=status,
            cookie=device.cookie,
        )
        if self._on_report is not None:  # before the update goes up: the line travels with it or earlier
            self._on_report(
                {
                    "wall": time.time(),
                    "device": device.device_id,
                    "version": t.model_version,
                    "selection": t.selection_id,
                    "ok": status == EdgeApiStatus.OK and not t.failed,
                    "group": t.trained_with,
                }
            )
        self._send(report, device, None)
        with self._lock:
            self._busy.discard(device.device_id)
            self._reported[device.device_id] = t.selection_id

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

"""The leaf's device simulator, limited only by training.

It keeps NVFlare's device protocol (job, selection, task and result requests go through the edge events, so
server and leaf logic stay NVFlare's) but replaces the stock loop's habits:

* tasks for all newly selected devices are requested at once, with no ``sleep(0.5)`` per device; the loop
  backs off only when there is nothing to do;
* with the vectorised engine, tasks that arrive together for the same model version are trained as groups of
  up to ``group_size`` devices in one call of the leaf's ``GroupTrainer`` (``simulation.trainer``); each
  device still reports its own result;
* heterogeneity runs on a virtual clock (``ReleaseQueue``): results are reported in simulated finish order
  without sleeping. With ``time_scale`` > 0 results are held until their scaled delay has passed (1.0: real
  time; the worker is freed at once, see ``due_timer``): slower, but
  new tasks then start at the simulated time the server reacted, which the pure virtual clock cannot know (see
  README, "Simulated time");
* a task that raises is retried, then logged with the device id and reported as failed: as a zero-weight
  update when the trainer offers one (``failed_result``), so the device's slot is released and the round goes
  on, else with an error status; a GPU out-of-memory error halves the leaf's concurrency for the
  rest of the run instead of killing it;
* no debug f-strings that print whole tasks or results.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from nvflare.edge.constants import CookieKey, EdgeApiStatus, SpecialDeviceId
from nvflare.edge.simulation.simulated_device import DeviceFactory, DeviceState, SimulatedDevice
from nvflare.edge.simulation.simulator import Simulator
from nvflare.edge.web.models.job_request import JobRequest
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.result_report import ResultReport
from nvflare.edge.web.models.selection_request import SelectionRequest
from nvflare.edge.web.models.selection_response import SelectionResponse
from nvflare.edge.web.models.task_request import TaskRequest
from nvflare.edge.web.models.task_response import TaskResponse
from nvflare.security.logging import secure_format_exception

from common.delays import DeviceDelays
from simulation.concurrency import AdjustableLimit
from simulation.due_timer import DueTimer
from simulation.release_queue import ReleaseQueue
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
    sid: object
    ticket: int  # its place on the virtual clock
    real_finish: float  # wall time its result is due with --time-scale > 0
    trained_with: int = 1  # devices in the call that trained it (vectorised engine groups)
    failed: bool = False

    @property
    def model_version(self):
        return self.task.cookie.get(CookieKey.MODEL_VERSION) if isinstance(self.task.cookie, dict) else None


def make_groups(tasks: list[DeviceTask], group_size: int) -> list[list[DeviceTask]]:
    """Tasks of the same model version, in dispatch order, cut into groups of at most ``group_size``."""
    by_version: dict[object, list[DeviceTask]] = {}
    for t in tasks:
        by_version.setdefault((t.model_version, t.task.task_id), []).append(t)
    return [same[i : i + group_size] for same in by_version.values() for i in range(0, len(same), group_size)]


class FastSimulator(Simulator):
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
        clock_log: str | None = None,
        group_size: int = 1,
    ):
        super().__init__(job_name, device_factory, num_devices, num_workers, get_job_timeout)
        self.device_id_prefix = device_id_prefix  # deterministic, so device data and speeds are reproducible
        self.delays = delays
        self.time_scale = time_scale  # 0: virtual clock; > 0: delays take delay x time_scale wall seconds
        self._origin: float | None = None  # wall time of simulated time 0 (scaled mode)
        self._due = DueTimer()  # scaled mode: hands each result over at its due time without holding a worker
        self.limit = AdjustableLimit(num_workers)
        self.trainer = trainer  # trains groups and reports failures; None: each device's own processor copy trains
        self.group_size = max(1, group_size) if trainer is not None else 1
        self.clock = ReleaseQueue(self._report)
        self.clock_log = clock_log
        self._log_lock = threading.Lock()
        self._task_counts: dict[str, int] = {}
        self.failed_tasks = 0

    # -- requests to the leaf, without NVFlare's debug f-strings (they render whole models: ~15 ms each) -------
    def _ask_for_task(self, device: SimulatedDevice) -> TaskResponse:
        req = TaskRequest(device.get_device_info(), device.get_user_info(), device.get_job_id(), device.cookie)
        return self._send_request(req, device, TaskResponse(EdgeApiStatus.RETRY))

    def _ask_for_selection(self, job_id: str, device_id) -> SelectionResponse:
        device = self.device_factory.make_device(device_id)
        req = SelectionRequest(device.get_device_info(), job_id)
        return self._send_request(req, device, SelectionResponse(EdgeApiStatus.RETRY))

    def _ask_for_job(self, device: SimulatedDevice) -> JobResponse:
        req = JobRequest(self.job_name, device.get_device_info(), device.get_user_info(), device.get_capabilities())
        return self._send_request(req, device, JobResponse(EdgeApiStatus.RETRY))

    # -- control loop -------------------------------------------------------------------------------------
    def _wait_for_job(self) -> JobResponse | None:
        device = self.device_factory.make_device(SpecialDeviceId.DUMMY)
        deadline = time.time() + self.get_job_timeout
        while not self.done:
            resp = self._ask_for_job(device)
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

    def _control_flow(self) -> None:
        job = self._wait_for_job()
        if job is None:
            return
        selection_id = f"{self.device_id_prefix}{SpecialDeviceId.MAX_INDICATOR}{self.num_devices}"
        idle_wait = MIN_IDLE_WAIT
        while not self.done:
            resp = self._ask_for_selection(job.job_id, selection_id)
            if resp and resp.status == EdgeApiStatus.NO_JOB:
                self.logger.info("job is gone: device simulator exiting")
                return
            if resp and resp.status == EdgeApiStatus.OK:
                selection_id = SpecialDeviceId.DUMMY  # the device range is registered once
            ready: list[DeviceTask] = []
            if resp and resp.selection:
                for did, sid in self._determine_my_devices(resp.selection).items():
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

    def _submit(self, ready: list[DeviceTask]) -> None:
        if self.group_size == 1:
            for t in ready:
                self.worker_pool.submit(self._run_task, t)
            return
        for group in make_groups(ready, self.group_size):
            self.worker_pool.submit(self._run_group, group)

    def _dispatch(self, job: JobResponse, did: str, sid) -> DeviceTask | str:
        device = self.all_devices.get(did) or self._make_new_device(did)
        device.set_job(job_id=job.job_id, job_name=job.job_name, job_data=job.job_data, method=job.method)
        resp = self._ask_for_task(device)
        if resp.status == EdgeApiStatus.NO_JOB:
            return "stop"
        if resp.status == EdgeApiStatus.DONE:
            device.job_id = None
            return "skipped"
        if resp.status != EdgeApiStatus.OK:
            if resp.status != EdgeApiStatus.RETRY:
                self.logger.error(f"stopping: bad TaskResponse status {resp.status} for device {did}")
                return "stop"
            return "skipped"
        device.state = DeviceState.LEARNING
        device.cookie = resp.cookie
        if isinstance(resp.cookie, dict):
            sid = resp.cookie.get(CookieKey.DEVICE_SELECTION_ID, sid)
        task_number = self._task_counts.get(did, 0)
        self._task_counts[did] = task_number + 1
        seconds = self.delays.durations(did, task_number).total
        if self.time_scale > 0:
            now = time.time()
            if self._origin is None:
                self._origin = now
            ticket, finish = self.clock.dispatch(seconds, start=(now - self._origin) / self.time_scale)
            due = self._origin + finish * self.time_scale
        else:
            ticket, _ = self.clock.dispatch(seconds)
            due = 0.0
        with self.update_lock:
            self.busy_devices[did] = sid
        return DeviceTask(resp, device, sid, ticket, due)

    # -- a group of devices trained together (vectorised engine) ------------------------------------------
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

    # -- one device's task --------------------------------------------------------------------------------
    def _run_task(self, t: DeviceTask) -> None:
        task, device = t.task, t.device
        result, status = {}, EdgeApiStatus.ERROR
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                with self.limit:
                    if self.trainer is not None:
                        result = self.trainer.process_group([device.device_id], task)[0]
                    else:
                        result = device.do_task(task)
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
        self.logger.error(f"device {t.device.device_id}: reported as a zero-weight update so its round goes on")
        return result, EdgeApiStatus.OK

    def _finish(self, t: DeviceTask, result, status: str) -> None:
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
        payload = (report, device, t.sid, t.trained_with, t.failed)
        if self.time_scale > 0:
            self._due.call_at(t.real_finish, self.clock.complete, t.ticket, payload)
        else:
            self.clock.complete(t.ticket, payload)

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait for every submitted task to be trained and reported (a test's way to run tasks to completion
        without the control loop); False if ``timeout`` passed first."""
        self.worker_pool.shutdown(wait=True)
        return self._due.wait_idle(timeout)

    def _report(self, payload, finish: float) -> None:
        report, device, sid, trained_with, failed = payload
        self._send_request(report, device, None)
        device.state = DeviceState.IDLE
        with self.update_lock:
            self.busy_devices.pop(device.device_id, None)
            self.used_devices[device.device_id] = sid
        self._log_clock(device.device_id, report, finish, trained_with, failed)

    def _log_clock(self, device_id: str, report: ResultReport, finish: float, trained_with: int, failed: bool) -> None:
        if not self.clock_log:
            return
        version = report.cookie.get(CookieKey.MODEL_VERSION) if isinstance(report.cookie, dict) else None
        line = json.dumps(
            {
                "wall": time.time(),
                "sim": round(finish, 4),
                "device": device_id,
                "version": version,
                "ok": report.status == EdgeApiStatus.OK and not failed,
                "group": trained_with,
            }
        )
        with self._log_lock, open(self.clock_log, "a") as f:
            f.write(line + "\n")

    @staticmethod
    def _free_gpu_cache() -> None:
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:
            pass

    def start(self) -> None:
        try:
            self._control_flow()
            # the job is over: tasks still queued would train for nothing, running ones finish
            self.worker_pool.shutdown(wait=True, cancel_futures=True)
            for d in self.all_devices.values():
                d.shutdown()
            self.device_factory.shutdown()
        finally:
            if self.failed_tasks:
                self.logger.error(f"{self.failed_tasks} device task(s) failed; see the errors above")

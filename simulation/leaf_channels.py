"""How a leaf's device simulator reaches its leaf: the gateway (ours, batched) or NVFlare's edge requests.

``FastSimulator`` (``simulation.fast_simulator``) runs the same control loop, worker pool, grouping, retries and
real-time holding over either channel:

* ``GatewayChannel``: the leaf executor is ours (a ``LeafGateway``, ``simulation.leaf_gateway``) and the task
  processor trains from weights (``WeightsTrainer``): the devices are registered once as a range, every newly
  selected device's task is taken at once the moment the leaf learns of it (with the server's release it came
  in, so a group may mix model versions), and a group's results go back in one call, which the leaf sends up at
  once. Nothing polls.
* ``EdgeRequestChannel``: any other leaf executor (``use_fast_simulator`` keeps NVFlare's): NVFlare's device
  protocol, one edge request per device for its task and its result, the selection polled with a back-off up to
  ``MAX_IDLE_WAIT`` seconds; a ``GroupTrainer`` trains a group from one task, any other processor each device
  through its own copy (``device.do_task``).

A task's ``payload`` is the channel's own: the weights (gateway) or NVFlare's ``TaskResponse``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
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

from simulation.leaf_gateway import DeviceResult, LeafGateway
from simulation.trainer import GroupTrainer, WeightsTrainer

MIN_IDLE_WAIT = 0.02
MAX_IDLE_WAIT = 0.5


@dataclass
class DeviceTask:
    """A task a device received, waiting to be trained and reported.

    Attributes:
        device: the device id.
        selection_id: the selection it answers.
        version: the model version it trains (None when the channel cannot tell).
        payload: what the channel trains it from (weights, or NVFlare's ``TaskResponse``).
        dispatched: wall time it was handed out (the real-time mode's start).
        handle: the channel's own handle of the device (the edge-request path's ``SimulatedDevice``).
        trained_with: devices in the call that trained it.
        train_seconds: wall seconds that call took (the same for every device of a group; timing only).
        failed: its training failed for good.
        error: its last training error, one short line (``common.protocol.short_error``); "" when none.
        release: the server's release it came in (devices the server released together are trained together,
            whatever their versions, ``simulation.fast_simulator.make_groups``); None when the channel cannot tell.
        run: its run in a pack (``docs/packs.md``); 0: a standalone job's.
    """

    device: str
    selection_id: int
    version: int | None
    payload: Any
    dispatched: float = field(default_factory=time.time)
    handle: Any = None
    trained_with: int = 1
    train_seconds: float = 0.0
    failed: bool = False
    release: int | None = None
    error: str = ""
    run: int = 0


class LeafChannel(Protocol):
    def open(self, timeout: float) -> bool:
        """Wait for the job to reach the leaf and register its devices; False if it never came (or is gone)."""
        ...

    def next_tasks(self, timeout: float) -> list[DeviceTask] | None:
        """The tasks of newly selected devices (waiting up to ``timeout`` for some); None when the job is gone."""
        ...

    def train(self, tasks: list[DeviceTask]) -> list[Any]:
        """Train ``tasks`` together (one model version, or several when the channel tells releases apart); one
        result each, in order. Raises on failure."""
        ...

    def failure(self, task: DeviceTask) -> Any | None:
        """What a device whose training failed for good reports (a zero-weight update), or None."""
        ...

    def report(self, finished: list[tuple[DeviceTask, Any]]) -> None:
        """Send finished tasks' results (None: an error report) to the leaf."""
        ...

    def close(self) -> None: ...


class GatewayChannel:
    """Args:
    gateway: the leaf executor (``LeafGateway``).
    trainer: trains devices from weights (``WeightsTrainer``: the job's ``TrainingTaskProcessor``).
    prefix: this leaf's device ids are ``<prefix>#0`` ... ``<prefix>#<num_devices - 1>``.
    num_devices: devices on this leaf.
    run_trainers: in a pack, the trainer of each run after the first (run 0's is ``trainer``).
    lock_step: in a pack on exact time, hand out release n of every run together, once it is complete (each run
        has made n releases or ended: ``LeafWork.complete``), and let runs that can share a step train in one
        group (``run_classes``): the groups, hence every diff's bits, are then a function of the runs' schedules,
        not of when each run's releases reach the leaf. Off: each run's tasks go out as they come, in groups of
        their own run.
    """

    def __init__(
        self,
        gateway: LeafGateway,
        trainer: WeightsTrainer,
        prefix: str,
        num_devices: int,
        run_trainers: dict[int, WeightsTrainer] | None = None,
        lock_step: bool = False,
    ):
        self.gateway = gateway
        self.trainer = trainer
        self.run_trainers = run_trainers or {}
        self.prefix = prefix
        self.num_devices = num_devices
        self._stamp = -1
        self.lock_step = lock_step and bool(self.run_trainers)
        self._waiting: list[DeviceTask] = []  # lock-step: tasks of releases not complete yet
        # run -> the first run it shares a step with (``processors.pack_trainer.step_classes``); {}: none share
        self.run_classes: dict[int, int] = {}
        if self.lock_step:
            from processors.pack_trainer import step_classes  # torch's import, on a leaf only

            self.run_classes = step_classes({0: trainer, **self.run_trainers})

    def open(self, timeout: float) -> bool:
        if self.gateway.register_devices(self.prefix, self.num_devices, timeout):
            return True
        get_obj_logger(self).error(
            f"no job within --job-timeout {timeout}s (this is only the wait for the job to reach the leaf); "
            "raise --job-timeout on a slow or busy machine"
        )
        return False

    def next_tasks(self, timeout: float) -> list[DeviceTask] | None:
        if not self.lock_step:
            work = self.gateway.take_work(self.prefix, self._stamp, timeout)
        else:
            work = self.gateway.take_work(self.prefix, self._stamp, timeout, 1 + len(self.run_trainers))
        self._stamp = work.stamp
        now = time.time()
        tasks = [
            DeviceTask(t.device, t.selection_id, t.version, work.weights(t), now, release=t.release, run=t.run)
            for t in work.tasks
        ]
        if not self.lock_step:
            return tasks
        self._waiting += tasks
        complete = work.complete or 0
        ready = [t for t in self._waiting if t.release is None or t.release <= complete]
        self._waiting = [t for t in self._waiting if not (t.release is None or t.release <= complete)]
        return ready

    def train(self, tasks: list[DeviceTask]) -> list[dict[str, np.ndarray]]:
        """Each device from its own version's weights (a release may mix versions), by its run's trainer; a
        trainer whose method keeps per-device state also gets the selection ids, the key of that state. Tasks of
        several runs (a pack's cross-run group, ``run_classes``) train in one call (``processors.pack_trainer``),
        each run's devices prepared and finished by its own trainer."""
        runs = sorted({t.run for t in tasks})
        if len(runs) == 1:
            trainer = self._trainer(runs[0])
            args = [t.device for t in tasks], [t.payload for t in tasks], [t.version for t in tasks]
            if getattr(trainer, "rule", ""):
                return trainer.train_devices(*args, [t.selection_id for t in tasks])
            return trainer.train_devices(*args)
        parts = []
        for run in runs:
            mine = [t for t in tasks if t.run == run]
            selections = [t.selection_id for t in mine]
            parts.append(
                (
                    self._trainer(run),
                    [t.device for t in mine],
                    [t.payload for t in mine],
                    [t.version for t in mine],
                    selections,
                )
            )
        from processors.pack_trainer import train_runs  # torch's import, on a leaf only

        diffs = {run: iter(d) for run, d in zip(runs, train_runs(parts), strict=True)}
        return [next(diffs[t.run]) for t in tasks]

    def _trainer(self, run: int) -> WeightsTrainer:
        return self.run_trainers[run] if run else self.trainer

    def failure(self, task: DeviceTask) -> dict[str, np.ndarray]:
        return {k: np.zeros(np.shape(v), dtype=np.float32) for k, v in task.payload.items()}

    def report(self, finished: list[tuple[DeviceTask, Any]]) -> None:
        results = [
            DeviceResult(
                t.device, t.selection_id, t.version, diff, 0 if t.failed else 1, t.error if t.failed else "", t.run
            )
            for t, diff in finished
        ]
        self.gateway.report(results)

    def close(self) -> None:
        pass


class EdgeRequestChannel:
    """NVFlare's device protocol through the send function its ``SimulationRunner`` gives the simulator.

    Args:
        job_name: the job to ask for.
        device_factory: makes the simulated devices (with a processor copy each when there is no trainer).
        prefix: this leaf's device ids are ``<prefix>#0`` ... ``<prefix>#<num_devices - 1>``.
        num_devices: devices on this leaf.
        trainer: trains groups from one task (``GroupTrainer``); None: each device's own processor trains.
    """

    def __init__(
        self,
        job_name: str,
        device_factory: DeviceFactory,
        prefix: str,
        num_devices: int,
        trainer: GroupTrainer | None = None,
    ):
        self.job_name = job_name
        self.device_factory = device_factory
        self.prefix = prefix
        self.num_devices = num_devices
        self.trainer = trainer
        self.logger = get_obj_logger(self)
        self.job: JobResponse | None = None
        self._send_f = None
        self._send_kwargs: dict = {}
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # dispatched, not yet reported
        self._reported: dict[str, int] = {}  # device -> the selection id it last reported on
        self._devices: dict[str, SimulatedDevice] = {}  # kept only for per-device processors (no trainer)
        self._probes: dict[str, SimulatedDevice] = {}  # the devices job and selection requests are sent as
        self._registration = f"{prefix}{SpecialDeviceId.MAX_INDICATOR}{num_devices}"
        self._idle_wait = MIN_IDLE_WAIT
        self.gone = False

    def set_send_func(self, send_f, **kwargs) -> None:
        if not callable(send_f):
            raise ValueError("send_f is not callable")
        self._send_f, self._send_kwargs = send_f, kwargs

    # -- requests to the leaf -----------------------------------------------------------------------------------
    def _send(self, req, device: SimulatedDevice | None, default):
        try:
            return self._send_f(req, device, **self._send_kwargs)
        except Exception as ex:
            self.logger.warning(f"exception sending request: {secure_format_exception(ex)}")
            return default

    def _probe(self, device_id: str) -> SimulatedDevice:
        """The device a job or selection request is sent as: made once (NVFlare's factory deep-copies a foreign
        processor into every device it makes, and these requests are sent on every look)."""
        device = self._probes.get(device_id)
        if device is None:
            device = self._probes[device_id] = self.device_factory.make_device(device_id)
        return device

    def open(self, timeout: float) -> bool:
        deadline = time.time() + timeout
        while not self.gone:
            device = self._probe(SpecialDeviceId.DUMMY)
            req = JobRequest(self.job_name, device.get_device_info(), device.get_user_info(), device.get_capabilities())
            resp = self._send(req, device, JobResponse(EdgeApiStatus.RETRY))
            if resp and resp.status == EdgeApiStatus.OK:
                self.job = resp
                return True
            if resp and resp.status not in (EdgeApiStatus.RETRY, EdgeApiStatus.NO_JOB):
                self.logger.error(f"stopping: bad JobResponse status {resp.status}")
                return False
            if time.time() > deadline:
                self.logger.error(
                    f"no job within --job-timeout {timeout}s (this is only the wait for the job to reach the leaf); "
                    "raise --job-timeout on a slow or busy machine"
                )
                return False
            time.sleep(0.2)
        return False

    def _new_devices(self, selection: dict) -> dict[str, int]:
        """This leaf's selected devices that are neither training nor already reported for their selection."""
        mine = {}
        prefix = self.prefix + SpecialDeviceId.NUM_INDICATOR
        with self._lock:
            for did, sid in selection.items():
                if did.startswith(prefix) and did not in self._busy and self._reported.get(did) != sid:
                    mine[did] = sid
            self._reported = {d: s for d, s in self._reported.items() if d in selection}
        return mine

    def next_tasks(self, timeout: float) -> list[DeviceTask] | None:
        device = self._probe(self._registration)
        resp = self._send(
            SelectionRequest(device.get_device_info(), self.job.job_id), device, SelectionResponse(EdgeApiStatus.RETRY)
        )
        if resp and resp.status == EdgeApiStatus.NO_JOB:
            self.logger.info("job is gone: device simulator exiting")
            return None
        if resp and resp.status == EdgeApiStatus.OK:
            self._registration = SpecialDeviceId.DUMMY  # the device range is registered once
        ready: list[DeviceTask] = []
        for did, sid in sorted(self._new_devices(resp.selection or {}).items() if resp else ()):
            outcome = self._dispatch(did, sid)
            if outcome == "stop":
                self.gone = True
                break
            if isinstance(outcome, DeviceTask):
                ready.append(outcome)
        if ready:
            self._idle_wait = MIN_IDLE_WAIT
        elif not self.gone:
            time.sleep(min(self._idle_wait, timeout))
            self._idle_wait = min(self._idle_wait * 2, MAX_IDLE_WAIT)
        return ready if ready or not self.gone else None

    def _device(self, did: str) -> SimulatedDevice:
        device = self._devices.get(did)
        if device is None:
            job = self.job
            device = self.device_factory.make_device(did)
            device.set_job(job_id=job.job_id, job_name=job.job_name, job_data=job.job_data, method=job.method)
            if self.trainer is None:  # its processor copy may hold state across tasks
                self._devices[did] = device
        return device

    def _dispatch(self, did: str, sid: int) -> DeviceTask | str:
        device = self._device(did)
        req = TaskRequest(device.get_device_info(), device.get_user_info(), device.get_job_id(), device.cookie)
        resp = self._send(req, device, TaskResponse(EdgeApiStatus.RETRY))
        if resp.status == EdgeApiStatus.NO_JOB:
            return "stop"
        if resp.status != EdgeApiStatus.OK:
            if resp.status not in (EdgeApiStatus.RETRY, EdgeApiStatus.DONE):
                self.logger.error(f"stopping: bad TaskResponse status {resp.status} for device {did}")
                return "stop"
            return "skipped"
        device.cookie = resp.cookie
        cookie = resp.cookie if isinstance(resp.cookie, dict) else {}
        sid = cookie.get(CookieKey.DEVICE_SELECTION_ID, sid)
        with self._lock:
            self._busy.add(did)
        return DeviceTask(did, sid, cookie.get(CookieKey.MODEL_VERSION), resp, handle=device)

    # -- training and reports -----------------------------------------------------------------------------------
    def train(self, tasks: list[DeviceTask]) -> list[dict]:
        if self.trainer is not None:
            return self.trainer.process_group([t.device for t in tasks], tasks[0].payload)
        if len(tasks) != 1:
            raise ValueError("without a GroupTrainer each device trains alone")
        return [tasks[0].handle.do_task(tasks[0].payload)]

    def failure(self, task: DeviceTask) -> dict | None:
        if self.trainer is None:
            return None
        return self.trainer.failed_result(task.device, task.payload, task.error)

    def report(self, finished: list[tuple[DeviceTask, Any]]) -> None:
        for t, result in finished:
            device = t.handle
            status = EdgeApiStatus.OK if isinstance(result, dict) else EdgeApiStatus.ERROR
            report = ResultReport(
                device_info=device.get_device_info(),
                user_info=device.get_user_info(),
                job_id=t.payload.job_id,
                task_id=t.payload.task_id,
                task_name=t.payload.task_name,
                result=result if isinstance(result, dict) else {},
                status=status,
                cookie=device.cookie,
            )
            self._send(report, device, None)
            with self._lock:
                self._busy.discard(t.device)
                self._reported[t.device] = t.selection_id

    def close(self) -> None:
        for device in self._devices.values():
            device.shutdown()
        self.device_factory.shutdown()

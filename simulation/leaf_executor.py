"""The leaf's NVFlare executor on exact simulated time: hands each device the version it was selected for, and
sends each device's update up on its own.

It is NVFlare's ``EdgeModelExecutor`` (the edge protocol: job, selection, task and result requests from devices)
with ``VersionedUpdater`` as its updater, and these changes:

* a task carries the model version of the device's selection id, not the leaf's newest model (a device selected
  at version v trains v, even if the leaf already holds v + 3);
* a result becomes a ``DeviceUpdate`` (device, selection id, base version, diff, count) for the server, which
  applies it in arrival order (a synchronous run's leaf sends one sum a selection instead; in a pack, per run);
* a simulated leaf's device range (``site-1?100``) is registered once, as a range;
* no request or reply is ever rendered as text (``simulation.nvflare_private.NoPayloadRendering``: NVFlare
  renders whole models with numpy's ``repr`` for every device request);
* it syncs with its parent when there is something to send or fetch, not on a timer
  (``simulation.nvflare_private.EventDrivenSync``): a device's result, a child's report, or the parent's wake
  message (``WAKE_TOPIC``) sends the next report at once; as a relay it wakes its children when its parent's
  reply brought them news; ``update_interval`` is only the heartbeat;
* it is the ``LeafGateway`` of the leaf's device simulator (``simulation.leaf_gateway``): the simulator
  registers the leaf's devices, takes every newly selected device's task and hands back a group's results in one
  call each, in the same process, instead of one edge request per device. Real devices still use the edge
  requests above;
* its diffs go up and its versions come down through shared memory when the server shares its machine and user
  (``bulk``, ``simulation.bulk_link``), NVFlare's messages around them unchanged;
* with real devices (``real_devices``: the job's task processor, whose settings describe the training), tasks and
  results cross NVFlare's routing proxy as JSON (``common.device_wire``): a version's weights become lists once,
  with the training settings in the task's metadata, and a device's diff becomes float32 arrays as it arrives; a
  device whose task failed (a result with an error status), or whose diff does not fit the model it trained
  (entries, shapes, non-finite values), is reported failed at once, so its slot is refilled and the model is
  never touched by it;
* a simulated device whose diff holds NaN or inf is counted failed the same way, before any sum
  (``common.finite``).
"""

from __future__ import annotations

import math
import threading

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, from_dict
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import ReturnCode, Shareable, make_reply
from nvflare.edge.constants import CookieKey, EdgeApiStatus, MsgKey, SpecialDeviceId
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.executors.hug import TaskInfo
from nvflare.edge.mud import Device, StateUpdateReport
from nvflare.edge.web.models.result_report import ResultReport
from nvflare.edge.web.models.result_response import ResultResponse
from nvflare.edge.web.models.task_request import TaskRequest
from nvflare.edge.web.models.task_response import TaskResponse

from common.device_wire import DEVICE_SETTINGS_META, diff_problem, from_wire, to_wire
from common.finite import nonfinite_reason, zeroed
from common.nvflare_private import install_nvflare_fixes
from common.protocol import (
    AWAITED,
    DEVICE_ERROR_META,
    DEVICE_EXTRA_PREFIX,
    DEVICE_RANGES,
    DEVICE_UPDATES,
    LOCAL_REPORT,
    NEWS_FOR,
    WAKE_TOPIC,
    DeviceUpdate,
    short_error,
)
from simulation.bulk_link import LeafBulk
from simulation.leaf_gateway import FIND_GATEWAY, GATEWAY_PROP, DeviceResult, GatewayTask, LeafWork
from simulation.nvflare_private import EventDrivenSync, NoPayloadRendering
from simulation.versioned_updater import DEFER_SYNC, VersionedState, VersionedUpdater

BATCH_WINDOW = 0.1  # seconds a result the server is not waiting for may wait for others, to go up in one sync


def device_settings(processor) -> dict:
    """What a real device needs to train this job as a simulated one would: the job's task processor's data,
    training, seed, the method's device hook and its weighting (``processors.device_processor`` reads it from each
    task)."""
    names = ("data", "training", "seed", "objective", "objective_args", "reports")
    missing = [n for n in names if not hasattr(processor, n)]
    if missing:
        raise TypeError(f"{type(processor).__name__} is not the job's task processor: it lacks {missing}")
    settings = {n: getattr(processor, n) for n in names}
    weighting = getattr(processor, "weighting", "devices")
    if weighting != "devices":  # by samples: the device sends its diff times its data size, as a simulated one
        settings["weighting"] = weighting
    if getattr(processor, "rule", ""):  # a method's training rule: the device keeps its state itself
        settings |= {"rule": processor.rule, "rule_args": processor.rule_args}
    if getattr(processor, "privacy", None):  # differential privacy: the device clips (and noises) its update
        settings["privacy"] = processor.privacy
    if compression := getattr(processor, "compression", None):  # the device compresses; its residual is its own
        settings["compression"] = {k: compression[k] for k in ("compress", "error_feedback")}
    return settings


def device_diff(data: dict, settings: dict | None) -> dict[str, np.ndarray]:
    """A real device's diff as float32 arrays from its JSON-safe result (``common.device_wire.from_wire``); a
    compressed one (``processors.compress.COMPRESSED``) decoded to what the server would decode from a simulated
    device, times its ``data_size`` when its method weights by samples (as the device's own trainer does).
    ValueError, naming the problem, for a result that cannot be read."""
    from processors.compress import COMPRESSED, decode_wire  # torch: only for a compressed result
    from processors.reports import weigh_by_samples

    diff = from_wire(data["dict"])
    wire = data.get(COMPRESSED)
    if wire is None:  # dense: a device that does not compress (a phone app may not)
        return diff
    compression = (settings or {}).get("compression")
    if not compression:
        raise ValueError("it sent a compressed update, and the job has no --compress")
    decoded = decode_wire(wire, compression["compress"])
    if "data_size" in wire:
        decoded = weigh_by_samples(decoded, int(wire["data_size"]))
    return diff | decoded


def upload_bytes(data: dict, diff: dict[str, np.ndarray]) -> int:
    """The bytes a real device's update took (its reports not counted): its encoded payload's arrays when it
    compressed (``processors.compress.wire_bytes``), else its dense diff's float32 values (4 bytes each)."""
    from processors.compress import COMPRESSED, wire_bytes

    wire = data.get(COMPRESSED)
    if wire is not None:
        return wire_bytes(wire)
    return int(sum(4 * np.size(v) for k, v in diff.items() if not k.startswith(DEVICE_EXTRA_PREFIX)))


def selection_of(cookie: dict | None) -> tuple[int, int] | None:
    """(selection id, model version) a device's result answers, from the cookie its task gave it; None without."""
    cookie = cookie or {}
    if CookieKey.MODEL_VERSION not in cookie or CookieKey.DEVICE_SELECTION_ID not in cookie:
        return None
    return int(cookie[CookieKey.DEVICE_SELECTION_ID]), int(cookie[CookieKey.MODEL_VERSION])


def retry(job_id: str, message: str) -> TaskResponse:
    return TaskResponse(EdgeApiStatus.RETRY, job_id, 30, message=message)


class EdgeSimExecutor(EventDrivenSync, NoPayloadRendering, EdgeModelExecutor):
    """Args:
    update_timeout: seconds to wait for the parent to take an update.
    sum_selections: a synchronous run (a pack's: one flag a run): one sum per selection (``VersionedUpdater``).
    real_devices: "" for simulated devices; with real ones, the id of the job's task processor (its settings go
        to each device with its task) and tasks and results travel JSON-safe.
    bulk: ``--bulk``: how diffs and versions travel to and from the parent (``simulation.bulk_link``).
    """

    def __init__(
        self,
        update_timeout: float = 10.0,
        sum_selections: bool | list = False,
        real_devices: str = "",
        bulk: str = "auto",
    ):
        super().__init__(aggr_factory_id="", max_model_versions=None, update_timeout=update_timeout)
        install_nvflare_fixes()  # one thread for finished streams, no payload rendering (nvflare_private)
        self.sum_selections = sum_selections
        self.real_devices = real_devices
        self.bulk = bulk
        self._device_settings: dict | None = None  # with real devices: what each task tells its device
        self.updater: VersionedUpdater | None = None
        self.sync_cond = threading.Condition()
        self.sync_due = math.inf
        self._registered_ranges: dict[str, int] = {}
        self._registered: set[str] = set()
        self._engine = None
        self._child_names: list[str] = []
        self._task_ready = threading.Event()  # the leaf has the job's task: devices may register
        self.register_event_handler(EventType.START_RUN, self._start_sync)
        self.register_event_handler(FIND_GATEWAY, self._offer_gateway)

    def get_updater(self, fl_ctx: FLContext) -> VersionedUpdater:
        bulk = LeafBulk(self.bulk, log=self.logger.info)
        self.updater = VersionedUpdater(self.sum_selections, on_work=self.sync_now, bulk=bulk)
        return self.updater

    # -- syncing at once ----------------------------------------------------------------------------------------
    def _start_sync(self, _event: str, fl_ctx: FLContext) -> None:
        self._engine = fl_ctx.get_engine()
        hierarchy = fl_ctx.get_prop(FLContextKey.CLIENT_HIERARCHY)
        node = hierarchy.nodes.get(fl_ctx.get_identity_name()) if hierarchy is not None else None
        self._child_names = [n.obj.name for n in node.children] if node is not None else []
        self._engine.register_aux_message_handler(WAKE_TOPIC, self._on_wake)
        if self.real_devices:
            self._device_settings = device_settings(self._engine.get_component(self.real_devices))

    def _on_wake(self, topic: str, request: Shareable, fl_ctx: FLContext) -> Shareable:
        """The parent waits for an update: sync now if it has news for this node (newly selected devices) or this
        node holds the awaited update; else remember which device is awaited (its result then goes up at once). A
        relay passes the word on to its children."""
        awaited = set(request.get(AWAITED) or ())
        if self.updater is not None:
            self.updater.awaited = awaited
        mine = fl_ctx.get_identity_name() in (request.get(NEWS_FOR) or ())
        if mine or (self.updater is not None and self.updater.holds_update_of(awaited)):
            self.sync_now()
        if self._child_names:
            news = Shareable()
            news[AWAITED] = sorted(awaited)
            news[NEWS_FOR] = list(self._child_names) if mine else []
            fl_ctx.get_engine().send_aux_request(
                targets=self._child_names, topic=WAKE_TOPIC, request=news, timeout=0, fl_ctx=fl_ctx, optional=True
            )
        return make_reply(ReturnCode.OK)

    def after_parent_reply(self, changed: bool, fl_ctx: FLContext) -> None:
        """A relay whose parent brought news wakes its children (each then takes its part of it)."""
        if changed and self._child_names:
            fl_ctx.get_engine().send_aux_request(
                targets=self._child_names,
                topic=WAKE_TOPIC,
                request=Shareable(),
                timeout=0,
                fl_ctx=fl_ctx,
                optional=True,
            )

    def task_started(self, task: TaskInfo, fl_ctx: FLContext) -> None:
        super().task_started(task, fl_ctx)
        self._task_ready.set()

    def task_ended(self, task: TaskInfo, fl_ctx: FLContext) -> None:
        self._task_ready.clear()
        super().task_ended(task, fl_ctx)

    # -- the leaf's device simulator (LeafGateway) --------------------------------------------------------------
    def _offer_gateway(self, _event: str, fl_ctx: FLContext) -> None:
        fl_ctx.set_prop(GATEWAY_PROP, self, private=True, sticky=False)

    def register_devices(self, prefix: str, count: int, timeout: float) -> bool:
        if not self._task_ready.wait(timeout):
            return False
        with self._engine.new_context() as fl_ctx:
            return bool(self.accept_alive_device(f"{prefix}{SpecialDeviceId.MAX_INDICATOR}{count}", fl_ctx))

    def take_work(self, prefix: str, stamp: int, timeout: float, runs: int = 0) -> LeafWork:
        updater = self.updater
        if updater is None:  # no task yet
            self._task_ready.wait(timeout)
            return LeafWork(stamp, complete=0 if runs else None)
        stamp, _ = updater.wait_changed(stamp, timeout)
        # before the tasks: every task of a release it counts complete is taken below, or was before
        complete = updater.releases_complete(prefix + SpecialDeviceId.NUM_INDICATOR, runs) if runs else None
        tasks, models = updater.take_tasks(prefix + SpecialDeviceId.NUM_INDICATOR)
        work = LeafWork(
            stamp, [GatewayTask(*t) for t in tasks], {v: dxo.data for v, dxo in models.items()}, {}, complete
        )
        for run, (tasks, models) in updater.take_run_tasks(prefix + SpecialDeviceId.NUM_INDICATOR).items():
            work.tasks.extend(GatewayTask(d, sid, v, r, run) for d, sid, v, r in tasks)  # a pack's later runs
            work.run_models[run] = {v: dxo.data for v, dxo in models.items()}
        return work

    def report(self, results: list[DeviceResult]) -> None:
        report = StateUpdateReport(0, 0, None, None).to_shareable()
        report.set_header(LOCAL_REPORT, True)
        report.set_header(DEFER_SYNC, True)  # asked for below
        # a local report never leaves this process: the updates go in as objects, packed once when sent up
        report[DEVICE_UPDATES] = [self._checked(r) for r in results]
        with self._engine.new_context() as fl_ctx:
            self.accept_update("", report, fl_ctx)  # the current task's
        # a sync is a message each way, dearer than a near-zero training: what the server waits for (an awaited
        # device's update, a synchronous selection's whole sum) goes up at once, the rest within BATCH_WINDOW
        updater = self.updater
        buffered = [r for r in results if not updater.sums(r.run)]  # a synchronous run's wait for their selection
        if (updater.sums_any() and updater.has_sums()) or any(updater.is_awaited(r.run, r.device) for r in buffered):
            self.sync_now()
        elif buffered:
            self.sync_soon(BATCH_WINDOW)

    def _checked(self, r: DeviceResult) -> DeviceUpdate:
        """A simulated device's result as an update, or counted failed when its diff holds NaN or inf
        (``common.finite``): refused here, before it is summed with others, whatever the engine or method."""
        if r.count > 0:
            problem = nonfinite_reason(r.diff, "refused at its leaf")
            if problem:
                self.logger.warning(f"device {r.device} (version {r.version}) is counted failed: {problem}")
                return DeviceUpdate(
                    r.device, r.selection_id, r.version, zeroed(r.diff), 0, error=short_error(problem), run=r.run
                )
        return DeviceUpdate(r.device, r.selection_id, r.version, r.diff, r.count, error=r.error, run=r.run)

    # -- devices ------------------------------------------------------------------------------------------------
    def _known(self, device_id: str) -> bool:
        prefix, _, index = device_id.rpartition(SpecialDeviceId.NUM_INDICATOR)
        if index.isdigit() and int(index) < self._registered_ranges.get(prefix, 0):
            return True
        return device_id in self._registered

    def accept_alive_device(self, device_id: str, fl_ctx: FLContext):
        """Register a device (or a simulated leaf's range ``prefix?count``) with the updater, once."""
        client = fl_ctx.get_identity_name()
        report = Shareable()
        prefix, sep, count = device_id.partition(SpecialDeviceId.MAX_INDICATOR)
        if sep:
            if self._registered_ranges.get(prefix) == int(count):
                return True
            self._registered_ranges[prefix] = int(count)
            report = StateUpdateReport(0, 0, None, None).to_shareable()
            report[DEVICE_RANGES] = {prefix: [int(count), client]}
        else:
            if self._known(device_id):
                return True
            self._registered.add(device_id)
            report = StateUpdateReport(0, 0, None, {device_id: Device(device_id, client, 0.0)}).to_shareable()
        report.set_header(LOCAL_REPORT, True)
        return self.accept_update("", report, fl_ctx)

    # -- tasks and results --------------------------------------------------------------------------------------
    def process_edge_task_request(
        self, request: TaskRequest, current_task: TaskInfo, fl_ctx: FLContext
    ) -> TaskResponse:
        device_id, job_id = request.get_device_id(), fl_ctx.get_job_id()
        self.accept_alive_device(device_id, fl_ctx)
        state = current_task.task
        if not isinstance(state, VersionedState) or not state.model_version:
            return retry(job_id, "Model not ready")
        cookie_sid = (request.cookie or {}).get(CookieKey.DEVICE_SELECTION_ID, 0)
        selected, sid = state.is_device_selected(device_id, cookie_sid)
        if not selected:
            return retry(job_id, "Device not selected")
        version = state.selection_versions.get(sid)
        model = state.models.get(version)
        if model is None:
            return retry(job_id, f"model version {version} not here yet")
        task_data = state.converted_models.get(version)
        if task_data is None:
            task_data = state.converted_models[version] = self._task_data(model, version)
        self.updater.mark_fetched(device_id, sid)
        cookie = {CookieKey.MODEL_VERSION: version, CookieKey.DEVICE_SELECTION_ID: sid}
        return TaskResponse(EdgeApiStatus.OK, job_id, 0, current_task.id, current_task.name, task_data, cookie)

    def _task_data(self, model: DXO, version: int) -> dict:
        """A version's task as a device receives it (built once per version): the WEIGHTS DXO with its version,
        and with real devices JSON-safe, carrying the training settings."""
        if not self.real_devices:
            model.set_meta_prop(MsgKey.MODEL_VERSION, version)
            return model.to_dict()
        task = DXO(DataKind.WEIGHTS, data=to_wire(model.data))
        task.set_meta_prop(MsgKey.MODEL_VERSION, version)
        task.set_meta_prop(DEVICE_SETTINGS_META, self._device_settings)
        return task.to_dict()

    def process_edge_result_report(
        self, request: ResultReport, current_task: TaskInfo, fl_ctx: FLContext
    ) -> ResultResponse:
        """A real device whose task failed (an error status, or no result) is reported failed at once: its slot is
        refilled and its version's mean is unchanged. Anything else as NVFlare's executor does."""
        if not self.real_devices or (request.result and request.status == EdgeApiStatus.OK):
            return super().process_edge_result_report(request, current_task, fl_ctx)
        selection = selection_of(request.cookie)
        if selection is None:
            return ResultResponse(EdgeApiStatus.ERROR, task_id=request.task_id, message="no version/selection cookie")
        device = request.get_device_id()
        self.log_warning(fl_ctx, f"device {device} reports its task failed ({request.status}): counted failed")
        failed = DeviceUpdate(device, *selection, None, 0, error=f"the device reported status {request.status}")
        self._send_up([failed], request.task_id, fl_ctx)
        return ResultResponse(EdgeApiStatus.OK, task_id=request.task_id, task_name=request.task_name)

    def _send_up(self, updates: list[DeviceUpdate], task_id: str, fl_ctx: FLContext):
        report = StateUpdateReport(0, 0, None, None).to_shareable()
        report.set_header(LOCAL_REPORT, True)
        report[DEVICE_UPDATES] = updates
        return self.accept_update(task_id, report, fl_ctx)

    def accept_device_result(self, result_report: ResultReport, current_task: TaskInfo, fl_ctx: FLContext):
        dxo = from_dict(result_report.result)
        device, selection = result_report.get_device_id(), selection_of(result_report.cookie)
        if selection is None:
            raise ValueError(f"result of device {device} has no version/selection cookie")
        sid, version = selection
        diff, count = dxo.data["dict"], int(dxo.data.get("count", 1))
        error = str(dxo.get_meta_prop(DEVICE_ERROR_META, "") or "") if count == 0 else ""
        size = 0  # a real device's bytes sent (metrics.json's bytes_up); a simulated device's the schedule knows
        if self.real_devices:  # from JSON, and from a device we do not control: checked before it can reach the model
            try:
                diff = device_diff(dxo.data, self._device_settings)
                problem = self._diff_problem(diff, version, current_task)
                compressed = (self._device_settings or {}).get("compression")  # bytes counted with --compress
                size = upload_bytes(dxo.data, diff) if compressed and not problem else 0
            except ValueError as ex:
                problem = str(ex)
            if problem:
                self.log_warning(fl_ctx, f"device {device}'s result is refused and counted failed: {problem}")
                diff, count, error = None, 0, short_error(f"its result was refused: {problem}")
        elif count > 0 and (problem := nonfinite_reason(diff, "refused at its leaf")):  # a simulated device's
            self.log_warning(fl_ctx, f"device {device} is counted failed: {problem}")
            diff, count, error = zeroed(diff), 0, short_error(problem)
        update = DeviceUpdate(device, sid, version, diff, count, error=error, upload_bytes=size)
        return self._send_up([update], result_report.task_id, fl_ctx)

    @staticmethod
    def _diff_problem(diff: dict, version: int, current_task: TaskInfo) -> str:
        """Why a real device's diff cannot be used (``common.device_wire.diff_problem``), against the version it
        trained (held here while its device is selected)."""
        state = current_task.task
        model = state.models.get(version) if isinstance(state, VersionedState) else None
        return diff_problem(diff, model.data) if model is not None else ""

"""The leaf's NVFlare executor on exact simulated time: hands each device the version it was selected for, and
sends each device's update up on its own.

It is NVFlare's ``EdgeModelExecutor`` (the edge protocol: job, selection, task and result requests from devices)
with ``VersionedUpdater`` as its updater, and four changes:

* a task carries the model version of the device's selection id, not the leaf's newest model (a device selected
  at version v trains v, even if the leaf already holds v + 3);
* a result becomes a ``DeviceUpdate`` (device, selection id, base version, diff, count) for the server, which
  applies it in arrival order;
* a simulated leaf's device range (``site-1?100``) is registered once, as a range;
* no request or reply is ever rendered as text (``simulation.nvflare_private.NoPayloadRendering``: NVFlare
  renders whole models with numpy's ``repr`` for every device request, about 15 ms per device each).
"""

from __future__ import annotations

from nvflare.apis.dxo import from_dict
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.constants import CookieKey, EdgeApiStatus, MsgKey, SpecialDeviceId
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.executors.hug import TaskInfo
from nvflare.edge.mud import Device, StateUpdateReport
from nvflare.edge.web.models.result_report import ResultReport
from nvflare.edge.web.models.task_request import TaskRequest
from nvflare.edge.web.models.task_response import TaskResponse

from aggregation.versioned_updater import VersionedState, VersionedUpdater
from common.protocol import DEVICE_RANGES, DEVICE_UPDATES, LOCAL_REPORT, DeviceUpdate
from simulation.nvflare_private import NoPayloadRendering, share_stream_cleanup_thread


def retry(job_id: str, message: str) -> TaskResponse:
    return TaskResponse(EdgeApiStatus.RETRY, job_id, 30, message=message)


class EdgeSimExecutor(NoPayloadRendering, EdgeModelExecutor):
    """Args:
    update_timeout: seconds to wait for the parent to take an update.
    sum_selections: a synchronous run: the leaf sends one sum per selection (``VersionedUpdater``).
    """

    def __init__(self, update_timeout: float = 10.0, sum_selections: bool = False):
        super().__init__(aggr_factory_id="", max_model_versions=None, update_timeout=update_timeout)
        share_stream_cleanup_thread()  # one thread for finished streams, not one per sync
        self.sum_selections = sum_selections
        self.updater: VersionedUpdater | None = None
        self._registered_ranges: dict[str, int] = {}
        self._registered: set[str] = set()

    def get_updater(self, fl_ctx: FLContext) -> VersionedUpdater:
        self.updater = VersionedUpdater(self.sum_selections)
        return self.updater

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
            model.set_meta_prop(MsgKey.MODEL_VERSION, version)
            task_data = state.converted_models[version] = model.to_dict()
        self.updater.mark_fetched(device_id, sid)
        cookie = {CookieKey.MODEL_VERSION: version, CookieKey.DEVICE_SELECTION_ID: sid}
        return TaskResponse(EdgeApiStatus.OK, job_id, 0, current_task.id, current_task.name, task_data, cookie)

    def accept_device_result(self, result_report: ResultReport, current_task: TaskInfo, fl_ctx: FLContext):
        dxo = from_dict(result_report.result)
        cookie = result_report.cookie or {}
        if CookieKey.MODEL_VERSION not in cookie or CookieKey.DEVICE_SELECTION_ID not in cookie:
            raise ValueError(f"result of device {result_report.get_device_id()} has no version/selection cookie")
        update = DeviceUpdate(
            result_report.get_device_id(),
            cookie[CookieKey.DEVICE_SELECTION_ID],
            cookie[CookieKey.MODEL_VERSION],
            dxo.data["dict"],
            dxo.data.get("count", 1),
        )
        report = StateUpdateReport(0, 0, None, None).to_shareable()
        report.set_header(LOCAL_REPORT, True)
        report[DEVICE_UPDATES] = [update.to_dict()]
        return self.accept_update(result_report.task_id, report, fl_ctx)

"""Leaf-side updater that never drops device updates it has not yet sent up.

NVFlare's ``EdgeModelUpdater`` removes a model version's aggregator as soon as the parent's reply no longer lists
that version among the selected devices' versions (or it is more than ``max_model_versions`` old). Devices train
on whatever version the leaf holds, which can be newer than the version they were selected at, so a result that
arrived between the leaf's last report and the parent's reply is deleted with its aggregator. The server then
waits forever for that device: with ``min_hole_to_fill`` equal to the selection size no new devices are
selected and the job stalls (reproduced: 2 leaves x 200 devices, selection 64, 32 updates per model).

``RetainingEdgeModelUpdater`` drops only aggregators that hold nothing unsent; pending updates go up with the
next report, where the server's model manager buffers them (``aggregation.numpy_model_manager``).
"""

from __future__ import annotations

import copy

from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.job_def import JobMetaKey
from nvflare.apis.shareable import Shareable
from nvflare.edge.constants import EdgeApiStatus, EdgeContextKey
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.mud import StateUpdateReply
from nvflare.edge.updaters.emd import EdgeModelUpdater
from nvflare.edge.web.models.job_response import JobResponse


class RetainingEdgeModelUpdater(EdgeModelUpdater):
    def process_parent_update_reply(self, reply: Shareable, fl_ctx: FLContext) -> None:
        update_reply = StateUpdateReply.from_shareable(reply)
        with self._update_lock:
            new_state = copy.copy(self.current_state)
            changed = False
            if update_reply.model_version != new_state.model_version:
                new_state.model_version = update_reply.model_version
                new_state.model = update_reply.model
                new_state.converted_models = {}
                changed = True
            if update_reply.device_selection_version != new_state.device_selection_version:
                new_state.device_selection_version = update_reply.device_selection_version
                new_state.device_selection = update_reply.device_selection
                changed = True
            if changed:
                self.current_state = new_state

            active = set(new_state.device_selection.values())
            for version in list(self.aggr_states):
                too_old = self.max_model_versions and new_state.model_version - version > self.max_model_versions
                if version in active and not too_old:
                    continue
                if self.aggr_states[version].devices:
                    # unsent device results: keep them for the next report instead of losing them
                    continue
                del self.aggr_states[version]


class RetainingEdgeModelExecutor(EdgeModelExecutor):
    """NVFlare's leaf executor with the retaining updater, and without rendering payloads.

    NVFlare's ``EdgeTaskExecutor._handle_edge_request`` evaluates ``f"received edge request: {request}"`` and
    ``f"Reply to edge: {reply}"`` for every device request even with debug logging off: each renders a whole model
    or diff with numpy's ``repr`` (about 15 ms per device each, measured as most of a leaf's CPU). These handlers do
    the same work and log only the request's kind and device.
    """

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

    def get_updater(self, fl_ctx: FLContext):
        updater = super().get_updater(fl_ctx)
        if updater is None:
            return None
        return RetainingEdgeModelUpdater(updater.aggr_factory_id, self.max_model_versions)

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

from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.mud import StateUpdateReply
from nvflare.edge.updaters.emd import EdgeModelUpdater


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
    """NVFlare's leaf executor with the retaining updater."""

    def get_updater(self, fl_ctx: FLContext):
        updater = super().get_updater(fl_ctx)
        if updater is None:
            return None
        return RetainingEdgeModelUpdater(updater.aggr_factory_id, self.max_model_versions)

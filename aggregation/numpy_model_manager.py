"""NVFlare's buffered model manager, keeping the global model as float32 numpy arrays.

``BuffModelManager`` converts every new global model to nested Python lists before sending it down. Leaves and
the device simulator then stringify each task in debug f-strings (evaluated even with debug logging off): with
lists that is the whole model printed as text, about 0.1 s per device for a 62k-parameter CNN. Numpy arrays
print as a short summary, travel through FOBS natively, and need no conversion on the device side.

It also never loses a buffered update. ``BuffModelManager.prune_model_versions`` deletes versions no selected
device holds, together with updates buffered for them since the last new model (they were already counted
towards ``num_updates_for_model``, so the next model silently had fewer); and an update for an already pruned
version was dropped. Here pending buffers survive pruning, and a late update gets its version's buffer back.
"""

from __future__ import annotations

import numpy as np
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_context import FLContext
from nvflare.edge.aggregators.model_update_dxo import ModelUpdateDXOAggregator
from nvflare.edge.assessors.buff_model_manager import BuffModelManager, _ModelState
from nvflare.edge.mud import ModelUpdate


def as_float32_arrays(weights: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}


class NumpyBuffModelManager(BuffModelManager):
    """Same aggregation as ``BuffModelManager`` (mean over all buffered updates, times ``global_lr``)."""

    def generate_new_model(self, fl_ctx: FLContext) -> None:
        super().generate_new_model(fl_ctx)
        self.current_model = DXO(data_kind=DataKind.WEIGHTS, data=as_float32_arrays(self.current_model.data))

    def prune_model_versions(self, versions_to_keep: set[int], fl_ctx: FLContext) -> None:
        pending = {v for v, state in self.updates.items() if state.aggregator.count > 0}
        super().prune_model_versions(set(versions_to_keep) | pending | {self.current_model_version}, fl_ctx)

    def restore_pruned_versions(self, model_updates: dict[int, ModelUpdate], fl_ctx: FLContext) -> None:
        """Give a late update's version its buffer back, so the update joins the next model (FedBuff's rule for
        stale updates) instead of being dropped while its device leaves the selection."""
        for version, update in model_updates.items():
            if version <= 0 or not update or version in self.updates or version > self.current_model_version:
                continue
            if self.max_model_history and self.current_model_version - version >= self.max_model_history:
                continue  # the user asked for old updates to be dropped; NVFlare logs it
            self.log_warning(fl_ctx, f"late update for pruned version {version}: buffered for the next model")
            self.updates[version] = _ModelState(ModelUpdateDXOAggregator())

    def process_updates(self, model_updates: dict[int, ModelUpdate], fl_ctx: FLContext) -> bool:
        self.restore_pruned_versions(model_updates, fl_ctx)
        return super().process_updates(model_updates, fl_ctx)

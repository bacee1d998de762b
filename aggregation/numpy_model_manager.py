"""NVFlare's buffered model manager, keeping the global model as float32 numpy arrays.

``BuffModelManager`` converts every new global model to nested Python lists before sending it down. Leaves and
the device simulator then stringify each task in debug f-strings (evaluated even with debug logging off): with
lists that is the whole model printed as text, about 0.1 s per device for a 62k-parameter CNN. Numpy arrays
print as a short summary, travel through FOBS natively, and need no conversion on the device side.
"""

from __future__ import annotations

import numpy as np
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_context import FLContext
from nvflare.edge.assessors.buff_model_manager import BuffModelManager


def as_float32_arrays(weights: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}


class NumpyBuffModelManager(BuffModelManager):
    """Same aggregation as ``BuffModelManager`` (mean over all buffered updates, times ``global_lr``)."""

    def generate_new_model(self, fl_ctx: FLContext) -> None:
        super().generate_new_model(fl_ctx)
        self.current_model = DXO(data_kind=DataKind.WEIGHTS, data=as_float32_arrays(self.current_model.data))

"""Leaf-side aggregation that forwards every device update individually (FedRevive needs them).

NVFlare's ``ModelUpdateDXOAggregator`` sums all device diffs of a model version on the leaf, so the server
never sees an individual device's model, id or staleness. FedRevive needs each one: teachers are individual
client models, class proportions are estimated per client and beta depends on each update's staleness. This
aggregator keeps a list instead of a sum, and concatenates lists arriving from lower tiers of a hierarchy.
The base version of every update is the version of the aggregator that holds it (NVFlare keeps one per version).

Cost: a leaf sends one diff per device instead of one per model version; ``benchmarks/bench_forwarding.py``
reports the bytes and time this adds.
"""

from __future__ import annotations

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.abstract.aggregator import Aggregator
from nvflare.edge.updaters.emd import AggregatorFactory

from common.protocol import DEVICE_ID_META


class PerDeviceForwardingAggregator(Aggregator):
    def __init__(self):
        super().__init__()
        self.updates: list[dict] = []

    def accept(self, shareable: Shareable, fl_ctx: FLContext) -> bool:
        dxo = from_shareable(shareable)
        if dxo.data_kind != DataKind.WEIGHT_DIFF:
            raise ValueError(f"expected a WEIGHT_DIFF DXO, got {dxo.data_kind}")
        if "updates" in dxo.data:  # already forwarded by a lower tier
            self.updates.extend(dxo.data["updates"])
        elif dxo.data.get("count", 1) == 0:
            pass  # a device whose training failed: nothing to forward (NVFlare still frees its selection slot)
        else:
            diff = {k: np.asarray(v, dtype=np.float32) for k, v in dxo.data["dict"].items()}
            self.updates.append({"device": dxo.get_meta_prop(DEVICE_ID_META), "dict": diff})
        return True

    def reset(self, fl_ctx: FLContext) -> None:
        self.updates = []

    def aggregate(self, fl_ctx: FLContext) -> Shareable:
        dxo = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"updates": self.updates, "count": len(self.updates)})
        self.updates = []
        return dxo.to_shareable()


class PerDeviceForwardingAggrFactory(AggregatorFactory):
    def get_aggregator(self) -> Aggregator:
        return PerDeviceForwardingAggregator()

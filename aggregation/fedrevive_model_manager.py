"""FedRevive on the server: every device update is revived by data-free distillation before buffering.

Receives per-device updates (see ``per_device_forwarding``), rebuilds each client model from the global model
it started from, feeds it to the ``FedReviveDistiller`` (teacher buffer, class-proportion probe), blends the
update with the distilled one by its staleness, and buffers the result like FedBuff. Aggregation itself is
``BuffModelManager``'s: the mean over all updates buffered for the new version, times ``global_lr``.
Per-update distillation times go to ``fedrevive_log.jsonl`` in the results folder.
"""

from __future__ import annotations

import os
import time

import numpy as np
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_context import FLContext
from nvflare.edge.mud import ModelUpdate

from aggregation.numpy_model_manager import NumpyBuffModelManager, as_float32_arrays
from common.jsonio import JsonlWriter
from common.output import output_dir
from fedrevive.config import FedReviveConfig
from fedrevive.distill import FedReviveDistiller
from processors.device import resolve_device
from processors.models import build_model

HISTORY_BYTES = 512 * 2**20  # global models kept to rebuild stale clients' models


class FedReviveModelManager(NumpyBuffModelManager):
    def __init__(
        self,
        num_updates_for_model: int,
        max_model_history: int | None = None,
        global_lr: float = 1.0,
        staleness_weight: bool = False,
        model: str = "cifar10_convnet",
        fedrevive: dict | None = None,
        compute_device: str = "auto",
        seed: int = 0,
        results_dir: str = "",
    ):
        super().__init__(num_updates_for_model, max_model_history, global_lr, staleness_weight)
        self.model = model
        self.fedrevive = fedrevive or {}
        self.compute_device = compute_device
        self.seed = seed
        self.results_dir = results_dir
        self.distiller: FedReviveDistiller | None = None
        self.history: dict[int, dict[str, np.ndarray]] = {}
        self._log: JsonlWriter | None = None
        self.register_event_handler(EventType.START_RUN, self._start_distiller)

    def _start_distiller(self, _event: str, fl_ctx: FLContext) -> None:
        cfg = FedReviveConfig(**self.fedrevive)
        self.distiller = FedReviveDistiller(
            cfg, lambda: build_model(self.model), resolve_device(self.compute_device), self.seed
        )
        self._log = JsonlWriter(os.path.join(output_dir(self.results_dir, fl_ctx), "fedrevive_log.jsonl"))

    def generate_new_model(self, fl_ctx: FLContext) -> None:
        super().generate_new_model(fl_ctx)
        weights = self.current_model.data
        self.history[self.current_model_version] = weights
        per_version = sum(v.nbytes for v in weights.values())
        while len(self.history) > max(2, HISTORY_BYTES // max(per_version, 1)):
            del self.history[min(self.history)]

    def process_updates(self, model_updates: dict[int, ModelUpdate], fl_ctx: FLContext) -> bool:
        self.restore_pruned_versions(model_updates, fl_ctx)
        for version, model_update in model_updates.items():
            if version <= 0 or not model_update:
                continue
            state = self.updates.get(version)
            if state is None:
                self.log_error(fl_ctx, f"no model state for version {version}: update dropped")
                continue
            entries = from_shareable(model_update.update).data.get("updates")
            if entries is None:
                raise RuntimeError(
                    "FedRevive needs per-device updates: the leaves must use PerDeviceForwardingAggrFactory"
                )
            for entry in entries:
                self._revive_and_buffer(version, entry, state, fl_ctx)
        if self.num_updates_counter >= self.num_updates_for_model and self.current_model_version in self.updates:
            self.generate_new_model(fl_ctx)
        return True

    def _revive_and_buffer(self, version: int, entry: dict, state, fl_ctx: FLContext) -> None:
        device, delta = entry["device"], as_float32_arrays(entry["dict"])
        current = as_float32_arrays(self.current_model.data)
        base = self.history.get(version)
        if base is None:  # older than the kept history: the current model is the closest start we have
            base = current
        self.distiller.observe_client_model(device, {k: base[k] + delta[k] for k in delta})
        processed, info = self.distiller.process_update(current, delta, device, version, self.current_model_version)
        update = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": processed, "count": 1}).to_shareable()
        state.accept(ModelUpdate(version, update, {device: time.time()}), fl_ctx)
        self.num_updates_counter += 1
        info = {k: v for k, v in info.items() if isinstance(v, (int, float, str))}
        self._log.write({"version": self.current_model_version, "base_version": version, **info})

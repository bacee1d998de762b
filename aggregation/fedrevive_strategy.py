"""FedRevive on the server: every device update is revived by data-free distillation before it is buffered.

For each update, in the schedule's order: the client's model is rebuilt from the version it trained (kept for as
long as a device in flight trains it) plus its diff; ``FedReviveDistiller`` buffers it as a teacher (and probes
its class proportions) and blends the update with a distilled one by its staleness ``tau``. Aggregation is
``BufferedMean``'s: the mean of the buffered processed updates, times ``global_lr`` (data statistics: the mean of
the devices' own). A teacher's BatchNorm statistics are thus its client's, from real data. Per-update
distillation details and times go to ``fedrevive_log.jsonl`` in the results folder.
"""

from __future__ import annotations

import os

from aggregation.buffered_mean import BufferedMean
from aggregation.strategy import ModelHistory, ServerContext, Update
from common.jsonio import JsonlWriter
from common.protocol import LABEL_COUNTS
from fedrevive.config import LOG_FILE, FedReviveConfig
from fedrevive.distill import FedReviveDistiller
from processors.device import resolve_device
from processors.models import build_model


class FedReviveStrategy(BufferedMean):
    """Args:
    global_lr: server learning rate.
    fedrevive: ``FedReviveConfig.to_dict()``.
    image_std: the per-channel std the data is standardised with, so generated images are too (None: CIFAR-10's).
    precision: the server's numerics, the run's ``--precision`` (``processors.precision``).
    """

    def __init__(
        self,
        global_lr: float = 1.0,
        fedrevive: dict | None = None,
        image_std: list[float] | None = None,
        precision: str = "fp32",
    ):
        super().__init__(global_lr)
        self.fedrevive = fedrevive or {}
        self.image_std = image_std
        self.precision = precision
        self.distiller: FedReviveDistiller | None = None
        self._log: JsonlWriter | None = None
        self._log_lines = 0
        self._revived = 0  # updates blended with a distilled one (beta > 0), over the run

    def setup(self, context: ServerContext) -> None:
        super().setup(context)
        cfg = FedReviveConfig(**self.fedrevive)
        self.distiller = FedReviveDistiller(
            cfg,
            lambda: build_model(context.model),
            resolve_device(context.compute_device),
            context.seed,
            None if self.image_std is None else tuple(self.image_std),
            self.precision,
        )
        self._log = JsonlWriter(os.path.join(context.results_dir, LOG_FILE))

    def state_dict(self) -> dict:
        return super().state_dict() | {
            "distiller": self.distiller.state_dict(),
            "log_lines": self._log_lines,
            "revived": self._revived,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.distiller.load_state_dict(state["distiller"])
        self._log_lines = state["log_lines"]
        self._revived = state.get("revived", 0)
        self._log.truncate(self._log_lines)

    def add_update(self, update: Update, model: ModelHistory) -> None:
        if update.count != 1:
            raise ValueError("FedRevive revives each device's update: its leaves must not sum them")
        delta = update.diff
        base = model.weights_of(update.base_version)
        self.distiller.observe_client_model(
            update.device, {k: base[k] + delta[k] for k in delta}, update.reports.get(LABEL_COUNTS)
        )
        processed, info = self.distiller.process_update(
            model.current_weights, delta, update.device, update.base_version, model.current_version
        )
        self.buffer(processed, update.count, update.base_version, model)
        info = {k: v for k, v in info.items() if isinstance(v, (int, float, str))}
        # "version": the version the update goes into, as in events.jsonl
        self._log.write({"version": model.current_version + 1, "base_version": update.base_version, **info})
        self._log_lines += 1
        self._revived += info.get("phase") == "distill" and info.get("beta", 0.0) > 0

    def status(self, model: ModelHistory) -> str:
        """FedRevive's phase at the current version and how many updates it has revived so far."""
        cfg, v = self.distiller.cfg, model.current_version
        if v < cfg.distill_from_version:
            phase = f"FedRevive warm-up (plain FedBuff updates until version {cfg.distill_from_version})"
        elif v < cfg.kd_train_from_version:
            phase = f"FedRevive synthesis only (revival from version {cfg.kd_train_from_version})"
        else:
            phase = "FedRevive revival"
        return f"{phase}, {self._revived} update(s) revived"

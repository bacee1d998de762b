"""Server-side device selection that never reselects a device into a selection its leaf will refuse.

NVFlare marks each selected device with the model version current at selection time, and a leaf refuses a task
to a device whose cookie already carries that same selection id (``BaseState.is_device_selected``): it reads it
as "this device already trained for this selection". So a device that reports and is reselected before the
global model moves on (FedBuff with ``min_hole_to_fill`` 1 refills after every update) is never given a task
again, yet stays in the selection: a slot lost for good, and the job stalls once enough slots are lost.
``FreshSelectionDeviceManager`` keeps such a device out of that one fill; it is selectable again as soon as the
model version changes.

It also makes the selection reproducible: devices are drawn from a generator seeded by the run's ``--seed``.
"""

from __future__ import annotations

import random

from nvflare.apis.fl_context import FLContext
from nvflare.edge.assessors.buff_device_manager import BuffDeviceManager

from common.seeds import stable_seed


class FreshSelectionDeviceManager(BuffDeviceManager):
    def __init__(
        self, device_selection_size: int, min_hole_to_fill: int = 1, device_reuse: bool = True, seed: int = 0
    ):
        super().__init__(
            device_selection_size=device_selection_size, min_hole_to_fill=min_hole_to_fill, device_reuse=device_reuse
        )
        self.seed = seed
        self._rng = random.Random(stable_seed("device-selection", seed))
        self.last_selected_version: dict[str, int] = {}

    def blocked_devices(self, current_model_version: int) -> set[str]:
        """Devices whose last selection was at ``current_model_version`` and that are not selected now."""
        return {
            d
            for d, v in self.last_selected_version.items()
            if v == current_model_version and d not in self.current_selection and d not in self.used_devices
        }

    def sample_balanced(self, usable: list[str], count: int) -> list[str]:
        """``count`` of ``usable`` devices, spread over their leaves as evenly as they allow (NVFlare's "balanced"
        strategy), drawn from the run's seeded generator. Candidates are sorted first: NVFlare samples from a set
        of strings, whose order changes with each process's hash seed, so its selection cannot be reproduced."""
        by_leaf: dict[str, list[str]] = {}
        for d in sorted(usable):
            by_leaf.setdefault(self.device_client_map.get(d, ""), []).append(d)
        queues = [by_leaf[leaf] for leaf in sorted(by_leaf)]
        for q in queues:
            self._rng.shuffle(q)
        self._rng.shuffle(queues)
        chosen: list[str] = []
        while len(chosen) < count and any(queues):
            for q in queues:
                if q and len(chosen) < count:
                    chosen.append(q.pop())
        return chosen

    def fill_selection(self, current_model_version: int, fl_ctx: FLContext) -> None:
        num_holes = self.device_selection_size - len(self.current_selection)
        if num_holes > 0:
            self.current_selection_version += 1
            blocked = self.blocked_devices(current_model_version)
            usable = set(self.available_devices) - set(self.used_devices) - blocked
            for device_id in self.sample_balanced(list(usable), num_holes):
                self.current_selection[device_id] = current_model_version
                self.used_devices[device_id] = {
                    "model_version": current_model_version,
                    "selection_version": self.current_selection_version,
                }
        self.last_selected_version.update(self.current_selection)
        if len(self.current_selection) < self.device_selection_size:
            self.log_warning(
                fl_ctx,
                f"current selection has only {len(self.current_selection)} of {self.device_selection_size} devices",
            )

"""Server-side device selection that never reselects a device into a selection its leaf will refuse.

NVFlare marks each selected device with the model version current at selection time, and a leaf refuses a task
to a device whose cookie already carries that same selection id (``BaseState.is_device_selected``): it reads it
as "this device already trained for this selection". So a device that reports and is reselected before the
global model moves on (FedBuff with ``min_hole_to_fill`` 1 refills after every update) is never given a task
again, yet stays in the selection: a slot lost for good, and the job stalls once enough slots are lost.
``FreshSelectionDeviceManager`` keeps such a device out of that one fill; it is selectable again as soon as the
model version changes.
"""

from __future__ import annotations

from nvflare.apis.fl_context import FLContext
from nvflare.edge.assessors.buff_device_manager import BuffDeviceManager


class FreshSelectionDeviceManager(BuffDeviceManager):
    def __init__(self, device_selection_size: int, min_hole_to_fill: int = 1, device_reuse: bool = True):
        super().__init__(
            device_selection_size=device_selection_size, min_hole_to_fill=min_hole_to_fill, device_reuse=device_reuse
        )
        self.last_selected_version: dict[str, int] = {}

    def blocked_devices(self, current_model_version: int) -> set[str]:
        """Devices whose last selection was at ``current_model_version`` and that are not selected now."""
        return {
            d
            for d, v in self.last_selected_version.items()
            if v == current_model_version and d not in self.current_selection and d not in self.used_devices
        }

    def fill_selection(self, current_model_version: int, fl_ctx: FLContext) -> None:
        blocked = self.blocked_devices(current_model_version)
        # BuffDeviceManager samples from available minus used devices: count the blocked ones as used for this fill
        for d in blocked:
            self.used_devices[d] = {"model_version": current_model_version, "selection_version": None}
        try:
            super().fill_selection(current_model_version, fl_ctx)
        finally:
            for d in blocked:
                self.used_devices.pop(d, None)
        self.last_selected_version.update(self.current_selection)

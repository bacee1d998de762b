"""The contracts between the device simulator and a task processor that can train many devices in one call.

``FastSimulator`` holds one such trainer per leaf (the job's task processor component itself, not a per-device
copy). Through NVFlare's edge requests (``simulation.leaf_channels.EdgeRequestChannel``) a ``GroupTrainer`` gets
groups of devices that received the same task; through our leaf's gateway (``GatewayChannel``) a
``WeightsTrainer`` gets the model weights themselves. A processor with neither (any NVFlare
``DeviceTaskProcessor``) still works: each device then trains through its own copy's ``process_task``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from nvflare.edge.web.models.task_response import TaskResponse


@runtime_checkable
class GroupTrainer(Protocol):
    def process_group(self, device_ids: list[str], task: TaskResponse) -> list[dict]:
        """Train every device in ``device_ids`` on ``task``; one result dict each, in order."""
        ...

    def failed_result(self, device_id: str, task: TaskResponse, error: str = "") -> dict:
        """The result a device reports when its training failed for good (a zero-weight update), carrying
        ``error``, why (``common.protocol.DEVICE_ERROR_META``)."""
        ...


@runtime_checkable
class WeightsTrainer(Protocol):
    def train_devices(
        self, device_ids: list[str], weights: list[dict], versions: list[int]
    ) -> list[dict[str, np.ndarray]]:
        """Train every device in ``device_ids`` from the global weights of its own model version (``weights[i]``
        of ``versions[i]``; an asynchronous leaf's group mixes versions); one diff each (trained - received), in
        order."""
        ...

"""Real devices that misbehave, for the end-to-end tests of ``--devices real`` (run by NVFlare's HTTP device client,
``run_device_simulator``, whose device ids are ``<uuid>#<index>``): device 0 fails its first task (the client then
reports an error status), device 1 takes every task and never reports (it sleeps until the client is killed),
device 2 answers its first task with a diff of the wrong shape (the leaf must refuse it); the others train as
``processors.device_processor.RealDeviceProcessor`` does. Each task a device finishes prints
``FINISHED <device> <base version> <wall time>``, the order the test compares with the server's."""

from __future__ import annotations

import time

from nvflare.edge.web.models.task_response import TaskResponse

from processors.device_processor import RealDeviceProcessor
from processors.task_wire import received_model


class FlakyDeviceProcessor(RealDeviceProcessor):
    def __init__(self, compute_device: str = "", data_root: str = "", ca_cert: str = ""):
        super().__init__(compute_device, data_root, ca_cert)
        self.tasks = 0

    def process_task(self, task: TaskResponse) -> dict:
        index = int(self.device.device_id.rpartition("#")[2])
        self.tasks += 1
        if index == 0 and self.tasks == 1:
            raise RuntimeError("device 0 fails its first task (a test's fake)")
        if index == 1:
            time.sleep(3600)  # never reports; the test kills the client when the job has ended
        result = super().process_task(task)
        if index == 2 and self.tasks == 1:
            first = next(iter(result["data"]["dict"]))
            result["data"]["dict"][first] = [0.0]  # a wrong shape (JSON cannot carry NaN: requests refuses it)
            return result
        print(f"FINISHED {self.device.device_id} {received_model(task)[0]} {time.time():.6f}", flush=True)
        return result

"""Leaf-side widgets that start a device simulator on each leaf client.

``FastDeviceRunner`` runs our ``FastSimulator``; ``StockDeviceRunner`` runs NVFlare's own ``Simulator``
(kept for comparison, ``--simulator stock``). Both give devices ids derived from the leaf's name instead of a
random UUID, so each device's data partition and speed class are the same in every run.
"""

from __future__ import annotations

import os

from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.job_def import JobMetaKey
from nvflare.edge.constants import SpecialDeviceId
from nvflare.edge.simulation.devices.tp import TPODeviceFactory
from nvflare.edge.simulation.simulator import Simulator
from nvflare.edge.widgets.tpo_runner import TPORunner

from simulation.clock import DeviceSpeedConfig
from simulation.fast_simulator import FastSimulator


def device_id_prefix(site_name: str) -> str:
    bad = {SpecialDeviceId.MAX_INDICATOR, SpecialDeviceId.NUM_INDICATOR} & set(site_name)
    if bad:
        raise ValueError(f"leaf name {site_name!r} contains {bad}, which NVFlare uses inside device ids")
    return site_name


class StockDeviceRunner(TPORunner):
    """NVFlare's stock device simulator, with deterministic device ids."""

    def create_simulator(self, fl_ctx: FLContext) -> Simulator | None:
        simulator = super().create_simulator(fl_ctx)
        simulator.device_id_prefix = device_id_prefix(fl_ctx.get_identity_name())
        return simulator


class FastDeviceRunner(TPORunner):
    def __init__(
        self,
        task_processor_id: str,
        job_timeout: float = 120.0,
        num_devices: int = 100,
        num_workers: int = 2,
        speed: dict | None = None,
        time_scale: float = 0.0,
        results_dir: str = "",
        group_size: int = 1,
    ):
        super().__init__(task_processor_id, job_timeout, num_devices, num_workers)
        self.group_size = group_size
        self.speed = speed or {}
        self.time_scale = time_scale
        self.results_dir = results_dir

    def create_simulator(self, fl_ctx: FLContext) -> Simulator | None:
        site = fl_ctx.get_identity_name()
        job_name = fl_ctx.get_prop(FLContextKey.JOB_META).get(JobMetaKey.JOB_NAME)
        clock_log = os.path.join(self.results_dir, f"simclock_{site}.jsonl") if self.results_dir else None
        if clock_log and os.path.exists(clock_log):
            os.remove(clock_log)
        return FastSimulator(
            job_name=job_name,
            device_factory=TPODeviceFactory(self.tpo),
            device_id_prefix=device_id_prefix(site),
            num_devices=self.num_devices,
            num_workers=self.num_workers,
            get_job_timeout=self.job_timeout,
            speed=DeviceSpeedConfig.from_dict(self.speed),
            time_scale=self.time_scale,
            clock_log=clock_log,
            group_size=self.group_size,
        )

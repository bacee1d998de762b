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
from nvflare.edge.simulation.simulated_device import DeviceFactory, SimulatedDevice
from nvflare.edge.simulation.simulator import Simulator
from nvflare.edge.web.models.task_response import TaskResponse
from nvflare.edge.widgets.tpo_runner import TPORunner

from common.delays import DelayConfig, DeviceDelays
from simulation.fast_simulator import FastSimulator
from simulation.trainer import GroupTrainer


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


class SimulatedPhone(SimulatedDevice):
    """A device trained by the leaf's ``GroupTrainer``: it carries no copy of the task processor."""

    def do_task(self, task: TaskResponse) -> dict:
        raise RuntimeError(f"device {self.device_id} is trained by the leaf's GroupTrainer, not by itself")


class PhoneFactory(DeviceFactory):
    def make_device(self, device_id: str) -> SimulatedDevice:
        return SimulatedPhone(device_id)


class FastDeviceRunner(TPORunner):
    """Starts our ``FastSimulator`` on a leaf. A task processor that is a ``GroupTrainer`` (ours) trains every
    device through one shared instance; any other ``DeviceTaskProcessor`` trains each device through a copy, as
    NVFlare's own runner does.

    Args:
        task_processor_id: component id of the task processor.
        job_timeout: seconds to wait for the job to reach the leaf.
        num_devices: devices on this leaf.
        num_workers: device workers (thread pool size).
        delays: ``DelayConfig.to_dict()``.
        seed: the run seed (delays are a seeded function of it and the device id).
        time_scale: 0: report at once; S > 0: hold each result for its delays x S wall seconds.
        results_dir: where ``leaf_<leaf>.jsonl`` (one line per device report) goes ("": not written).
        group_size: devices a worker trains together (1: one at a time).
    """

    def __init__(
        self,
        task_processor_id: str,
        job_timeout: float = 120.0,
        num_devices: int = 100,
        num_workers: int = 2,
        delays: dict | None = None,
        seed: int = 0,
        time_scale: float = 0.0,
        results_dir: str = "",
        group_size: int = 1,
    ):
        super().__init__(task_processor_id, job_timeout, num_devices, num_workers)
        self.group_size = group_size
        self.delays = delays or {}
        self.seed = seed
        self.time_scale = time_scale
        self.results_dir = results_dir

    def create_simulator(self, fl_ctx: FLContext) -> FastSimulator:
        site = fl_ctx.get_identity_name()
        job_name = fl_ctx.get_prop(FLContextKey.JOB_META).get(JobMetaKey.JOB_NAME)
        report_log = os.path.join(self.results_dir, f"leaf_{site}.jsonl") if self.results_dir else None
        if report_log and os.path.exists(report_log):
            os.remove(report_log)
        trainer = self.tpo if isinstance(self.tpo, GroupTrainer) else None
        return FastSimulator(
            job_name=job_name,
            device_factory=PhoneFactory() if trainer is not None else TPODeviceFactory(self.tpo),
            device_id_prefix=device_id_prefix(site),
            num_devices=self.num_devices,
            num_workers=self.num_workers,
            get_job_timeout=self.job_timeout,
            delays=DeviceDelays(DelayConfig.from_dict(self.delays), self.seed),
            trainer=trainer,
            time_scale=self.time_scale,
            report_log=report_log,
            group_size=self.group_size,
        )

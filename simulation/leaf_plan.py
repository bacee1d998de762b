"""A leaf plans its own workers, torch threads, engine and group size, from its own machine, at run start.

In a deployment the machine that submits a job says nothing about the leaves, so the job carries only a
``PlanRequest`` (the model, batch, devices per round, the user's overrides) and each leaf's device runner calls
``plan_leaf`` when the run starts, with the cores, GPUs and free memory it sees (``planner.probe_hardware``) and
the number of leaves sharing its machine. In SimEnv that number is the job's leaf count (every leaf is on this
machine), and the plan is the one the driver printed; on a deployment a leaf counts the job processes of this job
on its machine (``count_leaf_processes``). Every leaf's plan is recorded in ``metrics.json`` (``leaf_plans``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import psutil
import torch

from common.profiles import DEFAULT_PROFILE
from processors.device import resolve_device
from processors.models import build_model
from simulation.planner import (
    HardwareProfile,
    WorkerPlan,
    estimate_worker_bytes,
    plan_engine,
    plan_workers,
    probe_hardware,
)

NVFLARE_CLIENT_JOB_MODULE = "nvflare.private.fed.app.client.worker_process"  # one per client per job


@dataclass(frozen=True)
class PlanRequest:
    """What a leaf plans from, besides its own hardware.

    Attributes:
        model: the model name (its memory per training worker is estimated from it).
        batch_size: local batch size.
        optimizer: local optimizer (its state counts in a worker's memory).
        devices_per_round: devices this leaf trains per round.
        compute_device: ``cpu``, ``cuda`` or ``cuda:N``.
        engine: ``auto``, ``vectorized`` or ``per-device``.
        num_workers: the user's ``--num-workers`` (None: planned).
        group_size: the user's ``--group-size`` (None: planned).
        profile: the utilisation profile's name.
        leaves_on_host: leaves sharing this machine (0: count this job's client processes on it).
    """

    model: str
    batch_size: int
    optimizer: str
    devices_per_round: int
    compute_device: str = "cpu"
    engine: str = "auto"
    num_workers: int | None = None
    group_size: int | None = None
    profile: str = DEFAULT_PROFILE
    leaves_on_host: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PlanRequest:
        return cls(**d)


def count_leaf_processes(job_id: str) -> int:
    """This job's NVFlare client job processes on this machine (at least 1: the caller's own)."""
    count = 0
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if NVFLARE_CLIENT_JOB_MODULE in cmdline and job_id in cmdline:
            count += 1
    return max(1, count)


def plan_leaf(request: PlanRequest, hardware: HardwareProfile | None = None, leaves_on_host: int | None = None) -> WorkerPlan:
    """The plan of one leaf: workers (``plan_workers``) and engine (``plan_engine``). ``leaves_on_host`` replaces
    the request's (a leaf that counted its neighbours); ``hardware`` defaults to this machine's."""
    hardware = hardware or probe_hardware()
    device = resolve_device(request.compute_device)
    model = build_model(request.model)
    plan = plan_workers(
        hardware,
        devices_per_leaf=request.devices_per_round,
        per_worker_bytes=estimate_worker_bytes(model, request.batch_size, request.optimizer),
        leaves_on_host=leaves_on_host or request.leaves_on_host or 1,
        use_gpu=device.type == "cuda",
        requested=request.num_workers,
        profile=request.profile,
    )
    has_buffers = any(True for _ in model.buffers())
    return plan_engine(plan, request.engine, has_buffers, request.group_size)


def hardware_summary(hardware: HardwareProfile) -> dict:
    """What a leaf saw of its machine, recorded next to its plan."""
    return {
        "cpu_cores": hardware.cpu_cores,
        "gpus": [{"name": g.name, "total_bytes": g.total_bytes, "free_bytes": g.free_bytes} for g in hardware.gpus],
        "ram_available_bytes": psutil.virtual_memory().available,
        "torch": str(torch.__version__),
    }

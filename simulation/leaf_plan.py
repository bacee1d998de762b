"""A leaf plans its own workers, torch threads, engine and group size, from its own machine, at run start.

In a deployment the machine that submits a job says nothing about the leaves, so the job carries only a
``PlanRequest`` (the model, batch, devices per round, the user's overrides) and each leaf's device runner calls
``plan_leaf`` when the run starts, with the cores, GPUs and free memory it sees (``planner.probe_hardware``) and
the number of leaves sharing its machine. In SimEnv that number is the job's leaf count (every leaf is on this
machine), and the plan is the one the driver printed; on a deployment a leaf counts the job processes of this job
on its machine (``count_leaf_processes``). Every leaf's plan is recorded in ``metrics.json`` (``leaf_plans``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace

import psutil
import torch

from common.profiles import DEFAULT_PROFILE
from processors.device import resolve_device
from processors.models import build_model
from processors.models.stat_tracker import untracked_buffers
from simulation.nvflare_private import NVFLARE_CLIENT_JOB_MODULE, NVFLARE_SIMULATOR_WORKER_MODULE
from simulation.planner import (
    HardwareProfile,
    WorkerPlan,
    cached_training_mflops,
    estimate_worker_bytes,
    plan_engine,
    plan_workers,
    probe_hardware,
)

DEFAULT_INPUT_SHAPE = (3, 32, 32)  # CIFAR-10's, when nothing better is known


@dataclass(frozen=True)
class PlanRequest:
    """What a leaf plans from, besides its own hardware.

    Attributes:
        model: the model name (its memory per training worker is estimated from it); None for a task processor
            that is not ours (``use_fast_simulator``): workers are then bounded by cores and devices only, and
            devices train one by one unless ``engine`` is ``vectorized`` (a processor that is a ``GroupTrainer``).
        batch_size: local batch size.
        optimizer: local optimizer (its state counts in a worker's memory).
        devices_per_round: devices this leaf trains per round.
        compute_device: ``cpu``, ``cuda`` or ``cuda:N``.
        engine: ``auto``, ``vectorized`` or ``per-device``.
        num_workers: the user's ``--num-workers`` (None: planned).
        group_size: the user's ``--group-size`` (None: planned).
        profile: the utilisation profile's name.
        leaves_on_host: leaves sharing this machine (0: count this job's client processes on it).
        input_shape: one sample's shape as the model receives it (its activations count in a worker's memory);
            None: the leaf's runner takes it from the leaf's own data.
    """

    model: str | None
    batch_size: int
    optimizer: str
    devices_per_round: int
    compute_device: str = "cpu"
    engine: str = "auto"
    num_workers: int | None = None
    group_size: int | None = None
    profile: str = DEFAULT_PROFILE
    leaves_on_host: int = 0
    input_shape: tuple[int, ...] | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PlanRequest:
        shape = d.get("input_shape")
        return cls(**(d | {"input_shape": tuple(shape) if shape is not None else None}))


def _sibling_key(cmdline: list[str]) -> tuple[str, str] | None:
    """What a leaf process shares with the other leaves of its job: (NVFlare's client job module, the job id) on a
    deployment, or (NVFlare's simulator worker module, the simulation's workspace) in SimEnv."""

    def value(flag: str) -> str | None:
        return cmdline[cmdline.index(flag) + 1] if flag in cmdline[:-1] else None

    if NVFLARE_CLIENT_JOB_MODULE in cmdline and value("-n"):
        return NVFLARE_CLIENT_JOB_MODULE, value("-n")
    if NVFLARE_SIMULATOR_WORKER_MODULE in cmdline and value("-o"):
        return NVFLARE_SIMULATOR_WORKER_MODULE, os.path.dirname(os.path.normpath(value("-o")))
    return None


def count_leaf_processes(own_cmdline: list[str] | None = None) -> int:
    """The leaf processes of this process's job on this machine, itself included (1 when this process is no
    NVFlare client process). A deployment's non-leaf clients of the job count too: a conservative share."""
    key = _sibling_key(own_cmdline if own_cmdline is not None else psutil.Process().cmdline())
    if key is None:
        return 1
    count = 0
    for p in psutil.process_iter(["cmdline"]):
        if _sibling_key(p.info.get("cmdline") or []) == key:
            count += 1
    return max(1, count)


def plan_leaf(
    request: PlanRequest, hardware: HardwareProfile | None = None, leaves_on_host: int | None = None
) -> WorkerPlan:
    """The plan of one leaf: workers (``plan_workers``) and engine (``plan_engine``). ``leaves_on_host`` replaces
    the request's (a leaf that counted its neighbours); ``hardware`` defaults to this machine's."""
    hardware = hardware or probe_hardware()
    leaves = leaves_on_host or request.leaves_on_host or 1
    if request.model is None:  # someone else's task processor: cores and devices bound its workers
        plan = plan_workers(
            hardware, request.devices_per_round, 0, leaves, requested=request.num_workers, profile=request.profile
        )
        if request.engine in ("auto", "per-device"):  # groups only when asked for
            return replace(
                plan,
                engine="per-device",
                group_size=1,
                engine_reason="the task processor is not this project's: one device per call",
            )
        return plan_engine(plan, request.engine, group_size=request.group_size)
    device = resolve_device(request.compute_device)
    model = build_model(request.model)
    plan = plan_workers(
        hardware,
        devices_per_leaf=request.devices_per_round,
        per_worker_bytes=estimate_worker_bytes(
            model, request.batch_size, request.optimizer, request.input_shape or DEFAULT_INPUT_SHAPE
        ),
        leaves_on_host=leaves,
        use_gpu=device.type == "cuda",
        requested=request.num_workers,
        profile=request.profile,
    )
    # on the CPU a heavy model trains faster one device at a time, on a GPU a light one with one worker (measured:
    # plan_engine's reasons); only ``auto`` for a model without BatchNorm statistics asks how heavy it is, so only
    # then is it counted
    has_buffers = bool(untracked_buffers(model))
    mflops = None
    if request.engine == "auto" and not has_buffers:
        mflops = cached_training_mflops(model, request.input_shape or DEFAULT_INPUT_SHAPE)
    return plan_engine(plan, request.engine, has_buffers, request.group_size, mflops_per_sample=mflops)


def hardware_summary(hardware: HardwareProfile) -> dict:
    """What a leaf saw of its machine, recorded next to its plan."""
    return {
        "cpu_cores": hardware.cpu_cores,
        "gpus": [{"name": g.name, "total_bytes": g.total_bytes, "free_bytes": g.free_bytes} for g in hardware.gpus],
        "ram_available_bytes": psutil.virtual_memory().available,
        "torch": str(torch.__version__),
    }

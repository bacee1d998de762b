"""Plans a run before any process starts: data checked, each leaf's workers and engine, the derived timeouts, and
everything recorded about the run in ``metrics.json`` (``run_info``)."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import psutil
import torch

from common.choices import ConfigError
from common.profiles import get_profile
from jobs.config import JobConfig
from jobs.methods import METHODS
from processors.data.sources import load_dataset
from processors.device import resolve_device
from processors.models import build_model
from simulation.planner import (
    HardwareProfile,
    Timeouts,
    WorkerPlan,
    derive_timeouts,
    estimate_worker_bytes,
    plan_engine,
    plan_workers,
    probe_hardware,
)


@dataclass(frozen=True)
class RunPlan:
    """Attributes:
    workers: each leaf's workers, torch threads and training engine.
    timeouts: how long a leaf waits for its parent, and when a silent leaf is lost.
    run_info: what is known before the run (config, environment, plans, profile), written into ``metrics.json``.
    device: the torch device training runs on.
    """

    workers: WorkerPlan
    timeouts: Timeouts
    run_info: dict
    device: torch.device

    def describe(self) -> str:
        return "\n".join([self.workers.describe(), self.workers.reasoning(), f"  timeouts: {self.timeouts.reason}"])


def environment_info(device: torch.device, hardware: HardwareProfile) -> dict:
    import nvflare

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nvflare": nvflare.__version__,
        "platform": platform.platform(),
        "compute_device": str(device),
        "cpu_cores": hardware.cpu_cores,
        "gpus": [g.name for g in hardware.gpus],
    }


def plan_for(cfg: JobConfig, hardware: HardwareProfile, device: torch.device) -> WorkerPlan:
    """Each leaf's workers, threads and training engine (``simulation.planner``) for this machine."""
    model = build_model(cfg.training.model)
    per_worker = estimate_worker_bytes(model, cfg.training.local_batch_size, cfg.training.optimizer)
    leaves_on_host = cfg.federation.num_leaf_nodes if cfg.run.env in ("sim", "poc") else 1
    plan = plan_workers(
        hardware,
        devices_per_leaf=cfg.federation.devices_per_leaf_per_round,
        per_worker_bytes=per_worker,
        leaves_on_host=leaves_on_host,
        use_gpu=device.type == "cuda",
        requested=cfg.engine.num_workers,
        profile=cfg.engine.profile,
    )
    if cfg.engine.simulator == "stock":
        return plan
    has_buffers = any(True for _ in model.buffers())
    return plan_engine(plan, cfg.engine.engine, has_buffers, cfg.engine.group_size)


def timeouts_for(cfg: JobConfig) -> Timeouts:
    model_bytes = sum(p.numel() * p.element_size() for p in build_model(cfg.training.model).parameters())
    return derive_timeouts(model_bytes, cfg.federation.devices_per_leaf_per_round, METHODS[cfg.method].leaf_sums(cfg),
                           cfg.engine.update_interval, cfg.engine.update_timeout, cfg.federation.leaf_timeout)  # fmt: skip


# NVFlare's stock path lists every device: a Device and its dict form (~510 bytes, measured with tracemalloc for
# 100k devices) on the leaf, again in every sync message and on the server: about 2 KB in all
STOCK_BYTES_PER_DEVICE = 2048


def check_pool_memory(cfg: JobConfig) -> None:
    """Our leaves register devices as ranges and the server never lists idle ones, so the pool costs no memory per
    idle device; NVFlare's stock path lists them all: refuse a pool it cannot hold in half the free memory."""
    if cfg.engine.simulator != "stock":
        return
    pool = cfg.federation.num_leaf_nodes * cfg.federation.devices_per_leaf
    need, free = pool * STOCK_BYTES_PER_DEVICE, psutil.virtual_memory().available
    if need > free / 2:
        raise ConfigError(
            f"--simulator stock keeps every one of the {pool:,} devices in memory (~{need / 2**30:.1f} GiB; "
            f"{free / 2**30:.1f} GiB free): lower --devices-per-leaf below {int(free / 2 / STOCK_BYTES_PER_DEVICE / cfg.federation.num_leaf_nodes):,} "
            "or use --simulator fast, whose pool costs nothing per idle device"
        )


def prepare(cfg: JobConfig) -> RunPlan:
    """Everything that can fail fast, before any NVFlare process starts (``ValueError``s name the fix)."""
    check_pool_memory(cfg)
    device = resolve_device(cfg.training.compute_device)
    load_dataset(cfg.spec)  # missing / malformed data fails here, with the fix in the message
    hardware = probe_hardware()
    workers = plan_for(cfg, hardware, device)
    timeouts = timeouts_for(cfg)
    run_info = {
        "config": cfg.to_dict(),
        "environment": environment_info(device, hardware),
        "planner": workers.to_dict(),
        "timeouts": timeouts.to_dict(),
        "profile": get_profile(cfg.engine.profile).to_dict(),
    }
    return RunPlan(workers, timeouts, run_info, device)

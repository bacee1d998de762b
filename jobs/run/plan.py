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
from jobs.run.timeouts import Timeouts, derive_timeouts
from processors.data.config import lazy_refusal
from processors.data.sources import Dataset, load_dataset
from processors.data.users import partition_stats
from processors.device import resolve_device
from processors.models import build_model
from simulation.leaf_plan import DEFAULT_INPUT_SHAPE, PlanRequest, plan_leaf
from simulation.planner import HardwareProfile, WorkerPlan, estimate_worker_bytes, plan_workers, probe_hardware


@dataclass(frozen=True)
class RunPlan:
    """Attributes:
    workers: each leaf's workers, torch threads and training engine on this machine (what every SimEnv leaf plans
        for itself at start); None on a deployment, where each leaf plans from its own machine.
    timeouts: how long a leaf waits for its parent, and when a silent leaf is lost.
    run_info: what is known before the run (config, environment, plans, profile), written into ``metrics.json``.
    device: the torch device training runs on (on a deployment: the leaves' ``--compute-device``, as given).
    notes: what the user should know before the run starts (printed with the plan).
    """

    workers: WorkerPlan | None
    timeouts: Timeouts
    run_info: dict
    device: torch.device | str
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.workers is None:
            workers = "Parallel workers: each leaf plans its own from its machine at start (metrics.json leaf_plans)"
        else:
            workers = f"{self.workers.describe()}\n{self.workers.reasoning()}"
        notes = "".join(f"\n[edgesim] note: {n}" for n in self.notes)
        return f"{workers}\n  timeouts: {self.timeouts.reason}{notes}"


def environment_info(device: torch.device | str, hardware: HardwareProfile) -> dict:
    import nvflare

    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "nvflare": nvflare.__version__,
        "platform": platform.platform(),
        "compute_device": str(device),
        "cpu_cores": hardware.cpu_cores,
        "gpus": [g.name for g in hardware.gpus],
    }


def plan_request(cfg: JobConfig, input_shape: tuple[int, ...] | None = None) -> PlanRequest:
    """What each leaf plans its workers from (``simulation.leaf_plan``): in SimEnv and POC every leaf is on this
    machine; on a deployment each leaf counts its neighbours. ``input_shape`` None: each leaf takes it from its
    own data."""
    t, e = cfg.training, cfg.engine
    return PlanRequest(
        model=t.model,
        batch_size=t.local_batch_size,
        optimizer=t.optimizer,
        devices_per_round=cfg.federation.devices_per_leaf_per_round,
        compute_device=t.compute_device,
        engine=e.engine,
        num_workers=e.num_workers,
        group_size=e.group_size,
        profile=e.profile,
        leaves_on_host=cfg.federation.num_leaf_nodes if cfg.run.env in ("sim", "poc") else 0,
        input_shape=input_shape,
    )


def plan_for(cfg: JobConfig, hardware: HardwareProfile, input_shape: tuple[int, ...] | None = None) -> WorkerPlan:
    """Each leaf's workers, threads and training engine on this machine (what every leaf of a SimEnv run plans
    for itself at start; on a deployment, what a leaf on this machine would plan)."""
    request = plan_request(cfg, input_shape)
    if cfg.engine.simulator != "stock":
        return plan_leaf(request, hardware, leaves_on_host=request.leaves_on_host or 1)
    # the stock baseline runs NVFlare's own device runner, which takes its worker count from the job
    model = build_model(cfg.training.model)
    return plan_workers(
        hardware,
        devices_per_leaf=request.devices_per_round,
        per_worker_bytes=estimate_worker_bytes(
            model, request.batch_size, request.optimizer, request.input_shape or DEFAULT_INPUT_SHAPE
        ),
        leaves_on_host=request.leaves_on_host or 1,
        use_gpu=resolve_device(request.compute_device).type == "cuda",
        requested=request.num_workers,
        profile=request.profile,
    )


def timeouts_for(cfg: JobConfig) -> Timeouts:
    model_bytes = sum(p.numel() * p.element_size() for p in build_model(cfg.training.model).parameters())
    return derive_timeouts(
        model_bytes,
        cfg.federation.devices_per_leaf_per_round,
        cfg.method_spec.leaf_sums(cfg),
        cfg.engine.update_interval,
        cfg.engine.update_timeout,
        cfg.federation.leaf_timeout,
    )


# NVFlare's stock path lists every device: a Device and its dict form on the leaf, again in every sync message and
# on the server (measured with tracemalloc: PERFORMANCE_OPTIMIZATION.md, "The figures behind rules in the code")
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


def check_model_fits_data(cfg: JobConfig, dataset: Dataset) -> None:
    """The model takes the data's samples and scores its classes; FedRevive's synthesis needs 3 x 32 x 32 images
    of as many classes as it generates."""
    model, name = build_model(cfg.training.model), cfg.training.model
    batch = dataset.prepare(dataset.x_test[:2])
    try:
        with torch.no_grad():
            out = model(batch)
    except Exception as ex:
        raise ConfigError(
            f"--model {name} cannot take the data's samples of shape {tuple(batch.shape[1:])} "
            f"({type(ex).__name__}: {ex}); give a model whose input matches the data"
        ) from ex
    # a model may score more classes than the data holds, whose logits are then never a label: a text task's
    # vocabulary (LEAF's 80 symbols), LEAF's 62-way CNN on TFF's 10 EMNIST digits
    fits = out.ndim == 2 and out.shape[1] >= dataset.num_classes
    if out.shape[0] != len(batch) or not fits:
        raise ConfigError(
            f"--model {name} gives outputs of shape {tuple(out.shape[1:])} per sample; the data has "
            f"{dataset.num_classes} classes, so it must score at least those ({dataset.num_classes},)"
        )
    if cfg.training.augment and len(dataset.input_shape) != 3:
        raise ConfigError(
            f"--augment crops and flips images (C x H x W); the data's samples are {dataset.input_shape}: "
            "leave out --augment"
        )
    cfg.method_spec.check_data(cfg, dataset)


def method_notes(cfg: JobConfig) -> tuple[str, ...]:
    """What the method wants the user to know before the run (e.g. a FedRevive run too short to revive)."""
    return cfg.method_spec.notes(cfg)


def prepare(cfg: JobConfig) -> RunPlan:
    """Everything that can fail fast, before any NVFlare process starts (``ValueError``s name the fix).

    On a deployment (``--env prod``) this machine only submits: the compute device and the data are checked by
    the sites, and each leaf plans its own workers at start (``workers`` is None, except for the stock baseline,
    whose device runner takes its worker count from the job)."""
    check_pool_memory(cfg)
    deployed = cfg.run.env == "prod"
    partition, notes = None, method_notes(cfg)
    if deployed:
        chosen = cfg.training.compute_device
        # "fedavg on the leaves' auto" read as a device named auto: each leaf resolves auto on its own hardware
        device = "each leaf's own device (auto)" if chosen == "auto" else f"the leaves' {chosen}"
        input_shape = None
    else:
        device = resolve_device(cfg.training.compute_device)
        dataset = load_dataset(cfg.spec)  # missing / malformed data fails here, with the fix in the message
        check_model_fits_data(cfg, dataset)
        input_shape = dataset.input_shape
        if any(dataset.dropped):  # --dataset-nonfinite drop: every process leaves out the same rows
            train, test = dataset.dropped
            notes += (f"--dataset-nonfinite drop: {train} training and {test} test rows holding NaN or inf left out",)
        if dataset.users is not None and dataset.users.lazy is not None and cfg.data.partition != "natural":
            raise ConfigError(lazy_refusal(cfg.data.dataset, cfg.data.partition))
        if cfg.data.partition == "natural" and dataset.users is not None:  # who holds what, in metrics.json
            pool = cfg.federation.num_leaf_nodes * cfg.federation.devices_per_leaf
            partition = partition_stats(dataset.users, pool)
    hardware = probe_hardware()
    workers = None if deployed and cfg.engine.simulator != "stock" else plan_for(cfg, hardware, input_shape)
    timeouts = timeouts_for(cfg)
    run_info = {
        "config": cfg.to_dict(),
        "environment": environment_info(device, hardware),
        "planner": workers.to_dict() if workers is not None else None,
        "timeouts": timeouts.to_dict(),
        "profile": get_profile(cfg.engine.profile).to_dict(),
    }
    if partition is not None:
        run_info["partition"] = partition
    return RunPlan(workers, timeouts, run_info, device, notes)

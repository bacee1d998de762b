"""Worker planner: how many devices a leaf trains at once (its ``ThreadPoolExecutor`` size).

Inputs are measured, not guessed: CPU cores (psutil / affinity), GPUs and their free memory (NVML through
nvidia-ml-py, else torch), the memory one training worker needs (estimated from the model, batch size and
optimizer state) and the devices a leaf must train per round (``ceil(selection / leaves)``). Every decision
comes with the reason, printed once per job.

Why cores bound the CPU path: a worker's training is PyTorch compute; threads beyond the cores available to a
leaf only time-slice. Why cores also bound the GPU path: each worker launches its kernels from Python under the
GIL, so more threads than cores add queueing, not throughput. A light model's vectorised groups on a GPU go
further: one worker per GPU training the leaf's whole round as one group (``plan_engine``) beats the cores'
workers each training its share, since the kernels are launch-bound and a larger group launches the same kernels
once for more devices (the measurement: GPU_FIX_NOTES.md).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
import torch.nn as nn

from common.cores import available_cores
from common.nvml import Nvml, visible_indices
from common.profiles import DEFAULT_PROFILE, UtilisationProfile, get_profile
from processors.data.cache import cached_arrays
from processors.training_vectorized import NotVectorizable

# Per-process CUDA context and allocator slack, not available to workers.
CUDA_CONTEXT_BYTES = 600 * 2**20
# The share of free GPU memory the planner hands out is the utilisation profile's ``gpu_memory_share`` (the rest
# absorbs fragmentation and other processes).
# Allocator rounding and workspace slack ``estimate_worker_bytes`` puts on its estimate; a profile's
# ``memory_slack`` replaces it when planning.
ESTIMATE_SLACK = 1.25


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class HardwareProfile:
    cpu_cores: int
    gpus: tuple[GpuInfo, ...] = ()


@dataclass(frozen=True)
class WorkerPlan:
    num_workers: int
    limited_by: str
    devices_per_leaf: int  # devices a leaf trains per round
    per_worker_bytes: int
    limits: dict = field(default_factory=dict)
    compute: str = "cpu"
    gpu_bytes_per_leaf: int | None = None  # GPU memory this leaf may use (None: CPU path)
    engine: str = "per-device"  # or "vectorized" (see plan_engine)
    group_size: int = 1  # devices one worker trains together
    engine_reason: str = ""
    profile: str = DEFAULT_PROFILE  # the utilisation profile the plan follows (common.profiles)
    cores_per_leaf: int = 0  # 0: the "cpu" limit (plans made before profiles)
    leaves_per_gpu: int = 1  # leaves sharing one GPU (each caps its CUDA allocator at share / this)
    gpus_per_leaf: int = 1  # GPUs a leaf has to itself (more GPUs than leaves on the host)

    @property
    def torch_threads(self) -> int:
        """Intra-op threads for each leaf process: its cores shared by its workers. More would make the leaves'
        OpenMP pools fight over the same cores (docs/performance-history.md, "threads")."""
        return max(1, int(self.cores_per_leaf or self.limits.get("cpu") or 1) // self.num_workers)

    @property
    def waves(self) -> float:
        """Training calls each worker makes per round: a vectorised group trains ``group_size`` devices at once."""
        return self.devices_per_leaf / (self.num_workers * max(1, self.group_size))

    def describe(self) -> str:
        return (
            f"Parallel workers: {self.num_workers} per leaf for {self.devices_per_leaf} devices per leaf "
            f"(limited by {self.limited_by}); ~{self.waves:.1f} waves per round"
        )

    def reasoning(self) -> str:
        parts = [f"{k}={'unbounded' if v is None else v}" for k, v in self.limits.items()]
        memory = (
            f"est. {self.per_worker_bytes / 2**20:.1f} MiB per device trained"
            if self.per_worker_bytes
            else "memory per device not estimated (a task processor that is not this project's)"
        )
        lines = [f"  limits per leaf: {', '.join(parts)}; {memory}"]
        if self.engine_reason:
            lines.append(f"  engine: {self.engine}, groups of {self.group_size} device(s) ({self.engine_reason})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["waves"] = round(self.waves, 3)
        d["torch_threads"] = self.torch_threads
        return d


def probe_hardware() -> HardwareProfile:
    """Cores available to this process and every visible GPU's memory (NVML first, torch as fallback)."""
    return HardwareProfile(cpu_cores=available_cores(), gpus=tuple(_probe_gpus()))


def _probe_gpus() -> list[GpuInfo]:
    """Each GPU this process may use (``common.nvml``); torch's view when NVML is unusable (it also covers "no
    GPU")."""
    with Nvml() as nvml:
        if nvml.available:
            return [
                GpuInfo(nvml.names[i], mem.total, mem.free)
                for i in visible_indices(nvml.count)
                if (mem := nvml.memory(i)) is not None
            ]
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        out.append(GpuInfo(torch.cuda.get_device_name(i), total, free))
    return out


CPU_GROUP_MAX_MFLOPS = 100.0  # auto on the CPU: a model costing more per training sample trains one device at a time
# auto on a GPU: a vectorised model costing at most this per training sample gets one worker per GPU (launch-bound);
# a heavier one keeps the cores' workers (ResNet-18's figures on a GPU: GPU_FIX_NOTES.md)
GPU_ONE_WORKER_MAX_MFLOPS = CPU_GROUP_MAX_MFLOPS


MFLOPS_CACHE = "~/.cache/edgesim-flare/plan"
MFLOPS_FORMAT = 1  # raise whenever training_mflops counts differently: older cached counts are not read


def cached_training_mflops(model: nn.Module, input_shape: tuple[int, ...], folder: str = MFLOPS_CACHE) -> float:
    """``training_mflops``, counted once per machine (``processors.data.cache``) and read back by every later
    process: counting loads ``torch._dynamo`` (a dispatch mode does), about 2.5 s of a 2-core machine in the
    driver and again in every leaf at start. The key is the count's input: the model's class, the source file it
    is defined in (its content, so an edited model is counted again), the input shape and torch's version. A
    model whose source cannot be read is counted in the process."""
    cls = type(model)
    try:
        with open(inspect.getsourcefile(cls) or "", "rb") as f:
            source = hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, TypeError):
        return training_mflops(model, input_shape)
    key = {
        "model": f"{cls.__module__}.{cls.__qualname__}",
        "source": source,
        "shape": "x".join(map(str, input_shape)),
        "torch": torch.__version__,
    }
    made = cached_arrays(
        folder, "mflops", MFLOPS_FORMAT, key, lambda: {"mflops": np.array([training_mflops(model, input_shape)])}
    )
    return float(made["mflops"][0])


def training_mflops(model: nn.Module, input_shape: tuple[int, ...]) -> float:
    """Forward + backward MFLOP of one training sample of ``model`` (``torch.utils.flop_counter``, on the CPU)."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = copy.deepcopy(model).cpu().train()
    x = torch.zeros(2, *input_shape)
    rnn_flops = 0.0
    handles = [m.register_forward_hook(_count_lstm) for m in probe.modules() if isinstance(m, nn.LSTM)]
    try:
        with FlopCounterMode(display=False) as counter:
            probe(x).float().sum().backward()
        rnn_flops = sum(getattr(m, "_planner_flops", 0.0) for m in probe.modules())
    finally:
        for h in handles:
            h.remove()
    return (counter.get_total_flops() + rnn_flops) / 2 / 1e6


def _count_lstm(module: nn.LSTM, inputs: tuple, _output) -> None:
    """FlopCounterMode does not count torch's fused LSTM kernel: count its matmuls from the shapes, forward and
    backward (x 3), on the module (``processors.models.char_lstm``: 381 MFLOP per 80-character sample;
    ``processors.models.word_lstm``: 252.5 per 20-word sample)."""
    x = inputs[0]
    steps = x.shape[1] if module.batch_first else x.shape[0]
    samples = x.shape[0] if module.batch_first else x.shape[1]
    hidden, gates = module.hidden_size, 4 * module.hidden_size
    per_step = sum(
        2 * gates * ((module.input_size if layer == 0 else hidden) + hidden) for layer in range(module.num_layers)
    )
    module._planner_flops = getattr(module, "_planner_flops", 0.0) + 3.0 * per_step * steps * samples


def estimate_worker_bytes(
    model: nn.Module, batch_size: int, optimizer: str, input_shape: tuple[int, ...] = (3, 32, 32)
) -> int:
    """Memory of one training worker: weights, gradients, optimizer state, the received global copy and the
    diff, plus activations saved for backward (measured with forward hooks on a one-sample batch of
    ``input_shape``, then scaled to the batch size)."""
    n_params = sum(p.numel() for p in model.parameters())
    state_copies = {"adam": 2, "sgd": 1}.get(optimizer, 2)
    param_bytes = 4 * n_params * (1 + 1 + state_copies + 2)
    activation_elems = 0

    def hook(_module, _inputs, output):
        nonlocal activation_elems
        if isinstance(output, torch.Tensor):
            activation_elems += output.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape, device=next(model.parameters()).device))
    finally:
        for h in handles:
            h.remove()
    # saved activation + its gradient, plus the input batch, float32
    activation_bytes = 4 * batch_size * (2 * activation_elems + math.prod(input_shape))
    return int(ESTIMATE_SLACK * (param_bytes + activation_bytes))  # allocator rounding and workspace slack


def plan_workers(
    hardware: HardwareProfile,
    devices_per_leaf: int,
    per_worker_bytes: int,
    leaves_on_host: int = 1,
    use_gpu: bool = False,
    requested: int | None = None,
    profile: UtilisationProfile | str = DEFAULT_PROFILE,
) -> WorkerPlan:
    """The worker count of each leaf and what limited it, under a utilisation profile: its ``workers_per_core``
    scales the CPU bound, its ``gpu_memory_share`` and ``memory_slack`` the GPU memory bound."""
    if devices_per_leaf < 1:
        raise ValueError("devices_per_leaf must be >= 1")
    prof = get_profile(profile)
    per_worker_bytes = int(per_worker_bytes * prof.memory_slack / ESTIMATE_SLACK)
    cores_per_leaf = max(1, hardware.cpu_cores // max(leaves_on_host, 1))
    limits: dict[str, int | None] = {"devices": devices_per_leaf}
    limits["cpu"] = max(1, int(cores_per_leaf * prof.workers_per_core))
    compute = "cpu"
    leaves_per_gpu = gpus_per_leaf = 1
    if use_gpu:
        if not hardware.gpus:
            raise ValueError("the GPU path was asked for but no GPU is visible; use --compute-device cpu")
        compute = f"{len(hardware.gpus)} GPU(s)"
        # leaves are spread over GPUs round-robin; a GPU shared by k leaves gives each 1/k of its free memory
        leaves_per_gpu = math.ceil(leaves_on_host / len(hardware.gpus))
        gpus_per_leaf = max(1, len(hardware.gpus) // max(leaves_on_host, 1))
        usable = min(
            (g.free_bytes - CUDA_CONTEXT_BYTES * leaves_per_gpu) * prof.gpu_memory_share / leaves_per_gpu
            for g in hardware.gpus
        )
        if usable < per_worker_bytes:
            raise ValueError(
                f"one training worker needs ~{per_worker_bytes / 2**20:.0f} MiB but each leaf gets only "
                f"{max(usable, 0) / 2**20:.0f} MiB of GPU memory; lower --local-batch-size, run fewer leaves "
                "per GPU, or use --compute-device cpu"
            )
        limits["gpu_memory"] = int(usable // per_worker_bytes) * gpus_per_leaf
    gpu_bytes = int(usable) * gpus_per_leaf if use_gpu else None
    extra = {
        "profile": prof.name,
        "cores_per_leaf": cores_per_leaf,
        "leaves_per_gpu": leaves_per_gpu,
        "gpus_per_leaf": gpus_per_leaf,
    }
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--num-workers {requested}: must be >= 1")
        return WorkerPlan(
            requested, "--num-workers", devices_per_leaf, per_worker_bytes, limits, compute, gpu_bytes, **extra
        )
    limited_by = min(limits, key=lambda k: limits[k])
    return WorkerPlan(
        limits[limited_by], limited_by, devices_per_leaf, per_worker_bytes, limits, compute, gpu_bytes, **extra
    )


def plan_engine(
    plan: WorkerPlan,
    requested: str = "auto",
    model_has_buffers: bool = False,
    group_size: int | None = None,
    profile: UtilisationProfile | str | None = None,
    mflops_per_sample: float | None = None,
) -> WorkerPlan:
    """Choose the training engine and, for the vectorised one, how many devices a worker trains together.

    A group of g devices needs g times one device's memory (the activations, weights, gradients and optimizer
    state that ``estimate_worker_bytes`` counts, per device), so on a GPU ``workers x g x per-device bytes`` must fit the leaf's
    share; and a group never exceeds the devices a worker gets per round (``ceil(devices per leaf / workers)``).
    The profile (default: the plan's) scales that group by its ``group_fraction``; ``--group-size`` overrides both.
    On the CPU, ``auto`` trains a model of more than ``CPU_GROUP_MAX_MFLOPS`` per sample (``mflops_per_sample``,
    ``training_mflops``) one device at a time: there batched convolutions do not pay (``benchmarks/perf/bench_engine.py``).
    """
    prof = get_profile(profile or plan.profile)
    if requested not in ("auto", "vectorized", "per-device"):
        raise ValueError(f"--engine {requested!r}: use auto, vectorized or per-device")
    on_gpu = plan.gpu_bytes_per_leaf is not None
    if requested == "per-device":
        return replace(plan, engine="per-device", group_size=1, engine_reason="--engine per-device")
    if model_has_buffers:
        if requested == "vectorized":
            raise NotVectorizable()
        reason = "the model has BatchNorm statistics, which only the per-device engine keeps per device"
        return replace(plan, engine="per-device", group_size=1, engine_reason=reason)
    heavy = mflops_per_sample is not None and mflops_per_sample > CPU_GROUP_MAX_MFLOPS
    if requested == "auto" and not on_gpu and heavy:
        reason = (
            f"auto on the CPU: {mflops_per_sample:.0f} MFLOP per training sample (> {CPU_GROUP_MAX_MFLOPS:.0f}); "
            "there a group's batched convolutions are slower than one device at a time (measured: benchmarks/perf/"
            "bench_engine.py --model resnet18, PERFORMANCE_OPTIMIZATION.md)"
        )
        return replace(plan, engine="per-device", group_size=1, engine_reason=reason)
    light = mflops_per_sample is not None and mflops_per_sample <= GPU_ONE_WORKER_MAX_MFLOPS
    if requested == "auto" and on_gpu and light and plan.limited_by != "--num-workers":
        plan = replace(
            plan,
            num_workers=min(plan.gpus_per_leaf, plan.num_workers),
            limited_by=(
                f"one worker per GPU: {mflops_per_sample:.1f} MFLOP per training sample is launch-bound, so one "
                "group of the leaf's round beats the cores' workers' smaller groups (measured: GPU_FIX_NOTES.md)"
            ),
        )
    limits = {"devices per worker": math.ceil(plan.devices_per_leaf / plan.num_workers)}
    if on_gpu:
        limits["gpu_memory"] = max(1, plan.gpu_bytes_per_leaf // (plan.num_workers * plan.per_worker_bytes))
    chosen = group_size or max(1, int(min(limits.values()) * prof.group_fraction))
    why = "--group-size" if group_size else min(limits, key=lambda k: limits[k])
    if not group_size and prof.group_fraction != 1:
        why += f" x {prof.group_fraction} (profile {prof.name})"
    # auto: batching pays on CPU as well as on GPU (benchmarks/perf/bench_engine.py prints the ratio per K)
    source = "--engine vectorized" if requested == "vectorized" else "auto: the model has no BatchNorm"
    detail = ", ".join(f"{k}={v}" for k, v in limits.items())
    return replace(
        plan, engine="vectorized", group_size=chosen, engine_reason=f"{source}; group limited by {why}: {detail}"
    )

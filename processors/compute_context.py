"""Where a device's training runs: the received global weights as tensors on the compute device, converted once per
model version per process, and the context around each task or group on a GPU (the utilisation profile's memory
cap, this worker's CUDA stream, the precision's switches, the cache cleanup). Used by the task processor
(``processors.task_processor``); process-wide state, so every device and worker of a leaf shares it. The converted
weights are keyed by their owner too: in a pack (``docs/packs.md``) each run's processor is an owner of its own,
and run 1's version 2 is another model than run 0's version 2."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import torch

from common.profiles import UtilisationProfile
from processors.data.device_samples import ready_for_other_streams
from processors.precision import flushed_denormals, use_precision

_lock = threading.Lock()
# (model version, device, owner) -> weights on device
_global_params: dict[tuple, dict[str, torch.Tensor]] = {}
_memory_capped: set[str] = set()  # CUDA devices whose allocator this process has capped
_worker = threading.local()  # this worker thread's CUDA streams


def global_params_on(
    model_data: dict, version: int, device: torch.device, keep_versions: int = 3, owner: int = 0
) -> dict[str, torch.Tensor]:
    """The received global weights as tensors on ``device``, converted once per model version and ``owner`` (whose
    versions they are: a run's task processor, ``processors.task_processor``) per process; each owner's
    ``keep_versions`` newest versions stay converted, for stale tasks."""
    key = (version, str(device), owner)
    with _lock:
        cached = _global_params.get(key)
        if cached is None:
            cached = {k: _tensor_on(v, device) for k, v in model_data.items()}
            ready_for_other_streams(device)
            stale = version - max(1, keep_versions)
            for old in [k for k in _global_params if k[2] == owner and k[0] <= stale]:
                del _global_params[old]
            _global_params[key] = cached
    return cached


def _tensor_on(value, device: torch.device) -> torch.Tensor:
    """A float32 tensor on ``device`` of a received array: on the CPU a view of it when it is writable (the leaf's
    own copy), a copy when it is read-only (a version mapped from the server's shared memory, which the server
    reuses once the leaf no longer reports it held: ``simulation.bulk_link``)."""
    array = np.asarray(value, dtype=np.float32)
    if not array.flags.writeable:
        return torch.tensor(array, device=device)
    return torch.as_tensor(array).to(device)


def _cap_cuda_memory(device: torch.device, share: float) -> None:
    """Once per process and GPU: cap the CUDA caching allocator at ``share`` of the GPU's memory."""
    key = str(device)
    with _lock:
        if key in _memory_capped:
            return
        torch.cuda.set_per_process_memory_fraction(min(1.0, share), device)
        _memory_capped.add(key)


@contextlib.contextmanager
def compute_context(
    device: torch.device,
    profile: UtilisationProfile,
    leaves_per_gpu: int = 1,
    precision: str = "fp32",
    flush_denormal: bool = False,
):
    """Around one task or group: on CUDA, apply the profile (memory cap, this worker's stream, cache cleanup) and
    the precision's TF32 switches (``processors.precision``); on the CPU, only ``flush_denormal``
    (``processors.precision.flushed_denormals``)."""
    if device.type != "cuda":
        with flushed_denormals(flush_denormal):
            yield
        return
    _cap_cuda_memory(device, profile.gpu_memory_share / max(1, leaves_per_gpu))
    use_precision(precision, device)
    stream = None
    if profile.pinned_streams:
        streams = getattr(_worker, "streams", None)
        if streams is None:
            streams = _worker.streams = {}
        stream = streams.get(str(device))
        if stream is None:
            stream = streams[str(device)] = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))  # e.g. a model built on the default stream
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        yield
    if stream is not None:
        stream.synchronize()
    if profile.empty_cache_every_task:
        torch.cuda.empty_cache()

"""The NVFlare ``DeviceTaskProcessor`` of a simulated device: receive global weights, train on ``DEVICE``,
return a WEIGHT_DIFF.

NVFlare deep-copies the processor for every simulated device, so instances hold only their small
configuration; data, global weights and models are cached per process and per worker thread.

The utilisation profile (``simulation.profiles``, by name) sets, on CUDA only: the cap on this process's CUDA
caching allocator, a stream per worker thread with pinned copies of the diffs, whether the data stays on the
GPU, how many global-model versions stay converted there, and when the allocator's cache is emptied.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time

import numpy as np
import torch
from nvflare.apis.dxo import DXO, DataKind, from_dict
from nvflare.edge.constants import MsgKey
from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.task_response import TaskResponse

from processors.data.partition import device_indices, stable_seed
from processors.data.sources import Dataset, DatasetSpec, load_dataset
from processors.device import resolve_device
from processors.training import LocalTrainingConfig, train_local, worker_model
from processors.training_vectorized import train_group
from simulation.clock import DeviceSpeedConfig
from simulation.profiles import DEFAULT_PROFILE, PROFILES, UtilisationProfile

# result metadata naming the device, so leaves that forward updates individually (FedRevive) can tell them apart
DEVICE_ID_META = "edgesim_device_id"

_lock = threading.Lock()
_global_params: dict[tuple, dict[str, torch.Tensor]] = {}  # (model version, device) -> weights on device
_device_buffers: dict[str, dict[str, torch.Tensor]] = {}  # device id -> its own BatchNorm statistics
_memory_capped: set[str] = set()  # CUDA devices whose allocator this process has capped
_worker = threading.local()  # this worker thread's CUDA streams


def _ready_for_other_streams(device: torch.device) -> None:
    """Shared tensors (dataset, global weights) are read by every worker's stream: wait for their copies."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


@functools.lru_cache(maxsize=4)
def _dataset_on(spec: DatasetSpec, device: str) -> Dataset:
    data = load_dataset(spec).to(torch.device(device))
    _ready_for_other_streams(torch.device(device))
    return data


def global_params_on(
    model_data: dict, version: int, device: torch.device, keep_versions: int = 3
) -> dict[str, torch.Tensor]:
    """The received global weights as tensors on ``device``, converted once per model version per process; the
    ``keep_versions`` newest versions stay converted, for stale tasks."""
    key = (version, str(device))
    with _lock:
        cached = _global_params.get(key)
        if cached is None:
            cached = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)).to(device) for k, v in model_data.items()}
            _ready_for_other_streams(device)
            for old in [k for k in _global_params if k[0] <= version - max(1, keep_versions)]:
                del _global_params[old]
            _global_params[key] = cached
    return cached


def _cap_cuda_memory(device: torch.device, share: float) -> None:
    """Once per process and GPU: cap the CUDA caching allocator at ``share`` of the GPU's memory."""
    key = str(device)
    with _lock:
        if key in _memory_capped:
            return
        torch.cuda.set_per_process_memory_fraction(min(1.0, share), device)
        _memory_capped.add(key)


@contextlib.contextmanager
def compute_context(device: torch.device, profile: UtilisationProfile, leaves_per_gpu: int = 1):
    """Around one task or group: on CUDA, apply the profile (memory cap, this worker's stream, cache cleanup);
    on the CPU, nothing."""
    if device.type != "cuda":
        yield
        return
    _cap_cuda_memory(device, profile.gpu_memory_share / max(1, leaves_per_gpu))
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
    if profile.empty_cache == "every-task":
        torch.cuda.empty_cache()


class FedAvgTaskProcessor(DeviceTaskProcessor):
    """Local training of one device for FedAvg / FedBuff / FedRevive (they differ only on the server)."""

    def __init__(
        self,
        dataset: dict,
        model: str = "cifar10_convnet",
        subset_size: int = 350,
        dirichlet_alpha: float = 0.5,
        seed: int = 0,
        local_iters: int = 25,
        local_batch_size: int = 32,
        local_lr: float = 3e-4,
        optimizer: str = "adam",
        compute_device: str = "auto",
        speed: dict | None = None,
        sleep_delays: bool = False,
        wire_format: str = "numpy",
        torch_threads: int = 0,
        profile: str = DEFAULT_PROFILE,
        leaves_per_gpu: int = 1,
    ):
        DeviceTaskProcessor.__init__(self)
        self.dataset = dataset
        self.model = model
        self.subset_size = subset_size
        self.dirichlet_alpha = dirichlet_alpha
        self.seed = seed
        # NVFlare serialises a component by reading back attributes named like its constructor arguments.
        self.local_iters = local_iters
        self.local_batch_size = local_batch_size
        self.local_lr = local_lr
        self.optimizer = optimizer
        self.compute_device = compute_device
        self.speed = speed or {}
        self.sleep_delays = sleep_delays
        self.wire_format = wire_format  # "lists" reproduces NVFlare's example (for the stock baseline)
        self.torch_threads = torch_threads  # 0: leave torch's default
        self.profile = profile  # a name in simulation.profiles.PROFILES
        self.leaves_per_gpu = leaves_per_gpu  # leaves sharing this leaf's GPU (they split its memory share)
        self.tasks_done = 0

    @property
    def training(self) -> LocalTrainingConfig:
        return LocalTrainingConfig(self.local_iters, self.local_batch_size, self.local_lr, self.optimizer)

    @property
    def settings(self) -> UtilisationProfile:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown utilisation profile {self.profile!r}; use {', '.join(PROFILES)}")
        return PROFILES[self.profile]

    def setup(self, job: JobResponse) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def process_task(self, task: TaskResponse) -> dict:
        version, weights = self._received_model(task)
        diff = self.train(self.device.device_id, weights, version)
        if self.sleep_delays:  # stock-simulator path: heterogeneity by real sleeping, like NVFlare's example
            train_s, comm_s = DeviceSpeedConfig.from_dict(self.speed).sample_seconds(
                self.device.device_id, self.tasks_done
            )
            time.sleep(train_s + comm_s)
        self.tasks_done += 1
        return self._result(self.device.device_id, diff)

    def process_group(self, device_ids: list[str], task: TaskResponse) -> list[dict]:
        """Train several devices that received the same task together (vectorised engine); one result each, in
        order, each what ``process_task`` would return for that device."""
        version, weights = self._received_model(task)
        diffs = self.train_group(device_ids, weights, version)
        return [self._result(device_id, diff) for device_id, diff in zip(device_ids, diffs, strict=True)]

    def failed_result(self, task: TaskResponse) -> dict:
        """What a device whose training failed for good reports: an all-zero diff with weight ``count`` 0. NVFlare
        then removes the device from the selection (a round does not wait for it forever) while the mean over
        the other devices' updates is unchanged (NVFlare divides the summed diffs by the summed counts)."""
        _, weights = self._received_model(task)
        zeros = {k: np.zeros(np.shape(v), dtype=np.float32) for k, v in weights.items()}
        result = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": zeros, "count": 0})
        result.set_meta_prop(DEVICE_ID_META, self.device.device_id)
        return result.to_dict()

    def _received_model(self, task: TaskResponse) -> tuple[int, dict]:
        model = from_dict(task.task_data)
        if not isinstance(model, DXO) or model.data_kind != DataKind.WEIGHTS or not isinstance(model.data, dict):
            raise ValueError(f"device {self.device.device_id}: expected a WEIGHTS DXO holding a dict")
        return int(model.get_meta_prop(MsgKey.MODEL_VERSION, 0) or 0), model.data

    def _result(self, device_id: str, diff: dict[str, np.ndarray]) -> dict:
        if self.wire_format == "lists":
            diff = {k: v.tolist() for k, v in diff.items()}
        result = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": diff})
        result.set_meta_prop(DEVICE_ID_META, device_id)
        return result.to_dict()

    def _prepare(self, device_id: str, version: int) -> tuple[torch.device, torch.Tensor, torch.Tensor, torch.Generator]:
        """This device's samples (on DEVICE, or on the CPU when the profile keeps data off it) and its training
        generator, the same for either engine."""
        if self.torch_threads and torch.get_num_threads() != self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        device = resolve_device(self.compute_device)
        data_device = device if self.settings.data_resident else torch.device("cpu")
        spec = DatasetSpec(**self.dataset)
        data = _dataset_on(spec, str(data_device))
        labels = load_dataset(spec).y_train.numpy()  # the CPU copy, cached per process
        indices = device_indices(labels, device_id, self.subset_size, self.dirichlet_alpha, self.seed)
        idx = torch.from_numpy(indices).to(data_device)
        x, y = data.x_train.index_select(0, idx), data.y_train.index_select(0, idx)
        generator = torch.Generator().manual_seed(stable_seed("train", self.seed, device_id, version) % 2**63)
        return device, x, y, generator

    def train(self, device_id: str, model_data: dict, version: int) -> dict[str, np.ndarray]:
        """Train ``device_id`` from the given global weights; return its WEIGHT_DIFF as numpy arrays."""
        settings = self.settings
        with compute_context(resolve_device(self.compute_device), settings, self.leaves_per_gpu):
            device, x, y, generator = self._prepare(device_id, version)
            net = worker_model(self.model, device)
            params = global_params_on(model_data, version, device, settings.cached_versions)
            diff, buffers = train_local(
                net, params, x, y, self.training, generator, _device_buffers.get(device_id), settings.pinned_streams
            )
        if buffers:
            with _lock:
                _device_buffers[device_id] = buffers
        return diff

    def train_group(self, device_ids: list[str], model_data: dict, version: int) -> list[dict[str, np.ndarray]]:
        """Train several devices from the same global weights in one vectorised call (``train_group``); each
        diff equals what ``train`` gives for that device, up to floating-point summation order."""
        settings = self.settings
        with compute_context(resolve_device(self.compute_device), settings, self.leaves_per_gpu):
            prepared = [self._prepare(device_id, version) for device_id in device_ids]
            device = prepared[0][0]
            params = global_params_on(model_data, version, device, settings.cached_versions)
            return train_group(
                self.model,
                params,
                [(x, y) for _, x, y, _ in prepared],
                self.training,
                [g for *_, g in prepared],
                device,
                settings.pinned_streams,
            )

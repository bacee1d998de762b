"""A device's training samples on the device they train on, cached per process: the dataset moved there once,
and each device's sample indices drawn once for the devices of the last 8,192 tasks (a device trains again and
again: drawing its Dirichlet shares from the labels cost a noticeable part of every task; PERFORMANCE_OPTIMIZATION.md,
"The figures behind rules in the code").

Both engines and every task of a leaf take a device's samples from ``device_samples``; the caches are shared by the
leaf's worker threads: read, never written after they are filled.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import torch

from processors.data import partition
from processors.data.config import DataConfig
from processors.data.sources import Dataset, DatasetSpec, load_dataset


def ready_for_other_streams(device: torch.device) -> None:
    """Shared tensors (dataset, global weights) are read by every worker's stream: wait for their copies."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


@functools.lru_cache(maxsize=4)
def dataset_on(spec: DatasetSpec, device: str) -> Dataset:
    """The dataset of SPEC on DEVICE (a name), moved there once per process."""
    data = load_dataset(spec).to(torch.device(device))
    ready_for_other_streams(torch.device(device))
    return data


@functools.lru_cache(maxsize=8192)
def cached_device_indices(
    spec: DatasetSpec,
    device_id: str,
    subset_size: int,
    alpha: float | None,
    seed: int,
    partition_name: str,
    offsets: tuple[tuple[str, int], ...] | None = None,
) -> np.ndarray:
    """``partition.device_indices`` of a device, drawn once per process (OFFSETS as sorted pairs: hashable)."""
    host = load_dataset(spec)  # the CPU copy, cached per process
    return partition.device_indices(
        host.y_train.numpy(),
        device_id,
        subset_size,
        alpha,
        seed,
        host.num_classes,
        partition_name,
        host.users,
        dict(offsets) if offsets else None,
    )


def device_samples(
    spec: DatasetSpec,
    data: DataConfig,
    device_id: str,
    seed: int,
    offsets: Mapping[str, int] | None,
    data_device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples and labels DEVICE_ID trains on, on DATA_DEVICE. A source read per user (StackOverflow, natural
    partition only) gives the device's user's samples, built on first use; any other source is indexed by the
    device's cached sample indices."""
    users = load_dataset(spec).users
    if data.partition == "natural" and users is not None and users.lazy is not None:
        user = partition.natural_user(device_id, seed, users.count, offsets)
        x, y = (torch.from_numpy(a).to(data_device) for a in users.lazy.arrays(user))
        return x, y
    pairs = tuple(sorted(offsets.items())) if offsets else None
    indices = cached_device_indices(
        spec, device_id, data.subset_size, data.dirichlet_alpha, seed, data.partition, pairs
    )
    on_device = dataset_on(spec, str(data_device))
    idx = torch.from_numpy(indices).to(data_device)
    return on_device.x_train.index_select(0, idx), on_device.y_train.index_select(0, idx)

"""How much a device trains per task: its steps, its batches and the samples it processes, from its own data size.

Two units of local work (``processors.training_config.TrainingConfig``):

* ``--local-iters T`` (the default): exactly T steps of ``min(batch, n)`` samples, whatever the device holds
  (epochs of a fresh permutation, each cut into full batches; a tail shorter than a batch is left out and the next
  epoch starts). Every device does the same work.
* ``--local-epochs E``: E passes over the device's own n samples, each a fresh permutation cut into batches of
  ``batch``. **The tail batch is kept** (``ceil(n / batch)`` steps per epoch, the last of ``n mod batch`` samples
  when that is not 0), as LEAF and FedAvg's ``B, E`` define an epoch and as R2's ``DataLoader`` (no
  ``drop_last``) trains: with natural partitions many users hold fewer samples than two batches, and dropping the
  tail would discard a large share of their data (a user with fewer than ``batch`` samples would train nothing).
  ``--local-iters`` still drops it (the FedRevive setting: every device holds the same 350 samples and trains a
  fixed number of full batches; ``docs/fedrevive-differences.md``, the tail batch), which keeps today's schedule
  bit for bit.

So a device's work is a pure function of its sample count n (``processors.data.partition.device_sample_count``:
the length of its index array is the source of truth) and the training settings: ``TrainingConfig.steps`` and
``TrainingConfig.work`` give it, for the engines and the reports; ``device_work`` gives the schedule its ``work``
(``common.delays.DeviceDelays``), a pure function of the seed, the device's key and the data, so the server, a
leaf and ``--dry-run`` time a device alike. With ``--local-iters`` there is none: every device's work is the job's
``task_samples`` and the schedule is today's, bit for bit.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch

from processors.training_config import TrainingConfig


def epoch_schedule(num_samples: int, batch_size: int, epochs: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Positions of each step's batch for ``epochs`` passes over ``num_samples`` samples: per epoch one fresh
    permutation from ``generator``, cut into batches of ``batch_size``, the tail batch kept."""
    batches: list[torch.Tensor] = []
    for _ in range(epochs):
        order = torch.randperm(num_samples, generator=generator)
        batches.extend(order.split(batch_size))
    return batches


def device_work(
    data: dict, training: dict, seed: int, offsets: dict[str, int] | None = None
) -> Callable[[str], float] | None:
    """The samples each device trains on per task, by device key (``DataConfig`` and ``TrainingConfig`` as dicts;
    the dataset is loaded once per process, each device's count computed once); ``None`` with ``--local-iters``
    (every device's work is the same, ``DelayConfig.task_samples``). ``offsets``: a natural partition's global
    device layout (``processors.data.partition.range_offsets``)."""
    from processors.data.config import DataConfig

    t = TrainingConfig(**training)
    if not t.local_epochs:
        return None
    return _DeviceWork(DataConfig(**data), t, seed, offsets)


class _DeviceWork:
    """``device_work``'s function: ``TrainingConfig.work`` of the device's sample count."""

    def __init__(self, data, training, seed: int, offsets: dict[str, int] | None = None):
        self.data, self.training, self.seed, self.offsets = data, training, seed, offsets
        self._lock = threading.Lock()

    @functools.cached_property
    def _labels(self):
        from processors.data.sources import load_dataset

        dataset = load_dataset(self.data.spec(self.seed))
        return dataset.y_train.numpy(), dataset.num_classes, dataset.users  # users: a natural partition's

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one instance per run; its devices' counts are what it keeps
    def __call__(self, device_key: str) -> float:
        from processors.data.partition import device_sample_count

        with self._lock:
            labels, classes, users = self._labels
        d = self.data
        n = device_sample_count(
            labels, device_key, d.subset_size, d.dirichlet_alpha, self.seed, classes, d.partition, users, self.offsets
        )
        return float(self.training.work(n))

"""The vectorised engine's lock-step plan for a group of devices whose batches and step counts differ.

``processors.training_vectorized.train_group`` trains K devices one batched step at a time. Each device's batches
come from its own generator exactly as ``processors.training.train_local`` draws them
(``processors.training.batch_schedule``), so devices differ in

* batch size: a device with fewer than ``local_batch_size`` samples, or an epoch's tail batch
  (``--local-epochs``; ``processors.local_work``);
* step count: with ``--local-epochs`` a device takes ``E x ceil(n / batch)`` steps, so a group of unequal devices
  runs for its longest device's steps.

The plan pads every step to the group's widest batch, with the device's own sample 0 and a zero mask, and pads a
device that has finished with all-masked steps (``active`` false): the engine freezes its parameters, optimiser
state and statistics on those steps, so each device's result is what it would be trained alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from processors import augment as augmentation


@dataclass
class GroupPlan:
    """Attributes:
    index: ``steps x K x batch`` positions into the devices' concatenated samples (pads: the device's sample 0).
    mask: ``steps x K x batch``, 1.0 for a real sample.
    counts: ``steps x K`` real samples of each device's step (1 on a finished device's steps, so no 0 / 0).
    steps: each device's own step count (``K``).
    batch: the group's widest batch.
    offsets, flips: each step's augmentation draws (``--augment`` only; else None).
    """

    index: torch.Tensor
    mask: torch.Tensor
    counts: torch.Tensor
    steps: torch.Tensor
    batch: int
    offsets: torch.Tensor | None = None
    flips: torch.Tensor | None = None

    @property
    def iters(self) -> int:
        return int(self.index.shape[0])

    @property
    def unequal(self) -> bool:
        """Some device finishes before the group's last step (its steps must be frozen)."""
        return bool(len(self.steps)) and int(self.steps.min()) != self.iters

    def active(self, t: int) -> torch.Tensor:
        """The devices still training at step ``t`` (bool, ``K``)."""
        return self.steps > t


def plan_group(
    sizes: list[int], schedules: list[list[torch.Tensor]], generators: list[torch.Generator], augment: bool
) -> GroupPlan:
    """The plan of devices with ``sizes`` samples and ``schedules`` (their ``batch_schedule``s, already drawn from
    ``generators``, which the augmentation draws then advance as ``train_local`` advances them)."""
    k = len(sizes)
    steps = [len(s) for s in schedules]
    iters = max(steps, default=0)
    widths = [len(s[0]) if s else 0 for s in schedules]  # a device's first batch is its widest
    batch = max(widths, default=0)
    index = torch.zeros(iters, k, batch, dtype=torch.int64)
    mask = torch.zeros(iters, k, batch, dtype=torch.float32)
    counts = torch.ones(iters, k, dtype=torch.float32)
    offset = 0
    for i, (n, schedule) in enumerate(zip(sizes, schedules, strict=True)):
        index[:, i, :] = offset
        for t, positions in enumerate(schedule):
            b = len(positions)
            index[t, i, :b] += positions
            mask[t, i, :b] = 1.0
            counts[t, i] = b
        offset += n
    plan = GroupPlan(index, mask, counts, torch.tensor(steps, dtype=torch.int64), batch)
    if augment:  # each device's crops and flips, drawn after its schedule as train_local draws them
        plan.offsets = torch.zeros(iters, k, batch, 2, dtype=torch.int64)
        plan.flips = torch.zeros(iters, k, batch, dtype=torch.bool)
        for i, (s, b, g) in enumerate(zip(steps, widths, generators, strict=True)):
            plan.offsets[:s, i, :b], plan.flips[:s, i, :b] = augmentation.draw(s, b, g)
    return plan


def freeze(tensors: list[torch.Tensor], inactive: torch.Tensor) -> list[torch.Tensor]:
    """The rows of the finished devices (``inactive``: their indices) of stacked per-device ``tensors``, copied
    before a step; ``restore`` puts them back after it."""
    return [t.index_select(0, inactive) for t in tensors]


def restore(tensors: list[torch.Tensor], inactive: torch.Tensor, saved: list[torch.Tensor]) -> None:
    """Undo a step on the finished devices' rows (exactly: their values before the step)."""
    for t, s in zip(tensors, saved, strict=True):
        t.index_copy_(0, inactive, s)

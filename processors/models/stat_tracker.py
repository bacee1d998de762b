"""StatTracker: an identity layer that remembers the per-channel statistics of the data it sees.

The FedRevive reference puts one after every convolution (its ResNet-18 replaces BatchNorm by them): in training
mode it keeps an exponential moving average (momentum 0.1) of its input's per-channel mean and biased variance,
in ``running_mean`` / ``running_var`` buffers, and never changes its input. The buffers travel with the model like
BatchNorm's (``processors.models.statistic_names``), so a client model uploaded to the server carries statistics
of the client's real data: FedRevive's feature-statistics target for synthetic images.

The vectorised engine (``processors.training_vectorized``) trains many devices at once through ``torch.func``,
where a layer cannot update its own buffers in place. Inside ``collecting(trackers, mask)`` a tracker therefore hands its
batch statistics (over the samples the mask marks as real) to the engine, which applies the same moving average
to each device's stacked buffers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn

from processors.precision import widened

_active = threading.local()


class StatTracker(nn.Module):
    """Identity; in training mode, ``running = (1 - momentum) * running + momentum * batch`` for the per-channel
    mean and biased variance of its (N, C, H, W) input. Attributes: momentum."""

    BUFFERS = ("running_mean", "running_var")

    def __init__(self, num_channels: int, momentum: float = 0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(num_channels))
        self.register_buffer("running_var", torch.ones(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            collector = getattr(_active, "collector", None)
            if collector is not None:
                collector.add(self, x)
            else:
                with torch.no_grad():
                    mean, var = batch_moments(x)
                    self.update(self.running_mean, self.running_var, mean, var)
        return x

    def update(
        self, running_mean: torch.Tensor, running_var: torch.Tensor, mean: torch.Tensor, var: torch.Tensor
    ) -> None:
        """The moving-average step, in place (on this tracker's buffers or on a device's stacked copies)."""
        running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
        running_var.mul_(1 - self.momentum).add_(self.momentum * var)


def batch_moments(x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and biased variance of ``x`` (N, C, H, W) over N, H, W; with ``mask`` (N,) of 0/1 over
    the samples it marks only (padding samples of the vectorised engine count for nothing). Taken in float32
    from bfloat16 activations (``--precision bf16``); a float32 or float64 input is used as it is."""
    x = widened(x.detach())
    if mask is None:
        return x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)
    weights = mask.view(-1, 1, 1, 1)
    n = mask.sum() * x.shape[2] * x.shape[3]
    mean = (x * weights).sum(dim=(0, 2, 3)) / n
    var = (((x - mean.view(1, -1, 1, 1)) ** 2) * weights).sum(dim=(0, 2, 3)) / n
    return mean, var


class StatCollector:
    """The batch statistics of each tracker in one forward pass, by tracker name, for the vectorised engine."""

    def __init__(self, tracked: dict[str, StatTracker], mask: torch.Tensor):
        self.names = {tracker: name for name, tracker in tracked.items()}
        self.mask = mask
        self.stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def add(self, tracker: StatTracker, x: torch.Tensor) -> None:
        self.stats[self.names[tracker]] = batch_moments(x, self.mask)


@contextmanager
def collecting(tracked: dict[str, StatTracker], mask: torch.Tensor) -> Iterator[StatCollector]:
    """Within the block, the trackers (``trackers(model)``) report their batch statistics here instead of
    updating their buffers."""
    collector = StatCollector(tracked, mask)
    _active.collector = collector
    try:
        yield collector
    finally:
        _active.collector = None


def trackers(model: nn.Module) -> dict[str, StatTracker]:
    """The model's trackers by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, StatTracker)}


def tracker_buffer_names(tracked: dict[str, StatTracker]) -> list[str]:
    """The state-dict names of these trackers' buffers."""
    return [f"{name}.{buffer}" for name in tracked for buffer in StatTracker.BUFFERS]


def untracked_buffers(model: nn.Module) -> list[str]:
    """Buffers the vectorised engine cannot train (BatchNorm's): every buffer not held by a StatTracker."""
    owned = set(tracker_buffer_names(trackers(model)))
    return [name for name, _ in model.named_buffers() if name not in owned]

"""A run's data in memory, whatever its source (``processors.data.sources`` loads it): a train and a test split
of inputs and int64 labels, the statistics images are standardised with on the fly, and who holds which samples
for a per-user source. Both engines, the evaluator and every per-user reader (``processors.data.leaf``, ``.tff``,
``.hf``, over ``processors.data.formats``) take this form."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from processors.data.spec import CIFAR_MEAN, CIFAR_STD, NUM_CLASSES
from processors.data.users import UserSplit


def elementwise(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Mark ``fn`` (a batch -> the model's input) as working on each element alone, the same way whatever batch
    the element comes in: the vectorised engine may then apply it to a group's samples once, before cutting them
    into batches, instead of to every batch, with the same bits (``processors.training_vectorized``)."""
    fn.elementwise = True
    return fn


@dataclass(frozen=True)
class Dataset:
    """Attributes:
    x_train, x_test: uint8 images N x C x H x W, float32 arrays N x ..., or int64 token ids N x T (a text task).
    y_train, y_test: int64 labels.
    num_classes: labels are 0 .. num_classes - 1.
    mean, std: per-channel statistics images are standardised with (on [0, 1] pixels); None for float inputs and
        token ids.
    users: who holds which samples, for a per-user source (``processors.data.users``); None otherwise.
    dropped: training and test rows left out for holding NaN or inf (``processors.data.finite_rows``).
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int = NUM_CLASSES
    mean: tuple[float, ...] | None = CIFAR_MEAN
    std: tuple[float, ...] | None = CIFAR_STD
    users: UserSplit | None = None
    dropped: tuple[int, int] = (0, 0)

    @property
    def is_text(self) -> bool:
        """Whether the inputs are token ids (int64 N x L): a text task, whose inputs no image step may touch."""
        return self.x_train.dtype == torch.int64

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape, as the model receives it."""
        return tuple(self.x_train.shape[1:])

    def to(self, device: torch.device) -> Dataset:
        moved = (t.to(device) for t in (self.x_train, self.y_train, self.x_test, self.y_test))
        return Dataset(*moved, self.num_classes, self.mean, self.std, self.users, self.dropped)

    @elementwise
    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """A batch as the model receives it: images standardised per channel, float inputs and token ids (int64)
        unchanged."""
        if self.is_text:
            return x
        if self.mean is None:
            return x.float()
        return standardize(x, self.mean, self.std)


@elementwise
def standardize(x_uint8: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 N x C x H x W -> float32, scaled to [0, 1] and standardised per channel."""
    channels = len(mean)
    m = torch.tensor(mean, device=x_uint8.device).view(1, channels, 1, 1)
    s = torch.tensor(std, device=x_uint8.device).view(1, channels, 1, 1)
    # in place on the one new float tensor: the same operations and bits as ``(x / 255 - m) / s``, without two
    # more image-sized allocations (fresh pages cost more than the arithmetic)
    return x_uint8.to(torch.float32, copy=True).div_(255.0).sub_(m).div_(s)


@elementwise
def normalize(x_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 N x 3 x H x W -> float32, standardised with CIFAR-10's statistics (the built-in sources)."""
    return standardize(x_uint8, CIFAR_MEAN, CIFAR_STD)

"""Class-conditional DCGAN-style generator producing 3x32x32 images in CIFAR-normalised space.

As in the reference (R1's ``Generator``, NVIDIA's ``DFKDGenerator``): the class enters additively,
``z + w * e_y``, with the noise ``z`` and the class embeddings ``e`` drawn afresh for every synthesis round and
optimised with the generator's copy (``fedrevive.synthesis``), not kept as generator parameters; the output is a
sigmoid pixel image in [0, 1], here standardised with the CIFAR statistics (the reference normalises right after,
in its augmentation).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from processors.data.sources import CIFAR_MEAN, CIFAR_STD


class ConditionalGenerator(nn.Module):
    """(noise + class-weight x class embedding) -> 8x8 -> 16x16 -> 32x32 image. ``width`` is the reference's
    ``ngf`` (128): channels at 32x32; twice that at 8x8 and 16x16."""

    def __init__(
        self, noise_dim: int = 256, num_classes: int = 10, width: int = 128, std: tuple[float, ...] | None = None
    ):
        super().__init__()
        self.noise_dim = noise_dim
        self.num_classes = num_classes
        self.width = width
        self.fc = nn.Linear(noise_dim, 2 * width * 8 * 8)
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * width),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.LeakyReLU(0.2),
            nn.Conv2d(width, 3, 3, padding=1),
            nn.Sigmoid(),
        )
        self.register_buffer("mean", torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1))
        # the data's std (``--normalisation``): generated images must be standardised as the devices' are
        self.register_buffer("std", torch.tensor(std or CIFAR_STD).view(1, 3, 1, 1))

    def forward(
        self, z: torch.Tensor, labels: torch.Tensor, class_embeddings: torch.Tensor, class_weight: float = 0.2
    ) -> torch.Tensor:
        h = self.fc(z + class_weight * class_embeddings[labels]).view(z.shape[0], 2 * self.width, 8, 8)
        return (self.body(h) - self.mean) / self.std

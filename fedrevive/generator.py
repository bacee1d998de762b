"""Class-conditional DCGAN-style generator producing 3x32x32 images in CIFAR-normalised space."""

from __future__ import annotations

import torch
import torch.nn as nn

from processors.data.sources import CIFAR_MEAN, CIFAR_STD


class ConditionalGenerator(nn.Module):
    """noise (noise_dim) x class embedding -> 8x8 -> 16x16 -> 32x32 image.

    The tanh output is read as a [0, 1] pixel image and standardised with the CIFAR statistics, so synthetic
    images always lie in the range real normalised images can take.
    """

    def __init__(self, noise_dim: int = 256, num_classes: int = 10, width: int = 64):
        super().__init__()
        self.noise_dim = noise_dim
        self.num_classes = num_classes
        self.embed = nn.Embedding(num_classes, noise_dim)
        self.fc = nn.Linear(noise_dim, 2 * width * 8 * 8)
        self.width = width
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
            nn.Tanh(),
        )
        self.register_buffer("mean", torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(CIFAR_STD).view(1, 3, 1, 1))

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # Multiplicative conditioning: the class embedding gates the noise, one vector per class.
        h = self.fc(z * self.embed(labels)).view(z.shape[0], 2 * self.width, 8, 8)
        pixels = (self.body(h) + 1.0) / 2.0
        return (pixels - self.mean) / self.std

"""Cifar10ConvNet: the small CNN of NVFlare's edge example (62,006 parameters), with a statistic tracker after
each convolution (``StatTracker``: an identity that records its input's per-channel statistics, as in the FedRevive
reference's models; it changes no output and no parameter)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from processors.models.seeding import reset_parameters_seeded
from processors.models.stat_tracker import StatTracker


class Cifar10ConvNet(nn.Module):
    """conv 3->6 k5 s2, conv 6->16 k5 s2, fc 400->120->84->10."""

    def __init__(self, num_classes: int = 10, init_seed: int | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5, stride=2)
        self.conv2 = nn.Conv2d(6, 16, 5, stride=2)
        self.track1 = StatTracker(6)
        self.track2 = StatTracker(16)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)
        if init_seed is not None:
            reset_parameters_seeded(self, init_seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.track1(self.conv1(x)))
        x = F.relu(self.track2(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)

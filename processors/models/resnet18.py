"""ResNet-18 for 32x32 images, as the FedRevive paper trains it, and the BatchNorm variant.

``TrackedResNet18`` (``--model resnet18``) is the references' network (the authors' ``utils/model_utils.py`` and
NVIDIA's port, ``research/fedrevive/model.py``): no normalisation layer at all; a statistic tracker
(``processors.models.stat_tracker.StatTracker``, an identity that records its input's per-channel mean and
variance) after every convolution, the stem's and the 1x1 shortcuts' included, before the ReLU or the residual
sum; convolutions and the classifier without bias; 4x4 average pooling. The trackers give FedRevive the
feature statistics of each client's real data, and the vectorised engine trains them per device.

``CifarResNet18`` (``--model resnet18_bn``) is the common CIFAR ResNet-18 with BatchNorm, for users who want it;
BatchNorm's running statistics need the per-device engine.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from processors.models.seeding import reset_parameters_seeded
from processors.models.stat_tracker import StatTracker

STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (width, stride) of the four stages of two blocks each


class TrackedBlock(nn.Module):
    """Two 3x3 convolutions, each followed by a tracker, with an identity or (1x1 convolution, tracker) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.track1 = StatTracker(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.track2 = StatTracker(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), StatTracker(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.track1(self.conv1(x)))
        out = self.track2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class TrackedResNet18(nn.Module):
    """The FedRevive references' ResNet-18 (see the module docstring): 11.2M parameters for 10 classes."""

    def __init__(self, num_classes: int = 10, init_seed: int | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.track1 = StatTracker(64)
        layers, in_planes = [], 64
        for planes, stride in STAGES:
            layers.append(nn.Sequential(TrackedBlock(in_planes, planes, stride), TrackedBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.linear = nn.Linear(512, num_classes, bias=False)
        if init_seed is not None:
            reset_parameters_seeded(self, init_seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.track1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.avg_pool2d(out, 4).flatten(1)
        return self.linear(out)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet18(nn.Module):
    """ResNet-18 with BatchNorm for 32x32 inputs: 3x3 conv stem (no max-pool), BasicBlock stages [2, 2, 2, 2] of
    width 64-128-256-512, global average pooling and a linear classifier (11.2M parameters for 10 classes)."""

    def __init__(self, num_classes: int = 10, init_seed: int | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers = []
        in_planes = 64
        for planes, stride in STAGES:
            layers.append(nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.linear = nn.Linear(512, num_classes)
        if init_seed is not None:
            reset_parameters_seeded(self, init_seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)

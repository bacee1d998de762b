"""Model zoo: the networks simulated devices train, built by name."""

from __future__ import annotations

import torch.nn as nn

from processors.models.cifar10_convnet import Cifar10ConvNet
from processors.models.resnet18 import CifarResNet18

MODEL_CLASSES = {"cifar10_convnet": Cifar10ConvNet, "resnet18": CifarResNet18}


def model_class_path(name: str) -> str:
    """Dotted class path of a model, as NVFlare job configs reference it."""
    cls = MODEL_CLASSES[name]
    return f"{cls.__module__}.{cls.__qualname__}"


def build_model(name: str) -> nn.Module:
    if name not in MODEL_CLASSES:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODEL_CLASSES)}")
    return MODEL_CLASSES[name]()

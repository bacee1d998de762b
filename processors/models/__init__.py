"""Model zoo: the networks simulated devices train, by name, or any ``nn.Module`` class by import path.

A built-in name (``cifar10_convnet``, ``resnet18``) or ``package.module:ClassName``: a class whose constructor
takes no required arguments (an optional ``init_seed`` keyword makes the initial global model depend on the run
seed only, as the built-in models do).
"""

from __future__ import annotations

import importlib
import inspect

import torch.nn as nn

from processors.models.cifar10_convnet import Cifar10ConvNet
from processors.models.resnet18 import CifarResNet18

MODEL_CLASSES: dict[str, type[nn.Module]] = {"cifar10_convnet": Cifar10ConvNet, "resnet18": CifarResNet18}


def model_class(name: str) -> type[nn.Module]:
    """The class a model name stands for; ``ValueError`` naming the fix otherwise."""
    if name in MODEL_CLASSES:
        return MODEL_CLASSES[name]
    if ":" not in name:
        raise ValueError(f"--model {name!r}: use {', '.join(MODEL_CLASSES)} or an import path package.module:Class")
    module_name, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as ex:
        raise ValueError(f"--model {name!r}: cannot import {attr} from {module_name} ({ex})") from ex
    if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
        raise ValueError(f"--model {name!r}: {attr} is not a torch.nn.Module subclass")
    return cls


def model_class_path(name: str) -> str:
    """Dotted class path of a model, as NVFlare job configs reference it."""
    cls = model_class(name)
    return f"{cls.__module__}.{cls.__qualname__}"


def model_init_args(name: str, seed: int) -> dict:
    """Constructor arguments of the initial global model: ``init_seed`` when the class accepts it."""
    return {"init_seed": seed} if "init_seed" in inspect.signature(model_class(name)).parameters else {}


def build_model(name: str) -> nn.Module:
    return model_class(name)()

"""Model zoo: the networks simulated devices train, by name, or any ``nn.Module`` class by import path.

A built-in name (``cifar10_convnet``, ``resnet18``, ``resnet18_bn``, ``femnist_cnn``, ``char_lstm``,
``word_lstm``; what each is, its local-training preset and the model ``--model auto`` picks for a dataset:
``processors.model_names``) or ``package.module:ClassName``: a class whose constructor takes no required arguments. The initial global model depends on the run seed only: a class with an ``init_seed``
keyword (the built-in models) gets the seed; any other class is built with torch's generator seeded
(``SeededModel``), so its weights are the same in every run whatever ran before in the server process.
"""

from __future__ import annotations

import importlib
import inspect

import torch
import torch.nn as nn

from processors.model_names import AUTO, BUILT_IN_MODELS, check_model_name
from processors.models.char_lstm import CharLSTM
from processors.models.cifar10_convnet import Cifar10ConvNet
from processors.models.femnist_cnn import FemnistCNN
from processors.models.resnet18 import CifarResNet18, TrackedResNet18
from processors.models.word_lstm import WordLSTM

MODEL_CLASSES: dict[str, type[nn.Module]] = {  # keyed by processors.model_names.BUILT_IN_MODELS, in order
    "cifar10_convnet": Cifar10ConvNet,
    "resnet18": TrackedResNet18,  # the FedRevive paper's: statistic trackers, no normalisation
    "resnet18_bn": CifarResNet18,
    "femnist_cnn": FemnistCNN,  # LEAF's FEMNIST CNN: 1 x 28 x 28 images in, 62 logits out
    "char_lstm": CharLSTM,  # LEAF's Shakespeare next-character model: token ids in, 80 logits out
    "word_lstm": WordLSTM,  # TFF's StackOverflow next-word model: 20 word ids in, 10004 logits out
}
if tuple(MODEL_CLASSES) != BUILT_IN_MODELS:  # the config checks names against BUILT_IN_MODELS, torch unimported
    raise ImportError("processors.models.MODEL_CLASSES and processors.model_names.BUILT_IN_MODELS name other models")


def model_class(name: str) -> type[nn.Module]:
    """The class a model name stands for (importing its module); ``ValueError`` naming the fix otherwise."""
    if name in MODEL_CLASSES:
        return MODEL_CLASSES[name]
    if name == AUTO:  # a job's config resolves it (jobs.config.JobConfig): here no dataset says which model
        raise ValueError(f"--model {AUTO} picks the model of the job's --dataset; name a model here")
    check_model_name(name)
    module_name, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as ex:
        raise ValueError(f"--model {name!r}: cannot import {attr} from {module_name} ({ex})") from ex
    if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
        raise ValueError(f"--model {name!r}: {attr} is not a torch.nn.Module subclass")
    return cls


class SeededModel:
    """A user's model class (or a built-in one without ``init_seed``), built with torch's generator seeded (and
    given ``init_seed`` when it takes one). NVFlare builds the initial global
    model from a class path and arguments; this class's constructor returns the user's model itself, so its
    weights and state-dict keys are the user's. Args: model (the model's name), init_seed."""

    def __new__(cls, model: str, init_seed: int = 0) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            return model_class(model)(init_seed=init_seed) if _takes_seed(model) else model_class(model)()


def _takes_seed(name: str) -> bool:
    return "init_seed" in inspect.signature(model_class(name)).parameters


def initial_model_config(name: str, seed: int) -> dict:
    """``{"path", "args"}`` of the run's initial global model, as NVFlare's ``PTModel`` takes it. A user's class
    is always built through ``SeededModel`` (torch's generator seeded), even when it takes ``init_seed``: one that
    takes it but draws from the global generator anyway would otherwise start every run from other weights."""
    if name in MODEL_CLASSES and _takes_seed(name):
        return {"path": model_class_path(name), "args": {"init_seed": seed}}
    return {"path": f"{SeededModel.__module__}.{SeededModel.__qualname__}", "args": {"model": name, "init_seed": seed}}


def initial_model(name: str, seed: int) -> nn.Module:
    """The run's initial global model, built here (the same weights the server builds from ``initial_model_config``)."""
    return model_class(name)(init_seed=seed) if name in MODEL_CLASSES and _takes_seed(name) else SeededModel(name, seed)


def model_class_path(name: str) -> str:
    """Dotted class path of a model, as NVFlare job configs reference it."""
    cls = model_class(name)
    return f"{cls.__module__}.{cls.__qualname__}"


def build_model(name: str) -> nn.Module:
    return model_class(name)()


def statistic_names(model: nn.Module) -> list[str]:
    """Names of the model's data statistics: its floating-point buffers (BatchNorm running mean and variance).

    They travel with the parameters (a device's diff holds both, ``processors.training.train_local``), but the
    server averages them as values instead of stepping along them (``aggregation.buffered_mean``). Integer buffers
    (BatchNorm's ``num_batches_tracked``) are counters, not statistics: they stay out."""
    return [name for name, buf in model.named_buffers() if buf.is_floating_point()]

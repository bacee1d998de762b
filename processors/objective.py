"""The device-side hook of an FL method: an extra term in every device's local loss.

A method that changes local training (FedProx's proximal term, a control-variate correction, a regulariser
towards state the server sends) gives a ``DeviceObjective`` (``jobs.methods.Method.objective``). Each local step
then minimises

    cross_entropy(model(batch), labels) + objective.loss(params, received, extras)

in both engines: the per-device one (``processors.training.train_local``, autograd on the module's parameters)
and the vectorised one (``processors.training_vectorized.train_group``, where ``loss`` runs under
``torch.func.vmap`` on one device's slice of the stacked parameters). So ``loss`` must be a pure function of its
tensors: torch operations only, no in-place changes, no ``.item()``, no Python branches on tensor values.

Extra state sent down with the model: a server strategy's ``device_extras`` (``aggregation.strategy``) names
float32 arrays that travel with each version to the devices (packed with its weights) and reach ``loss`` as
``extras``, on the training device. The diff a device reports covers the model only.
"""

from __future__ import annotations

import torch

from common.imports import import_object

Tensors = dict[str, torch.Tensor]


class DeviceObjective:
    """An extra term of every device's local loss (see the module docstring). Subclass and implement ``loss``;
    constructor keyword arguments come from ``Method.objective_args``."""

    def loss(self, params: Tensors, received: Tensors, extras: Tensors) -> torch.Tensor:
        """The term added to the batch's mean cross-entropy.

        Args:
            params: the device's parameters as it trains (name -> tensor; gradients flow through them).
            received: the global model's parameters the device started from (constants).
            extras: the server's extra state for this version (``ServerStrategy.device_extras``; may be empty).
        """
        raise NotImplementedError


def make_objective(path: str, args: dict | None = None) -> DeviceObjective | None:
    """The objective an import path ``package.module:Class`` names, built with ``args``; ``None`` for ""."""
    if not path:
        return None
    made = import_object(path, "objective")(**(args or {}))
    if not isinstance(made, DeviceObjective):
        raise ValueError(f"objective {path!r}: {type(made).__name__} is not a processors.objective.DeviceObjective")
    return made

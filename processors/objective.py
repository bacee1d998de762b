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

Settings that differ between devices of one group (``batched``): the devices of several runs (a pack's trials,
docs/packs.md) share a vectorised step when their objectives differ only in float settings the term scales by,
FedProx's ``mu``. Such an objective names them in ``batched`` (each a constructor argument kept as the attribute
of the same name, read by ``loss`` as a number or a 0-d tensor alike); the vectorised engine then hands ``loss``,
under ``vmap``, a copy whose attributes are the device's own values (``varied``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import ClassVar

import torch

from common.imports import import_object

Tensors = dict[str, torch.Tensor]


class DeviceObjective:
    """An extra term of every device's local loss (see the module docstring). Subclass and implement ``loss``;
    constructor keyword arguments come from ``Method.objective_args``.

    Attributes:
        batched: the float settings that may differ between the devices of one vectorised group (attributes that
            ``loss`` reads as numbers or 0-d tensors; see the module docstring). Empty: one value per group.
    """

    batched: ClassVar[tuple[str, ...]] = ()

    def loss(self, params: Tensors, received: Tensors, extras: Tensors) -> torch.Tensor:
        """The term added to the batch's mean cross-entropy.

        Args:
            params: the device's parameters as it trains (name -> tensor; gradients flow through them).
            received: the global model's parameters the device started from (constants).
            extras: the server's extra state for this version (``ServerStrategy.device_extras``; may be empty).
        """
        raise NotImplementedError

    def varied(self, values: Mapping[str, torch.Tensor | float]) -> DeviceObjective:
        """A shallow copy of this objective with the ``batched`` settings in ``values`` replaced (one device's
        values: under ``vmap``, its 0-d slices of the group's per-device tensors). The copy's ``loss`` is this
        one's code, so a grouped device computes the term the per-device engine computes with its own values."""
        unknown = sorted(set(values) - set(self.batched))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: {', '.join(unknown)} cannot differ between the devices of one group "
                f"(its batched settings: {', '.join(self.batched) or 'none'})"
            )
        out = copy.copy(self)
        out.__dict__.update(values)
        return out


def make_objective(path: str, args: dict | None = None) -> DeviceObjective | None:
    """The objective an import path ``package.module:Class`` names, built with ``args``; ``None`` for ""."""
    if not path:
        return None
    made = import_object(path, "objective")(**(args or {}))
    if not isinstance(made, DeviceObjective):
        raise ValueError(f"objective {path!r}: {type(made).__name__} is not a processors.objective.DeviceObjective")
    return made

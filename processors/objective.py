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
docs/packs.md) share a vectorised step when their objectives differ only in float settings that ``loss`` reads
as numbers, FedProx's ``mu``. Such an objective names them in ``batched`` (each a constructor argument kept as the attribute
of the same name, read by ``loss`` as a number or a 0-d tensor alike); the vectorised engine then hands ``loss``,
under ``vmap``, a copy whose attributes are the device's own values (``varied``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
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


def group_objective(
    objective: DeviceObjective | None, values: Sequence[Mapping[str, float]] | None, k: int
) -> tuple[DeviceObjective | None, dict[str, torch.Tensor] | None]:
    """For a group of ``k`` devices with each one's ``values`` of the objective's batched settings (None: the
    objective's own): the group's objective (a copy carrying the values every device gives alike; the caller's is
    shared and stays as it is) and a float64 column of each setting that differs between the devices (None when
    none differs: the group then runs the scalar term, the bits of one setting)."""
    if values is None:
        return objective, None
    if objective is None:
        raise ValueError("objective_values given without an objective")
    if len(values) != k:
        raise ValueError(f"{k} devices but {len(values)} objective settings")
    names = set(values[0])
    if any(set(v) != names for v in values):
        raise ValueError("the devices' objective settings name different settings")
    objective.varied(values[0])  # refuses a setting the objective does not batch
    differing = sorted(name for name in names if len({float(v[name]) for v in values}) > 1)
    same = {name: float(values[0][name]) for name in names if name not in differing}
    if same:
        objective = objective.varied(same)
    if not differing:
        return objective, None
    return objective, {name: torch.tensor([float(v[name]) for v in values], dtype=torch.float64) for name in differing}


def make_objective(path: str, args: dict | None = None) -> DeviceObjective | None:
    """The objective an import path ``package.module:Class`` names, built with ``args``; ``None`` for ""."""
    if not path:
        return None
    made = import_object(path, "objective")(**(args or {}))
    if not isinstance(made, DeviceObjective):
        raise ValueError(f"objective {path!r}: {type(made).__name__} is not a processors.objective.DeviceObjective")
    return made

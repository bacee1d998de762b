"""Which devices can share one vectorised step, when they come from runs of different settings (a pack's trials
and seeds, docs/packs.md).

The vectorised engine (``processors.training_vectorized.train_group``) trains a group with one model, one batch
plan and one optimiser, but it takes each device's own local learning rate (``lrs``) and its own values of the
objective's batched settings (``objective_values``, FedProx's ``mu``: ``processors.objective``). So devices whose
settings differ only there share a step; any other difference (the model, batch size, local steps or epochs, the
optimiser or its momentum, augmentation, precision, the objective or its other arguments, the training rule and
its arguments) splits them. ``step_groups`` makes that split and says, in one line per extra group, why it is not
the first one. Torch is not imported: an objective's batched names are read from its class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from common.imports import import_object
from processors.training_config import TrainingConfig

PER_DEVICE_TRAINING = ("local_lr",)  # TrainingConfig's fields a group takes per device


@dataclass(frozen=True)
class DeviceSettings:
    """One device's local settings, as its run gives them.

    Attributes:
        training: the run's local training settings.
        objective: the import path of its method's device hook ("": none; ``Method.objective_path``).
        objective_args: that hook's constructor arguments (``Method.objective_args``).
        rule: the import path of its method's training rule ("": none; ``Method.rule_path``).
        rule_args: that rule's constructor arguments (``Method.rule_args``).
    """

    training: TrainingConfig
    objective: str = ""
    objective_args: Mapping[str, Any] = field(default_factory=dict)
    rule: str = ""
    rule_args: Mapping[str, Any] = field(default_factory=dict)


class StepGroup(NamedTuple):
    """Devices that share one vectorised step, with what ``train_group`` takes per device.

    Attributes:
        devices: their positions in the settings given to ``step_groups``, in order.
        lrs: each one's local learning rate (``train_group``'s ``lrs``).
        objective_values: each one's batched objective settings (``train_group``'s ``objective_values``; None
            without an objective or when it batches nothing).
        reason: why these devices do not share the first group's step, in one line ("" for the first group).
    """

    devices: list[int]
    lrs: list[float]
    objective_values: list[dict[str, float]] | None
    reason: str


def step_groups(settings: Sequence[DeviceSettings]) -> list[StepGroup]:
    """Split devices into the groups that can each share one vectorised step: equal settings except the local
    learning rate and the objective's batched settings. Groups come in the order of their first device."""
    keys: list[tuple] = []
    members: dict[tuple, list[int]] = {}
    for i, s in enumerate(settings):
        key = _shared_key(s)
        if key not in members:
            keys.append(key)
            members[key] = []
        members[key].append(i)
    groups = []
    for key in keys:
        devices = members[key]
        batched = _batched(settings[devices[0]].objective)
        values = [{n: float(settings[i].objective_args[n]) for n in batched} for i in devices] if batched else None
        lrs = [settings[i].training.local_lr for i in devices]
        reason = "" if key is keys[0] else _split_reason(keys[0], key)
        groups.append(StepGroup(devices, lrs, values, reason))
    return groups


def _batched(objective: str) -> tuple[str, ...]:
    """The settings the objective ``objective`` names may differ per device (``DeviceObjective.batched``)."""
    return tuple(getattr(import_object(objective, "objective"), "batched", ())) if objective else ()


def _shared_key(s: DeviceSettings) -> tuple:
    """What devices must have equal to share a step, as (name, value) pairs (values made hashable)."""
    training = tuple((k, v) for k, v in s.training.to_dict().items() if k not in PER_DEVICE_TRAINING)
    batched = _batched(s.objective)
    objective_args = tuple(sorted((k, repr(v)) for k, v in s.objective_args.items() if k not in batched))
    rule_args = tuple(sorted((k, repr(v)) for k, v in s.rule_args.items()))
    return (
        *training,
        ("objective", s.objective),
        ("objective_args", objective_args),
        ("rule", s.rule),
        ("rule_args", rule_args),
    )


def _split_reason(first: tuple, other: tuple) -> str:
    """One line: the settings in which ``other`` differs from ``first``, and why that splits them."""
    differences = [
        f"{name} {value!r} (not {dict(first)[name]!r})" for name, value in other if dict(first)[name] != value
    ]
    return (
        f"{', '.join(differences)}: only the local learning rate and an objective's batched settings may differ "
        "within one vectorised step"
    )

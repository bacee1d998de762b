"""A leaf's vectorised groups, a run's own or a pack's cross-run ones: devices of one run or of several
(``docs/packs.md``) trained in one call of the engine (``train_runs``, the one place that calls it for a group).

Each run of a pack has its own ``TrainingTaskProcessor`` (its data, seed, objective, rules, compression, privacy).
Devices of runs whose settings can share a step (``processors.step_groups``) train together: each run's processor
prepares its own devices (``prepare_group``: its data and generators, start weights converted from its OWN run's
versions, keyed by that processor, since the runs number their versions alike), the engine's ``train_group`` runs
once with each device's learning rate and batched objective settings, and each run gets its devices' diffs back
for its own finishing steps (``finish_group``: the rule's finish, privatisation, compression, reports). A device's
diff equals its own run's group's up to floating-point summation order (the engine's stated tolerance).

``step_classes`` says which runs share: runs of equal step settings, no training rule (its state is one run's and
its hooks one object), the same privacy switch (it sets the compute context) and the same dataset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from processors.step_groups import DeviceSettings, step_groups
from processors.training_vectorized import train_group


def _settings(trainer: Any) -> DeviceSettings | None:
    """A trainer's step settings, or None when it cannot train beside another run (not ours, or with a rule)."""
    if not hasattr(trainer, "prepare_group") or getattr(trainer, "rule", ""):
        return None
    return DeviceSettings(trainer.resolved_training, trainer.objective, trainer.objective_args)


def step_classes(trainers: Mapping[int, Any]) -> dict[int, int]:
    """run -> the lowest run whose devices share its step (itself when none does): runs of one class train in one
    vectorised call (``train_runs``)."""
    runs = sorted(trainers)
    classes = {run: run for run in runs}
    shareable = [run for run in runs if _settings(trainers[run]) is not None]
    by_kind: dict[tuple, list[int]] = {}
    for run in shareable:
        t = trainers[run]
        by_kind.setdefault((t.dataset, t.privacy is not None, t.profile), []).append(run)
    for members in by_kind.values():
        for group in step_groups([_settings(trainers[run]) for run in members]):
            first = members[group.devices[0]]
            for i in group.devices:
                classes[members[i]] = first
    return classes


def train_runs(
    parts: Sequence[tuple[Any, list[str], list[dict] | dict, list[int] | int, list[int] | None]],
) -> list[list[dict[str, np.ndarray]]]:
    """Train the devices of ``parts`` (each: its run's processor, device ids, each device's weights or one for all,
    each one's version or one for all, its selection ids or None) in one vectorised call; each part's diffs,
    finished by its own processor, in order. The one call to the engine for a leaf's groups: one part is a run's own
    group (``TrainingTaskProcessor.train_group``, its rule included); several are a pack's cross-run group, whose
    runs must be of one ``step_classes`` class (no rule; each device at its run's learning rate and objective
    values)."""
    first = parts[0][0]
    with first.compute_context():
        groups = [trainer.prepare_group(ids, weights, versions, sel) for trainer, ids, weights, versions, sel in parts]
        norms: list[float] = []
        if len(groups) == 1:  # a run's own group: its weights broadcast when of one version, its rule, its lr
            g = groups[0]
            params, extras, clips, last_steps, rule, lrs, values = (
                g.params, g.extras, g.clips, g.last_steps, g.rule, None, None
            )  # fmt: skip
        else:
            params, extras, clips, last_steps, lrs, values = _merged(parts, groups)
            rule = None
        diffs = train_group(
            first.resolved_training.model,
            params,
            [(x, y) for g in groups for _, x, y, _ in g.prepared],
            first.resolved_training,
            [gen for g in groups for *_, gen in g.prepared],
            groups[0].device,
            first.pinned_streams,
            first.input_prep(),
            first.device_objective,
            extras,
            last_steps,
            rule,
            clips,
            norms,
            lrs,
            values,
        )
        out = []
        at = 0
        for (trainer, *_), g in zip(parts, groups, strict=True):
            k = len(g.device_ids)
            steps = last_steps[at : at + k] if last_steps is not None and g.last_steps is not None else None
            out.append(trainer.finish_group(g, diffs[at : at + k], norms[at : at + k], steps))
            at += k
        return out


def _merged(parts: Sequence[tuple], groups: list) -> tuple:
    """A cross-run group's engine inputs: every device's start weights, extras, clip norm, last-step slot, learning
    rate and batched objective values, in the parts' order."""
    first = parts[0][0]
    sizes = [len(g.device_ids) for g in groups]
    params: list = []
    extras: list = []
    for g, k in zip(groups, sizes, strict=True):
        params += [g.params] * k if isinstance(g.params, dict) else list(g.params)
        extras += [g.extras] * k if isinstance(g.extras, dict) else list(g.extras)
    if len({tuple(sorted(e)) for e in extras}) > 1:
        raise ValueError("the runs' devices carry different extras: they cannot share a step")
    clips = [c for g in groups for c in g.clips] if groups[0].clips is not None else None
    last_steps: list[dict] | None = [] if any(g.last_steps is not None for g in groups) else None
    lrs = [trainer.resolved_training.local_lr for (trainer, *_), k in zip(parts, sizes, strict=True) for _ in range(k)]
    batched = tuple(getattr(first.device_objective, "batched", ())) if first.device_objective is not None else ()
    values = (
        [
            {n: float(trainer.objective_args[n]) for n in batched}
            for (trainer, *_), k in zip(parts, sizes, strict=True)
            for _ in range(k)
        ]
        if batched
        else None
    )
    return params, extras, clips, last_steps, lrs, values

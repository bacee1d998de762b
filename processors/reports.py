"""What a device reports besides its diff: named float32 arrays and scalars a method asks for by name.

A method declares the reports it reads (``jobs.methods.Method.reports``: its strategy's, and its selection
policy's, ``scheduling.selection.SelectionPolicy.needs``); the job's task processor computes only those, in
either engine, and sends them in the device's diff under ``common.protocol.DEVICE_EXTRA_PREFIX``. The server
splits them off: the strategy gets them as ``Update.reports`` (``aggregation.strategy``), the schedule keeps the
scalar ones as what the run knows of each device (``scheduling.selection.DeviceKnowledge``).

The reports (names in ``common.protocol``):

* ``loss``: the loss the device's last local step minimised (its batch's mean cross-entropy plus the method's
  device term), a scalar;
* ``loss_squared``: the mean of that step's squared per-sample cross-entropies (FedScale's ``loss_squared``, from
  which Oort's statistical utility is computed), a scalar;
* ``steps``: local steps taken; ``samples``: samples trained on, counted over the steps (``steps x batch``, or
  ``E x n`` with ``--local-epochs``, tail batches included; ``processors.local_work``);
* ``label_counts``: the device's label histogram, one count per class (FedRevive's true class proportions);
* ``data_size``: the samples the device holds; a method that weights by samples (``jobs.methods.Method.weighting``)
  asks for it, and the device then sends its diff times its data size (``weigh_by_samples``), so a leaf's sum of a
  selection stays the sum of its devices' weighted diffs.

Both engines give the same values up to float summation order: the last step's losses are read from the same
logits the step trains on (no extra forward pass), so asking for them changes no trained bit.
"""

from __future__ import annotations

import numpy as np
import torch

from common.protocol import (
    DATA_SIZE,
    DEVICE_EXTRA_PREFIX,
    DEVICE_REPORTS,
    LABEL_COUNTS,
    LOSS,
    LOSS_SQUARED,
    SAMPLES,
    STEPS,
)

LAST_STEP = (LOSS, LOSS_SQUARED)  # what an engine measures on its last step (``last_step`` of the engines)


def check_reports(names) -> tuple[str, ...]:
    """``names`` as a sorted tuple without repeats; ``ValueError`` naming the known reports for an unknown one."""
    unknown = sorted(set(names) - set(DEVICE_REPORTS))
    if unknown:
        raise ValueError(f"unknown device reports {unknown}: a device can report {', '.join(DEVICE_REPORTS)}")
    return tuple(sorted(set(names)))


def last_step_losses(logits: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """The last step's reports from its logits and the loss it minimised (no gradient; one device)."""
    with torch.no_grad():
        per_sample = torch.nn.functional.cross_entropy(logits.detach(), labels, reduction="none")
        return {LOSS: loss.detach(), LOSS_SQUARED: (per_sample**2).mean()}


def with_reports(
    diff: dict[str, np.ndarray],
    names: tuple[str, ...],
    labels: torch.Tensor,
    num_classes: int,
    steps: int,
    batch: int,
    last_step: dict[str, torch.Tensor] | None,
    samples: int | None = None,
) -> dict[str, np.ndarray]:
    """``diff`` with the reports ``names`` under ``DEVICE_EXTRA_PREFIX`` (``labels``: the device's own labels;
    ``batch``: its batch size, ``min(local_batch_size, samples)``; ``last_step``: what its engine measured;
    ``samples``: the samples it trained on when not ``steps x batch``, with ``--local-epochs``)."""
    for name in names:
        if name == LABEL_COUNTS:
            value = torch.bincount(labels.cpu(), minlength=num_classes).numpy().astype(np.float32)
        elif name == STEPS:
            value = np.float32(steps)
        elif name == SAMPLES:
            value = np.float32(steps * batch if samples is None else samples)
        elif name == DATA_SIZE:
            value = np.float32(len(labels))
        else:
            if last_step is None or name not in last_step:
                raise ValueError(f"report {name!r} needs the engine's last step, which was not measured")
            value = last_step[name].detach().cpu().numpy().astype(np.float32)
        diff[DEVICE_EXTRA_PREFIX + name] = np.asarray(value, dtype=np.float32)
    return diff


def weigh_by_samples(diff: dict[str, np.ndarray], data_size: int) -> dict[str, np.ndarray]:
    """A device's diff (parameters and statistics, not its reports) times its ``data_size``, for a method that
    weights by samples: the server divides the sum by the summed ``data_size`` reports
    (``aggregation.buffered_mean``)."""
    w = np.float32(data_size)
    return {k: v if k.startswith(DEVICE_EXTRA_PREFIX) else v * w for k, v in diff.items()}

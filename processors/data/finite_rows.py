"""Rows of a dataset that hold NaN or inf: refused before a run starts, or dropped when the user asks.

One such row in a device's batch makes its loss, its update and (through the mean) the released model NaN; no
clip bounds it. So every source's float inputs are checked as they load, in every process alike
(``processors.data.sources``): the driver refuses the run in one line before NVFlare starts, naming how many rows
and where, or, with ``--dataset-nonfinite drop``, every process drops the same rows and the driver says how many.
Images (uint8) and token ids (int64) cannot hold NaN. A per-user source's rows are not dropped: its offsets say
whose each sample is, and the file is the place to clean.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from processors.data.dataset import Dataset
from processors.data.spec import NONFINITE_POLICIES, DatasetError


def _bad_rows(x: torch.Tensor) -> torch.Tensor:
    """A bool per row: whether it holds a NaN or an infinity."""
    return ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)


def finite_rows(data: Dataset, policy: str, where: str) -> Dataset:
    """``data`` when every float input is finite; else refused (``policy`` "refuse": a ``DatasetError`` naming the
    rows) or without those rows (``policy`` "drop": ``Dataset.dropped`` says how many)."""
    if policy not in NONFINITE_POLICIES:
        raise DatasetError(f"--dataset-nonfinite {policy!r}: use {' or '.join(NONFINITE_POLICIES)}")
    if not data.x_train.is_floating_point() or data.x_train.shape[0] == 0:
        return data
    bad_train, bad_test = _bad_rows(data.x_train), _bad_rows(data.x_test)
    n_train, n_test = int(bad_train.sum()), int(bad_test.sum())
    if not n_train and not n_test:
        return data
    counts = (
        f"{n_train} of {data.x_train.shape[0]} training rows and {n_test} of {data.x_test.shape[0]} test rows hold "
        "NaN or inf"
    )
    if policy == "refuse" or data.users is not None:
        split, bad = ("x_train", bad_train) if n_train else ("x_test", bad_test)
        first = int(torch.nonzero(bad)[0])
        fix = (
            "clean them in the source (a per-user dataset's rows are not dropped)"
            if data.users is not None
            else "clean them, or pass --dataset-nonfinite drop to leave them out"
        )
        raise DatasetError(f"{where}: {counts} (the first: {split} row {first}); {fix}")
    keep_train, keep_test = ~bad_train, ~bad_test
    if not keep_train.any() or not keep_test.any():
        raise DatasetError(f"{where}: {counts}: no row of a split would be left")
    return replace(
        data,
        x_train=data.x_train[keep_train],
        y_train=data.y_train[keep_train],
        x_test=data.x_test[keep_test],
        y_test=data.y_test[keep_test],
        dropped=(n_train, n_test),
    )

"""Non-finite data and updates, as a user or a broken device would bring them (``common.finite``).

``poisoned`` is issue 56's repro: 16 float features, three classes, 2,500 training rows, NaN in one feature of 25
of them; ``clean`` is the same set without those NaNs. ``Mlp`` is the small model both are trained with.
``NaNDeviceTrainer`` is the job's own task processor whose one device (``NAN_DEVICE``) returns NaN in its diff,
in either engine, as a device with a numerical bug would."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from processors.task_processor import TrainingTaskProcessor

NAN_ROWS = 25  # training rows with a NaN feature
NAN_DEVICE = "site-1#1"  # the one device whose every diff holds NaN (the first leaf's second device)


def _blobs(seed: int) -> dict[str, np.ndarray]:
    """Three separable Gaussian classes in 16 features: 2,500 training and 500 test rows."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 2.0, size=(3, 16))
    out = {}
    for split, n in (("train", 2500), ("test", 500)):
        y = rng.integers(0, 3, size=n)
        out[f"x_{split}"] = (centres[y] + rng.normal(0.0, 1.0, size=(n, 16))).astype(np.float32)
        out[f"y_{split}"] = y.astype(np.int64)
    return out


def clean() -> dict[str, np.ndarray]:
    return _blobs(7)


def poisoned() -> dict[str, np.ndarray]:
    data = _blobs(7)
    rows = np.random.default_rng(8).choice(2500, size=NAN_ROWS, replace=False)
    data["x_train"][rows, 3] = np.nan
    return data


class Mlp(nn.Module):
    def __init__(self, init_seed=None):  # taken and ignored: the project seeds the initial weights anyway
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class NaNDeviceTrainer(TrainingTaskProcessor):
    """Trains every device as the job's own processor does, then puts NaN into ``NAN_DEVICE``'s diff (its first
    entry) and an infinity into its second. Plugged in through the engine's ``trainer`` option."""

    def _poison(self, device_ids: list[str], diffs: list[dict]) -> list[dict]:
        for device, diff in zip(device_ids, diffs, strict=True):
            if device == NAN_DEVICE:
                first, second = list(diff)[:2]
                diff[first] = np.full_like(diff[first], np.nan)
                diff[second] = diff[second] + np.float32(np.inf)
        return diffs

    def train(self, device_id: str, model_data: dict, version: int, selection: int | None = None):
        return self._poison([device_id], [super().train(device_id, model_data, version, selection)])[0]

    def train_group(self, device_ids: list[str], model_data, version, selections: list[int] | None = None):
        return self._poison(device_ids, super().train_group(device_ids, model_data, version, selections))

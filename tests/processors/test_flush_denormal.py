"""``--flush-denormal auto|on|off``: while a device trains on the CPU, its thread takes and makes float32 denormals as
zero (``on``, or ``auto`` in a run with DP), and keeps them again once the task ends; otherwise the thread is left
as it is. Checked through the task processor, in both engines, by a denormal multiplied inside the training
call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import processors.pack_trainer as pack_trainer
import processors.task_processor as tp
from common.privacy import CLIP_NORM
from common.protocol import DEVICE_EXTRA_PREFIX
from processors.models import initial_model
from tests.conftest import make_processor

DENORMAL = 1e-40  # below float32's smallest normal number, about 1.2e-38


def survives() -> bool:
    """Whether this thread keeps a denormal through a multiplication (flushed: it becomes zero)."""
    return (torch.tensor([DENORMAL], dtype=torch.float32) * 1.0).item() != 0.0


@pytest.fixture
def seen(monkeypatch) -> list[bool]:
    """What ``survives`` said inside each training call of the task processor's engines."""
    found: list[bool] = []
    for module, name in ((tp, "train_local"), (pack_trainer, "train_group")):  # the vectorised engine's one caller
        real = getattr(module, name)

        def spy(*args, _real=real, **kwargs):
            found.append(survives())
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return found


DP = {"dp": "central"}  # PrivacyConfig.device_settings of a central-DP run


@pytest.mark.parametrize(
    ("setting", "private", "flush"),
    [("on", False, True), ("off", False, False), ("auto", False, False), ("auto", True, True), ("off", True, False)],
)
def test_a_task_flushes_denormals_as_its_setting_says_and_only_while_it_trains(seen, setting, private, flush):
    if not survives():
        pytest.skip("this thread already flushes denormals")
    weights = {k: v.numpy().copy() for k, v in initial_model("cifar10_convnet", 0).state_dict().items()}
    if private:  # a DP server's version carries its clip norm for the devices
        weights[DEVICE_EXTRA_PREFIX + CLIP_NORM] = np.array([1.0], np.float32)
    processor = make_processor(local_iters=1, local_batch_size=8, flush_denormal=setting)
    processor.privacy = DP if private else None
    processor.train("site-1#0", weights, version=1)
    processor.train_group(["site-1#1", "site-1#2"], weights, version=1)
    assert seen == [not flush, not flush]  # per-device engine, then the vectorised one
    assert survives()  # the thread keeps denormals again after the task

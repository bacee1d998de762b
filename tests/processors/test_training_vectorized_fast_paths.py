"""The vectorised engine's bit-preserving fast paths (issue 34): a group's samples standardised once instead of
every batch, and image batches gathered sample-major (a view into the grouped convolution's input, not a copy).
Each must give exactly the bits of the path it replaces; the engine's agreement with per-device training (within
tolerance) is tested in test_training_vectorized.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processors import training_vectorized
from processors.data.sources import CIFAR_MEAN, CIFAR_STD, make_synthetic, normalize, standardize
from processors.models import build_model
from processors.training import TrainingConfig
from processors.training_vectorized import train_group

MODEL = "cifar10_convnet"
CPU = torch.device("cpu")
CONFIGS = {
    "sgd batch 10": TrainingConfig(local_iters=5, local_batch_size=10, local_lr=0.1, optimizer="sgd"),
    "adam, unequal epochs": TrainingConfig(local_epochs=2, local_batch_size=16),
    "augmented": TrainingConfig(local_iters=3, local_batch_size=16, local_lr=0.05, optimizer="sgd", augment=True),
}


@pytest.fixture(scope="module")
def data():
    dataset = make_synthetic(300, 100, seed=5)
    out, start = [], 0
    for n in (50, 7, 50, 33):
        out.append((dataset.x_train[start : start + n], dataset.y_train[start : start + n]))
        start += n
    return out


@pytest.fixture(scope="module")
def global_params():
    torch.manual_seed(3)
    return {name: p.detach().clone() for name, p in build_model(MODEL).state_dict().items()}


def _train(global_params, data, cfg, prepare=normalize):
    generators = [torch.Generator().manual_seed(20 + i) for i in range(len(data))]
    last: list = []
    diffs = train_group(MODEL, global_params, data, cfg, generators, CPU, prepare=prepare, last_step=last)
    return diffs, last


def _assert_same_bits(a, b):
    (diffs_a, last_a), (diffs_b, last_b) = a, b
    for da, db in zip(diffs_a, diffs_b, strict=True):
        assert da.keys() == db.keys()
        for name in da:
            np.testing.assert_array_equal(da[name], db[name], err_msg=name)
    for la, lb in zip(last_a, last_b, strict=True):
        for name in la:
            assert torch.equal(la[name], lb[name]), name
    assert max(float(np.abs(d).max()) for d in diffs_a[0].values()) > 1e-4  # it trained


@pytest.mark.parametrize("name", list(CONFIGS))
def test_standardising_once_per_group_gives_the_bits_of_standardising_each_batch(global_params, data, name):
    cfg = CONFIGS[name]
    calls = {"marked": 0, "plain": 0}

    def marked(x):
        calls["marked"] += 1
        return normalize(x)

    marked.elementwise = True

    def plain(x):  # not marked elementwise: the engine must prepare each batch
        calls["plain"] += 1
        return normalize(x)

    _assert_same_bits(_train(global_params, data, cfg, marked), _train(global_params, data, cfg, plain))
    steps = max(cfg.steps(len(y)) for _, y in data)
    assert calls["plain"] == steps
    # once for the group, unless crops pad the stored images (each augmented batch is prepared)
    assert calls["marked"] == (steps if cfg.augment else 1)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sample_major_batches_give_the_bits_of_device_major_batches(global_params, data, name, monkeypatch):
    sample_major = _train(global_params, data, CONFIGS[name])
    monkeypatch.setattr(training_vectorized, "SAMPLE_MAJOR", False)
    _assert_same_bits(sample_major, _train(global_params, data, CONFIGS[name]))


def test_a_group_of_different_versions_keeps_its_bits_sample_major(global_params, data, monkeypatch):
    other = {name: p + 0.01 for name, p in global_params.items()}
    starts = [global_params, other, global_params, other]
    cfg = CONFIGS["sgd batch 10"]
    sample_major = _train(starts, data, cfg)
    monkeypatch.setattr(training_vectorized, "SAMPLE_MAJOR", False)
    _assert_same_bits(sample_major, _train(starts, data, cfg))


def test_standardize_in_place_gives_the_bits_of_the_plain_formula():
    x = torch.randint(0, 256, (7, 3, 32, 32), dtype=torch.uint8)
    m = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    s = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    assert torch.equal(standardize(x, CIFAR_MEAN, CIFAR_STD), (x.float().div_(255.0) - m) / s)
    assert x.dtype == torch.uint8  # the stored images are not touched

"""Dataset sources: a user's .npz is validated with clear errors; synthetic data is seeded and learnable."""

import numpy as np
import pytest
import torch

from common.choices import ConfigError
from processors.data.config import DataConfig
from processors.data.sources import DatasetError, DatasetSpec, load_cifar10, load_npz, make_synthetic


def _write(tmp_path, **arrays):
    good = {
        "x_train": np.zeros((20, 32, 32, 3), np.uint8),
        "y_train": np.arange(20) % 10,
        "x_test": np.zeros((10, 3, 32, 32), np.uint8),
        "y_test": np.arange(10),
    }
    good.update(arrays)
    good = {k: v for k, v in good.items() if v is not None}
    path = tmp_path / "data.npz"
    np.savez(path, **good)
    return str(path)


def test_valid_npz_loads_in_channels_first_layout(tmp_path):
    data = load_npz(_write(tmp_path))
    assert tuple(data.x_train.shape) == (20, 3, 32, 32) and tuple(data.x_test.shape) == (10, 3, 32, 32)


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"y_test": None}, "missing arrays \\['y_test'\\]"),
        ({"x_train": np.zeros((20, 28, 28), np.uint8)}, "samples must have one shape and type"),
        ({"x_train": np.zeros((20, 32, 32, 3), np.float32)}, "samples must have one shape and type"),
        ({"x_train": np.zeros((20, 5, 8, 8), np.uint8), "x_test": np.zeros((10, 5, 8, 8), np.uint8)}, "C = 1 or 3"),
        (
            {"x_train": np.zeros((20, 32, 32, 3), np.int32)},
            r"integer inputs are token ids, N x L and >= 0 \(images: uint8\)",
        ),
        ({"y_test": np.arange(10) + 20}, "label 29, which y_train never has"),
        ({"y_train": -np.arange(20)}, "negative labels"),
        ({"y_train": np.arange(19)}, "expected \\(20,\\)"),
        ({"y_train": np.linspace(0, 1, 20)}, "integer labels"),
    ],
)
def test_malformed_npz_gets_a_clear_error(tmp_path, arrays, message):
    with pytest.raises(DatasetError, match=message):
        load_npz(_write(tmp_path, **arrays))


def test_grayscale_images_and_float_features_load_with_their_own_classes_and_statistics(tmp_path):
    rng = np.random.default_rng(0)
    gray = load_npz(
        _write(
            tmp_path,
            x_train=rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
            y_train=np.arange(20) % 4,
            x_test=rng.integers(0, 256, (10, 28, 28, 1), dtype=np.uint8),
            y_test=np.arange(10) % 4,
        )
    )
    assert gray.input_shape == (1, 28, 28) and gray.num_classes == 4 and len(gray.mean) == 1
    x = gray.prepare(gray.x_train)
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-2  # standardised with its own statistics
    features = load_npz(
        _write(
            tmp_path,
            x_train=rng.normal(size=(20, 7)).astype(np.float64),
            y_train=np.arange(20) % 3,
            x_test=rng.normal(size=(10, 7)),
            y_test=np.arange(10) % 3,
        )
    )
    assert features.input_shape == (7,) and features.num_classes == 3 and features.mean is None
    assert features.prepare(features.x_test).dtype.is_floating_point


def test_npz_with_pickled_objects_is_refused(tmp_path):
    path = _write(tmp_path, y_train=np.array([object()] * 20, dtype=object))
    with pytest.raises(DatasetError):
        load_npz(path)


def test_missing_cifar10_names_the_data_root_and_synthetic(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_cifar10(str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in str(err.value) and "--dataset synthetic" in str(err.value)


def test_synthetic_data_is_seeded():
    a, b, c = make_synthetic(200, 100, 1), make_synthetic(200, 100, 1), make_synthetic(200, 100, 2)
    assert a.x_train.equal(b.x_train) and not a.x_train.equal(c.x_train)


def test_unknown_dataset_name_is_refused():
    with pytest.raises(DatasetError, match="use cifar10, synthetic"):
        _ = DatasetSpec("imagenet").kind


def test_the_easy_synthetic_data_keeps_the_bits_of_earlier_runs():
    import hashlib

    data = make_synthetic(200, 100, 0)  # difficulty 0, the default
    digest = hashlib.sha256(data.x_train.numpy().tobytes() + data.x_test.numpy().tobytes()).hexdigest()
    assert digest == "dd23add953f8bde209aa2c0c72ff92aaee38169d8219bb81aacc1dde64ee1b92"  # commit 45e1e05


def test_harder_synthetic_data_brings_the_classes_together():
    def class_spread(difficulty: float) -> float:
        data = make_synthetic(2000, 200, 0, difficulty)
        x = data.x_train.float().flatten(1)
        means = torch.stack([x[data.y_train == c].mean(0) for c in range(10)])
        return (means - means.mean(0)).norm(dim=1).mean().item() / x.std().item()

    assert class_spread(1.0) < 0.5 * class_spread(0.0)
    with pytest.raises(DatasetError, match="synthetic-difficulty"):
        make_synthetic(200, 100, 0, difficulty=1.5)
    with pytest.raises(ConfigError, match="synthetic-difficulty"):
        DataConfig(synthetic_difficulty=-0.1)


def test_references_normalisation_uses_their_std_and_scales_inputs_up():
    from processors.data.sources import CIFAR_MEAN, REFERENCES_STD, load_dataset

    ours = load_dataset(DatasetSpec("synthetic", synthetic_size=200, seed=1))
    theirs = load_dataset(DatasetSpec("synthetic", synthetic_size=200, seed=1, normalisation="references"))
    assert theirs.std == (0.2023, 0.1994, 0.2010) == REFERENCES_STD and theirs.mean == CIFAR_MEAN == ours.mean
    x = ours.x_train[:4]
    assert torch.equal(theirs.x_train, ours.x_train)  # the images are the same; only standardising differs
    # per channel, (x - m) / s_refs = (x - m) / s_ours * s_ours / s_refs
    ratio = theirs.prepare(x) / ours.prepare(x)
    expected = torch.tensor(ours.std) / torch.tensor(REFERENCES_STD)
    for c in range(3):
        finite = ratio[:, c][ours.prepare(x)[:, c].abs() > 1e-3]
        assert torch.allclose(finite, expected[c].expand_as(finite), rtol=1e-4)
    assert expected.tolist() == pytest.approx([1.221, 1.221, 1.301], abs=1e-3)  # ours: 0.82, 0.82, 0.77 of theirs


def test_references_normalisation_is_refused_for_a_users_data(tmp_path):
    path = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (20, 3, 8, 8), dtype=np.uint8)
    np.savez(path, x_train=x, y_train=np.arange(20) % 2, x_test=x, y_test=np.arange(20) % 2)
    from processors.data.sources import load_dataset

    with pytest.raises(DatasetError, match="cifar10 and synthetic only"):
        load_dataset(DatasetSpec(str(path), normalisation="references"))


def test_references_train_split_is_r2s_random_split_train_part():
    from torch.utils.data import random_split

    from processors.data.sources import load_dataset

    full = load_dataset(DatasetSpec("synthetic", synthetic_size=2000, seed=2))
    split = load_dataset(DatasetSpec("synthetic", synthetic_size=2000, seed=2, train_split="references"))
    assert split.x_train.shape[0] == 1500 and torch.equal(split.x_test, full.x_test)
    # R2: random_split(train, [37500, 7500, 5000], generator seed 42); at this size the same fractions
    train, _, _ = random_split(range(2000), [1500, 300, 200], generator=torch.Generator().manual_seed(42))
    assert torch.equal(split.y_train, full.y_train[list(train.indices)])
    assert torch.equal(split.x_train, full.x_train[list(train.indices)])
    # at CIFAR-10's size it is 37,500 images: the same permutation rule
    order = torch.randperm(50000, generator=torch.Generator().manual_seed(42))
    train, _, _ = random_split(range(50000), [37500, 7500, 5000], generator=torch.Generator().manual_seed(42))
    assert order[:37500].tolist() == list(train.indices)


def test_data_config_passes_the_options_to_the_spec():
    spec = DataConfig(normalisation="references", train_split="references").spec(0)
    assert (spec.normalisation, spec.train_split) == ("references", "references")
    assert DataConfig().spec(0) == DatasetSpec(DataConfig().dataset, spec.data_root, 20000, 0, 0.0)

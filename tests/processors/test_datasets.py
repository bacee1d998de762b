"""Dataset sources: a user's .npz is validated with clear errors; synthetic data is seeded and learnable."""

import numpy as np
import pytest

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
        ({"x_train": np.zeros((20, 28, 28), np.uint8)}, "expected N x 32 x 32 x 3"),
        ({"x_train": np.zeros((20, 32, 32, 3), np.float32)}, "must be uint8"),
        ({"y_train": np.arange(20) + 5}, "labels span 5..24"),
        ({"y_train": np.arange(19)}, "expected \\(20,\\)"),
        ({"y_train": np.linspace(0, 1, 20)}, "integer labels"),
    ],
)
def test_malformed_npz_gets_a_clear_error(tmp_path, arrays, message):
    with pytest.raises(DatasetError, match=message):
        load_npz(_write(tmp_path, **arrays))


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

"""Rows holding NaN or inf are refused as the data loads, naming how many and where, or dropped on request, the
same rows in every process (``processors.data.finite_rows``); issue 56's poisoned dataset is the case."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processors.data.config import DataConfig
from processors.data.dataset import Dataset
from processors.data.finite_rows import finite_rows
from processors.data.sources import DatasetError, DatasetSpec, load_dataset
from processors.data.users import UserSplit
from tests.fakes.nonfinite import NAN_ROWS, clean, poisoned

POISONED = "tests.fakes.nonfinite:poisoned"


def test_a_poisoned_loader_is_refused_naming_the_rows_and_the_fix():
    with pytest.raises(DatasetError) as refused:
        load_dataset(DatasetSpec(POISONED))
    first = int(np.flatnonzero(np.isnan(poisoned()["x_train"]).any(axis=1))[0])
    message = str(refused.value)
    assert message.startswith(f"--dataset {POISONED}: {NAN_ROWS} of 2500 training rows and 0 of 500 test rows")
    assert f"(the first: x_train row {first})" in message and "--dataset-nonfinite drop" in message
    assert "\n" not in message


def test_drop_leaves_out_exactly_the_poisoned_rows_and_keeps_every_other_in_order():
    data = load_dataset(DataConfig(dataset=POISONED, dataset_nonfinite="drop").spec(0))
    bad = np.isnan(poisoned()["x_train"]).any(axis=1)
    reference = clean()
    assert data.dropped == (NAN_ROWS, 0) and data.x_train.shape == (2500 - NAN_ROWS, 16)
    assert torch.isfinite(data.x_train).all()
    np.testing.assert_array_equal(data.x_train.numpy(), reference["x_train"][~bad])
    np.testing.assert_array_equal(data.y_train.numpy(), reference["y_train"][~bad])
    np.testing.assert_array_equal(data.x_test.numpy(), reference["x_test"])


def test_an_npz_with_inf_in_its_test_split_is_refused_naming_the_test_rows(tmp_path):
    arrays = clean()
    arrays["x_test"][[4, 9], 0] = [np.inf, -np.inf]
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    with pytest.raises(DatasetError, match=r"0 of 2500 training rows and 2 of 500 test rows .* x_test row 4\)"):
        load_dataset(DatasetSpec(str(path)))
    dropped = load_dataset(DatasetSpec(str(path), nonfinite="drop"))
    assert dropped.dropped == (0, 2) and dropped.x_test.shape[0] == 498


def test_clean_data_and_images_pass_untouched():
    data = load_dataset(DatasetSpec("tests.fakes.nonfinite:clean"))
    assert data.dropped == (0, 0) and data.x_train.shape == (2500, 16)
    images = Dataset(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.zeros(4, dtype=torch.int64), *[None] * 2)
    assert finite_rows(images, "refuse", "here") is images


def test_a_per_user_dataset_is_not_dropped_from_but_refused():
    x = torch.ones(4, 2)
    x[2, 1] = float("nan")
    users = UserSplit(("a", "b"), np.array([0, 2, 4]))
    data = Dataset(
        x, torch.zeros(4, dtype=torch.int64), torch.ones(2, 2), torch.zeros(2, dtype=torch.int64), 2, None, None, users
    )
    with pytest.raises(DatasetError, match=r"1 of 4 training rows .* clean them in the source"):
        finite_rows(data, "drop", "--dataset users.h5")

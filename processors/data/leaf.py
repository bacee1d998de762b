"""LEAF's JSON datasets, FEMNIST and Shakespeare, as LEAF's scripts leave them (docs/datasets.md).

``DATA_ROOT/femnist/data/train/*.json`` and ``.../test/*.json`` (the same under ``shakespeare/``), each file
``{"users": [...], "num_samples": [...], "user_data": {USER: {"x": [...], "y": [...]}}}``:

* FEMNIST: ``x`` is a sample's 784 pixels in [0, 1] (28 x 28, row by row), ``y`` its class 0..61. Kept as uint8
  images N x 1 x 28 x 28 (``round(255 x)``), standardised with the training split's mean and std, as a user's
  ``.npz`` images are; 62 classes.
* Shakespeare: ``x`` is an 80-character string, ``y`` the character after it. Both become ids in LEAF's 80-letter
  alphabet (``processors.data.text.ALL_LETTERS``): int64 token ids N x 80 and int64 labels, 80 classes. int64
  inputs are a text task's token ids: never normalised, never augmented.

Every user of the training files is one user of the natural partition (``processors.data.users``), with its test
samples from the test files (LEAF splits each user's samples, so the test files hold the same users).
"""

from __future__ import annotations

import json

import numpy as np

from processors.data.dataset import Dataset
from processors.data.formats import (
    cached_grouped,
    group_arrays,
    json_files,
    leaf_folders,
    pixels_to_uint8,
    to_dataset,
)
from processors.data.spec import DatasetError
from processors.data.text import SPACE_ID, token_ids

LEAF_FORMAT = 1  # raise whenever the parsed arrays change: older cached parses are not read
NUM_CLASSES = {"femnist": 62, "shakespeare": 80}
FEMNIST_SIDE = 28
SHAKESPEARE_LENGTH = 80


def _femnist(x: list, where: str) -> np.ndarray:
    pixels = np.asarray(x, dtype=np.float32)
    if pixels.ndim != 2 or pixels.shape[1] != FEMNIST_SIDE * FEMNIST_SIDE:
        raise DatasetError(f"{where}: FEMNIST's x must be lists of {FEMNIST_SIDE * FEMNIST_SIDE} pixels")
    return pixels_to_uint8(pixels.reshape(-1, FEMNIST_SIDE, FEMNIST_SIDE))


def _shakespeare(x: list, y: list, where: str) -> tuple[np.ndarray, np.ndarray]:
    if any(len(s) != SHAKESPEARE_LENGTH for s in x) or any(len(c) != 1 for c in y):
        raise DatasetError(f"{where}: Shakespeare's x must be {SHAKESPEARE_LENGTH}-character strings, y single ones")
    ids = token_ids("".join(x), unknown=SPACE_ID).reshape(len(x), SHAKESPEARE_LENGTH)
    return ids, token_ids("".join(y), unknown=SPACE_ID)


def read_split(name: str, paths: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One split's samples from its JSON files: inputs, labels and each sample's user."""
    xs, ys, users = [], [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            user_data = doc["user_data"]
            names = doc.get("users", list(user_data))
        except (OSError, ValueError, KeyError, TypeError) as ex:
            raise DatasetError(f"{path}: not a LEAF JSON file with users and user_data ({ex})") from ex
        for user in names:
            record = user_data.get(user)
            if not record or not record.get("y"):
                continue
            where = f"{path}, user {user}"
            if name == "femnist":
                x, y = _femnist(record["x"], where), np.asarray(record["y"], dtype=np.int64)
            else:
                x, y = _shakespeare(record["x"], record["y"], where)
            if len(x) != len(y):
                raise DatasetError(f"{where}: {len(x)} inputs but {len(y)} labels")
            xs.append(x)
            ys.append(y)
            users.append(np.full(len(y), str(user)))
    if not xs:
        raise DatasetError(f"{paths[0] if paths else name}: the LEAF files hold no samples")
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(users)


def load_leaf(name: str, data_root: str) -> Dataset:
    """LEAF's ``name`` (femnist or shakespeare) under ``data_root``, grouped by user; parsed once per machine."""
    train_folder, test_folder = leaf_folders(name, data_root)
    train_paths, test_paths = json_files(train_folder), json_files(test_folder)
    if not train_paths or not test_paths:
        missing = train_folder if not train_paths else test_folder
        raise DatasetError(f"--dataset {name}: no LEAF .json files in {missing} (docs/datasets.md)")

    def make() -> dict[str, np.ndarray]:
        x_train, y_train, u_train = read_split(name, train_paths)
        x_test, y_test, u_test = read_split(name, test_paths)
        return group_arrays(x_train, y_train, u_train, x_test, y_test, u_test)

    arrays = cached_grouped(data_root, f"leaf-{name}", LEAF_FORMAT, train_paths + test_paths, make)
    return to_dataset(arrays, NUM_CLASSES[name], f"--dataset {name}")

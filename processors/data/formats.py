"""What the per-user formats share: the check that their files are there (before anything starts), grouping
their samples by user into one ``Dataset``, and a per-machine cache of the parsed arrays.

Parsing LEAF's JSON (or an HDF5 file of thousands of clients) takes seconds to minutes, and every process of a run
reads the dataset (the driver's plan, the server's evaluator, each leaf). So the parsed, grouped arrays are stored
once per machine (``processors.data.cache``), keyed by a SHA-256 digest of the source files' paths, sizes and
modification times: a changed file is parsed again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import numpy as np
import torch

from processors.data.cache import cached_arrays
from processors.data.dataset import Dataset
from processors.data.spec import HF_PREFIX, DatasetError, DatasetSpec
from processors.data.stackoverflow import check_word_count, is_stackoverflow
from processors.data.users import UserSplit, group_by_user

GROUPED_KEYS = ("x_train", "y_train", "x_test", "y_test", "names", "train_offsets", "test_offsets")


def leaf_folders(name: str, data_root: str) -> tuple[str, str]:
    """Where LEAF's scripts leave a dataset's splits: ``DATA_ROOT/NAME/data/train`` and ``.../test``."""
    base = os.path.join(os.path.expanduser(data_root), name, "data")
    return os.path.join(base, "train"), os.path.join(base, "test")


def json_files(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json"))


def tff_test_file(train_path: str) -> str:
    """The test file that goes with a TFF train file: ``X_train.h5`` -> ``X_test.h5`` (TFF's own names)."""
    folder, base = os.path.split(train_path)
    if "_train" not in base:
        raise DatasetError(f"--dataset {train_path}: give TFF's training file (its name has _train, e.g. ..._train.h5)")
    return os.path.join(folder, base.replace("_train", "_test"))


def check_files(spec: DatasetSpec) -> None:
    """``DatasetError`` in one line saying where the files go, when a per-user dataset's files are missing."""
    kind = spec.kind
    if kind == "leaf":
        train, test = leaf_folders(spec.name, spec.data_root)
        for folder in (train, test):
            if not json_files(folder):
                raise DatasetError(
                    f"--dataset {spec.name}: no LEAF .json files in {folder}; run LEAF's "
                    f"data/{spec.name}/preprocess.sh and copy its data/train and data/test folders to "
                    f"{os.path.dirname(train)}, or give --data-root where they are (docs/datasets.md)"
                )
    elif kind == "tff":
        for path in (spec.name, tff_test_file(spec.name)):
            if not os.path.isfile(path):
                raise DatasetError(
                    f"--dataset {spec.name}: no file {path}; put TFF's extracted ..._train.h5 and ..._test.h5 "
                    "side by side there (docs/datasets.md)"
                )
        if is_stackoverflow(spec.name):
            check_word_count(spec.name)
    elif kind == "hf":
        path = spec.name[len(HF_PREFIX) :].partition("?")[0]
        if path.startswith((os.sep, ".", "~")) and not os.path.exists(os.path.expanduser(path)):
            raise DatasetError(
                f"--dataset {spec.name}: no such folder {path}; save the dataset there with "
                "datasets' save_to_disk, or name one in the Hugging Face cache (docs/datasets.md)"
            )


def sources_key(paths: list[str], extra: str = "") -> str:
    """A digest of the files' paths, sizes and modification times (and ``extra``: how they were read): the cache
    key of what was parsed from them."""
    digest = hashlib.sha256(extra.encode())
    for path in paths:
        st = os.stat(path)
        digest.update(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def group_arrays(
    x_train: np.ndarray,
    y_train: np.ndarray,
    users_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    users_test: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """The arrays reordered user by user (``processors.data.users.group_by_user``), with the names and offsets."""
    train_order, test_order, split = group_by_user(users_train, users_test)
    arrays = {
        "x_train": x_train[train_order],
        "y_train": y_train[train_order].astype(np.int64),
        "x_test": x_test if test_order is None else x_test[test_order],
        "y_test": (y_test if test_order is None else y_test[test_order]).astype(np.int64),
        "names": np.asarray(split.names, dtype=str),
        "train_offsets": split.train_offsets,
        "test_offsets": split.test_offsets if split.test_offsets is not None else np.zeros(0, np.int64),
    }
    return arrays


def cached_grouped(
    data_root: str,
    kind: str,
    version: int,
    paths: list[str],
    make: Callable[[], dict[str, np.ndarray]],
    extra: str = "",
) -> dict[str, np.ndarray]:
    """``make()``'s grouped arrays, parsed once per machine (the module docstring)."""
    key = {"sources": sources_key(paths, extra)}
    folder = os.path.join(os.path.expanduser(data_root), "parsed")
    return cached_arrays(folder, kind, version, key, make)


def image_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images N x C x H x W on [0, 1] pixels (std at least 1e-3)."""
    channels = x.shape[1]
    pixels = torch.from_numpy(x).float().div_(255.0).transpose(0, 1).reshape(channels, -1)
    return tuple(float(v) for v in pixels.mean(1)), tuple(max(float(v), 1e-3) for v in pixels.std(1))


def to_dataset(arrays: dict[str, np.ndarray], num_classes: int, where: str) -> Dataset:
    """A ``Dataset`` with its users from grouped arrays: uint8 images are standardised with the training split's
    statistics; int64 token ids and float arrays are used as they are."""
    for split in ("train", "test"):
        if len(arrays[f"y_{split}"]) == 0:
            raise DatasetError(f"{where}: the {split} split holds no samples")
    labels = np.concatenate([arrays["y_train"], arrays["y_test"]])
    if labels.min() < 0 or labels.max() >= num_classes:
        raise DatasetError(f"{where}: labels must be 0..{num_classes - 1}, found {labels.min()}..{labels.max()}")
    x_train = np.ascontiguousarray(arrays["x_train"])
    mean = std = None
    if x_train.dtype == np.uint8:
        mean, std = image_stats(x_train)
    test_offsets = arrays["test_offsets"]
    users = UserSplit(
        tuple(str(n) for n in arrays["names"]),
        np.asarray(arrays["train_offsets"], dtype=np.int64),
        np.asarray(test_offsets, dtype=np.int64) if len(test_offsets) else None,
    )
    return Dataset(
        torch.from_numpy(x_train),
        torch.from_numpy(np.ascontiguousarray(arrays["y_train"], dtype=np.int64)),
        torch.from_numpy(np.ascontiguousarray(arrays["x_test"])),
        torch.from_numpy(np.ascontiguousarray(arrays["y_test"], dtype=np.int64)),
        num_classes,
        mean,
        std,
        users,
    )


def pixels_to_uint8(x: np.ndarray) -> np.ndarray:
    """Float pixels in [0, 1] (LEAF's and TFF's EMNIST) as uint8 0..255, rounded; N x H x W becomes N x 1 x H x W."""
    images = np.clip(np.rint(np.asarray(x, dtype=np.float32) * 255.0), 0, 255).astype(np.uint8)
    return images[:, None] if images.ndim == 3 else images

"""A Hugging Face dataset with a user-id column, split by user with Flower Datasets' ``NaturalIdPartitioner``.

``--dataset hf:PATH[?x=COLUMN&y=COLUMN&user=COLUMN]``: ``PATH`` is a folder written by ``save_to_disk`` (a
``Dataset``, or a ``DatasetDict`` with ``train`` and maybe ``test``), or a name ``datasets.load_dataset`` finds
offline in the Hugging Face cache (``HF_DATASETS_OFFLINE=1``: no network is assumed). Columns left out are guessed:
the input from ``image, img, pixels, x``, the label from ``label, character, y, labels``, the user from
``writer_id, character_id, user_id, client_id, user``. The input column may hold images (PIL or arrays: uint8
N x C x H x W, as a ``.npz``'s images), float arrays, or equal-length strings (characters in LEAF's alphabet:
int64 token ids, a text task); a string label is a character's id (80 classes), an integer label is used as it
is (classes from a ``ClassLabel`` feature, else the largest label + 1).

Partitions are Flower's: ``NaturalIdPartitioner`` numbers the users in sorted order of their ids, and user ``u``
of the natural partition (``processors.data.users``) is Flower's partition ``u``. Without a ``test`` split, each
user's last tenth of samples (``n // 10``) is its test data, as LEAF splits per user.

Needs the ``datasets`` extra (``pip install edgesim-flare[datasets]``: ``flwr-datasets`` and ``datasets``).
"""

from __future__ import annotations

import os
from urllib.parse import parse_qsl

import numpy as np

from processors.data.dataset import Dataset
from processors.data.formats import cached_grouped, to_dataset
from processors.data.spec import DatasetError
from processors.data.text import ALL_LETTERS, SPACE_ID, token_ids

HF_FORMAT = 1  # raise whenever the parsed arrays change: older cached parses are not read
GUESSES = {
    "x": ("image", "img", "pixels", "x"),
    "y": ("label", "character", "y", "labels"),
    "user": ("writer_id", "character_id", "user_id", "client_id", "user"),
}
TEST_SHARE = 10  # without a test split, each user's last n // TEST_SHARE samples are its test data


def _columns(query: str, names: list[str], where: str) -> dict[str, str]:
    given = dict(parse_qsl(query))
    unknown = set(given) - set(GUESSES)
    if unknown:
        raise DatasetError(f"{where}: unknown option(s) {sorted(unknown)}; use x=, y= and user= column names")
    columns = {}
    for role, guesses in GUESSES.items():
        column = given.get(role) or next((g for g in guesses if g in names), None)
        if column is None or column not in names:
            raise DatasetError(f"{where}: no {role} column among {names}; name it: hf:PATH?{role}=COLUMN")
        columns[role] = column
    return columns


def _is_text(values) -> bool:
    return len(values) > 0 and isinstance(values[0], str)


def _inputs(values, uint8: bool, where: str) -> np.ndarray:
    """One user's inputs (a numpy-formatted column: an array, or a list of images of their own sizes); ``uint8``:
    the feature is declared uint8 or an image (``datasets``' numpy format hands every integer as int64)."""
    if _is_text(values):
        if len({len(v) for v in values}) != 1:
            raise DatasetError(f"{where}: text inputs must have one length (LEAF's Shakespeare: 80 characters)")
        return token_ids("".join(str(v) for v in values), unknown=SPACE_ID).reshape(len(values), -1)
    x = (
        values
        if isinstance(values, np.ndarray) and values.dtype != object
        else np.stack([np.asarray(v) for v in values])
    )
    if uint8 and np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.uint8)
    if x.dtype == np.uint8:
        if x.ndim == 3:  # N x H x W
            return x[:, None]
        if x.ndim == 4 and x.shape[3] in (1, 3) and x.shape[1] not in (1, 3):
            return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        return x
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32)
    raise DatasetError(f"{where}: inputs must be images, float arrays or strings, got {x.dtype}")


def _labels(values) -> np.ndarray:
    if _is_text(values):
        return token_ids("".join(str(v) for v in values), unknown=SPACE_ID)
    return np.asarray(values, dtype=np.int64)


def _open(path: str, where: str):
    try:
        import datasets
        from flwr_datasets.partitioner import NaturalIdPartitioner
    except ImportError as ex:
        raise DatasetError(f"{where}: needs the datasets extra: pip install 'edgesim-flare[datasets]' ({ex})") from ex
    try:
        if os.path.isdir(path):
            loaded = datasets.load_from_disk(path)
        else:
            loaded = datasets.load_dataset(path)
    except Exception as ex:  # datasets raises FileNotFoundError, ValueError, ConnectionError... by cause
        raise DatasetError(f"{where}: cannot load it ({type(ex).__name__}: {ex})") from ex
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DatasetError(f"{where}: its splits are {list(loaded)}; a train split is needed")
        return loaded["train"], loaded.get("test"), NaturalIdPartitioner
    return loaded, None, NaturalIdPartitioner


def _by_user(split, columns: dict[str, str], partitioner_class, where: str) -> dict[str, tuple]:
    """Each user's (inputs, labels), by Flower's partitions, in their order (sorted user ids)."""
    partitioner = partitioner_class(partition_by=columns["user"])
    partitioner.dataset = split.with_format("numpy")  # columns as arrays, their dtypes kept
    feature = split.features[columns["x"]]
    uint8 = type(feature).__name__ == "Image" or getattr(feature, "dtype", "") == "uint8"
    users = {}
    for pid in range(partitioner.num_partitions):
        part = partitioner.load_partition(pid)[:]  # the partition's columns, as arrays
        name = str(partitioner.partition_id_to_natural_id[pid])
        users[name] = (_inputs(part[columns["x"]], uint8, where), _labels(part[columns["y"]]))
    return users


def _local_files(path: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files)


def load_hf(name: str, data_root: str) -> Dataset:
    """``PATH[?x=..&y=..&user=..]`` (the module docstring), grouped by user; a local folder is parsed once per
    machine (the cache under ``data_root``)."""
    path, _, query = name.partition("?")
    where = f"--dataset hf:{name}"

    def make() -> dict[str, np.ndarray]:
        train, test, partitioner_class = _open(path, where)
        columns = _columns(query, list(train.column_names), where)
        classes = getattr(train.features.get(columns["y"]), "num_classes", None)
        users = _by_user(train, columns, partitioner_class, where)
        tests = _by_user(test, columns, partitioner_class, where) if test is not None else None
        parts = {"x_train": [], "y_train": [], "x_test": [], "y_test": []}
        train_sizes, test_sizes = [], []
        for user, (x, y) in users.items():
            if tests is None:  # each user's last tenth is its test data
                cut = len(y) - len(y) // TEST_SHARE
                (x, y), (tx, ty) = (x[:cut], y[:cut]), (x[cut:], y[cut:])
            else:
                tx, ty = tests.get(user, (x[:0], y[:0]))
            parts["x_train"].append(x)
            parts["y_train"].append(y)
            parts["x_test"].append(tx)
            parts["y_test"].append(ty)
            train_sizes.append(len(y))
            test_sizes.append(len(ty))
        arrays = {k: np.concatenate(v) for k, v in parts.items()}
        arrays["names"] = np.asarray(list(users), dtype=str)
        arrays["train_offsets"] = np.concatenate([[0], np.cumsum(train_sizes)]).astype(np.int64)
        arrays["test_offsets"] = np.concatenate([[0], np.cumsum(test_sizes)]).astype(np.int64)
        if classes is None:
            text = arrays["x_train"].dtype == np.int64
            classes = len(ALL_LETTERS) if text else int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1
        arrays["num_classes"] = np.asarray(classes, dtype=np.int64)  # kept with the cached arrays
        return arrays

    if os.path.isdir(path):
        arrays = cached_grouped(data_root, "hf", HF_FORMAT, _local_files(path), make, extra=query)
    else:
        arrays = make()
    return to_dataset(arrays, int(arrays["num_classes"]), where)

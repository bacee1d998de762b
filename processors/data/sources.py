"""Dataset sources: torchvision CIFAR-10, seeded synthetic images or text, a user's ``.npz``, or a user's loader
function; and the per-user formats (LEAF's FEMNIST and Shakespeare, TFF's HDF5 files, a Hugging Face dataset with a
user column: ``processors.data.leaf``, ``.tff``, ``.hf``; docs/datasets.md).

Every source yields the same in-memory form (``Dataset``, ``processors.data.dataset``): a train and a test split of
inputs and int64 labels
``0 .. num_classes - 1``. Inputs are either uint8 images N x C x H x W (C = 1 or 3), kept as uint8 and standardised
per channel on the fly (CIFAR-10's statistics for the built-in sources, the training split's own for a user's),
float arrays N x ... used as they are, or int64 token ids N x T of a text task (labels: the next token's id; never
normalised or augmented; ``processors.data.text``, whose ``synthetic-text`` is seeded generated text). A per-user
source also fills ``Dataset.users`` (``processors.data.users``). ``load_dataset`` caches per process, so all simulated devices of a process
share one copy: no per-task dataset load and no DataLoader worker processes. The synthetic images are also
cached per machine (``processors.data.cache``): a run's driver, server and leaves read them, not draw them again.

A user's data comes as ``PATH.npz`` (arrays ``x_train, y_train, x_test, y_test``) or as an import path
``package.module:function`` whose function returns those four arrays (a mapping with those keys, an object with
those attributes, or a 4-tuple in that order); each process calls it once.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import replace

import numpy as np
import torch

from processors.data.cache import cached_arrays
from processors.data.dataset import Dataset, elementwise, normalize, standardize  # noqa: F401 - long imported here
from processors.data.finite_rows import finite_rows
from processors.data.hf import load_hf
from processors.data.leaf import load_leaf
from processors.data.spec import (  # noqa: F401 - the spec's names, long imported from here
    BUILTIN_DATASETS,
    CIFAR_MEAN,
    CIFAR_STD,
    HF_PREFIX,
    IMAGE_SHAPE,
    LEAF_DATASETS,
    NORMALISATIONS,
    NUM_CLASSES,
    REFERENCES_SPLIT_SEED,
    REFERENCES_STD,
    REFERENCES_TRAIN_FRACTION,
    TRAIN_SPLITS,
    DatasetError,
    DatasetSpec,
)
from processors.data.synthetic import synthetic_images
from processors.data.text import VOCAB_SIZE, make_synthetic_text
from processors.data.tff import load_tff


def load_dataset(spec: DatasetSpec) -> Dataset:
    """Load (once per process) the dataset a spec names."""
    return _load_cached(spec)


def references_split(data: Dataset) -> Dataset:
    """The training images the references' devices draw from: the first 3/4 of a seed-42 ``torch.randperm`` of
    the training set, exactly R2's ``random_split(..., [37500, 7500, 5000], seed 42)`` train part for CIFAR-10.
    The test split is unchanged (both references evaluate on the official test set)."""
    n = data.x_train.shape[0]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(REFERENCES_SPLIT_SEED))
    keep = order[: int(n * REFERENCES_TRAIN_FRACTION)]
    return replace(data, x_train=data.x_train[keep], y_train=data.y_train[keep])


@functools.lru_cache(maxsize=4)
def _load_cached(spec: DatasetSpec) -> Dataset:
    data = finite_rows(_load_source(spec), spec.nonfinite, f"--dataset {spec.name}")
    if spec.normalisation != "cifar":
        if spec.normalisation not in NORMALISATIONS:
            raise DatasetError(f"--normalisation {spec.normalisation!r}: use {' or '.join(NORMALISATIONS)}")
        if spec.kind not in ("cifar10", "synthetic"):  # a user's images are standardised with their own statistics
            raise DatasetError(f"--normalisation {spec.normalisation} is for cifar10 and synthetic only")
        data = replace(data, mean=NORMALISATIONS[spec.normalisation][0], std=NORMALISATIONS[spec.normalisation][1])
    if spec.train_split != "all" and data.users is not None:
        raise DatasetError(f"--train-split {spec.train_split} would cut users' samples apart: leave it out")
    if spec.train_split != "all":
        if spec.train_split not in TRAIN_SPLITS:
            raise DatasetError(f"--train-split {spec.train_split!r}: use {' or '.join(TRAIN_SPLITS)}")
        data = references_split(data)
    return data


def _load_source(spec: DatasetSpec) -> Dataset:
    kind = spec.kind
    if kind == "synthetic":
        return cached_synthetic(
            spec.synthetic_size,
            max(spec.synthetic_size // 5, 100),
            spec.seed,
            spec.synthetic_difficulty,
            spec.data_root,
        )
    if kind == "synthetic-text":
        x_train, y_train, x_test, y_test = make_synthetic_text(
            spec.synthetic_size, max(spec.synthetic_size // 5, 100), spec.seed
        )
        return Dataset(x_train, y_train, x_test, y_test, VOCAB_SIZE, None, None)
    if kind == "npz":
        return load_npz(spec.name)
    if kind == "leaf":
        return load_leaf(spec.name, spec.data_root)
    if kind == "tff":
        return load_tff(spec.name, spec.data_root)
    if kind == "hf":
        return load_hf(spec.name[len(HF_PREFIX) :], spec.data_root)
    if kind == "loader":
        return load_from_function(spec.name)
    return load_cifar10(spec.data_root)


def load_cifar10(data_root: str) -> Dataset:
    """torchvision's CIFAR-10 under ``data_root``, downloaded there when the network allows."""
    from torchvision import datasets

    root = os.path.expanduser(data_root)
    try:
        os.makedirs(root, exist_ok=True)
        train = datasets.CIFAR10(root=root, train=True, download=True)
        test = datasets.CIFAR10(root=root, train=False, download=True)
    except Exception as ex:  # torchvision raises URLError, RuntimeError, OSError... depending on what failed
        raise DatasetError(
            f"CIFAR-10 is not under --data-root {root} and could not be downloaded ({type(ex).__name__}: {ex}). "
            f"Put the extracted 'cifar-10-batches-py' folder under {root}, or run with --dataset synthetic "
            "(or --dataset PATH.npz for your own data)."
        ) from ex
    return Dataset(
        torch.from_numpy(np.ascontiguousarray(train.data.transpose(0, 3, 1, 2))),
        torch.as_tensor(train.targets, dtype=torch.int64),
        torch.from_numpy(np.ascontiguousarray(test.data.transpose(0, 3, 1, 2))),
        torch.as_tensor(test.targets, dtype=torch.int64),
    )


def make_synthetic(n_train: int, n_test: int, seed: int, difficulty: float = 0.0) -> Dataset:
    """Seeded, class-structured 32x32x3 images (``processors.data.synthetic.synthetic_images``)."""
    if n_train < NUM_CLASSES * 10:
        raise DatasetError(f"--synthetic-size {n_train} is too small; use at least {NUM_CLASSES * 10}")
    if not 0.0 <= difficulty <= 1.0:
        raise DatasetError(f"--synthetic-difficulty {difficulty}: must be in [0, 1]")
    return Dataset(*synthetic_images(n_train, n_test, seed, difficulty, NUM_CLASSES))


NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
SYNTHETIC_FORMAT = 1  # raise whenever make_synthetic's bits change: cached sets of an older generator are not read


def cached_synthetic(n_train: int, n_test: int, seed: int, difficulty: float, data_root: str) -> Dataset:
    """``make_synthetic``'s dataset, made once per machine and read back by every later process
    (``processors.data.cache``: under ``data_root/synthetic``, keyed by every argument)."""

    def make() -> dict[str, np.ndarray]:
        data = make_synthetic(n_train, n_test, seed, difficulty)
        return {k: getattr(data, k).numpy() for k in NPZ_KEYS}

    key = {"n_train": int(n_train), "n_test": int(n_test), "seed": int(seed), "difficulty": float(difficulty)}
    folder = os.path.join(data_root, "synthetic")
    arrays = cached_arrays(folder, "synthetic", SYNTHETIC_FORMAT, key, make)
    return Dataset(*(torch.from_numpy(np.ascontiguousarray(arrays[k])) for k in NPZ_KEYS))


def load_npz(path: str) -> Dataset:
    """A user's arrays from a ``.npz`` file (see ``from_arrays`` for what they may be)."""
    if not os.path.isfile(path):
        raise DatasetError(f"--dataset {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in NPZ_KEYS if k not in npz.files]
            if missing:
                raise DatasetError(
                    f"--dataset {path}: missing arrays {missing}; the file needs {list(NPZ_KEYS)} (found {npz.files})"
                )
            arrays = {k: npz[k] for k in NPZ_KEYS}
    except DatasetError:
        raise
    except Exception as ex:
        raise DatasetError(f"--dataset {path}: cannot read it as a numpy .npz without pickles ({ex})") from ex
    return from_arrays(arrays, f"--dataset {path}")


def load_from_function(path: str) -> Dataset:
    """Call a user's ``package.module:function`` and check what it returns (``from_arrays``)."""
    module_name, _, attr = path.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as ex:
        raise DatasetError(f"--dataset {path}: cannot import {attr} from {module_name} ({ex})") from ex
    if not callable(function):
        raise DatasetError(f"--dataset {path}: {attr} is not a function")
    try:
        returned = function()
    except Exception as ex:
        raise DatasetError(f"--dataset {path}: calling {attr}() failed ({type(ex).__name__}: {ex})") from ex
    return from_arrays(as_arrays(returned, f"--dataset {path}"), f"--dataset {path}")


def as_arrays(data, where: str) -> dict[str, np.ndarray]:
    """The four arrays of a mapping with keys ``x_train, y_train, x_test, y_test``, an object with those
    attributes, or a 4-tuple in that order."""
    if isinstance(data, dict):
        missing = [k for k in NPZ_KEYS if k not in data]
        if missing:
            raise DatasetError(f"{where}: missing {missing}; give {list(NPZ_KEYS)}")
        values = [data[k] for k in NPZ_KEYS]
    elif isinstance(data, (tuple, list)):
        if len(data) != 4:
            raise DatasetError(f"{where}: a sequence of {len(data)} items; give (x_train, y_train, x_test, y_test)")
        values = list(data)
    elif all(hasattr(data, k) for k in NPZ_KEYS):
        values = [getattr(data, k) for k in NPZ_KEYS]
    else:
        raise DatasetError(
            f"{where}: got a {type(data).__name__}; give {list(NPZ_KEYS)} as a dict, an object with "
            "those attributes, or a 4-tuple"
        )
    return {
        k: v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in zip(NPZ_KEYS, values, strict=True)
    }


def _channels_first(x: np.ndarray) -> np.ndarray:
    """N x H x W x C (C = 1 or 3, H and W larger) -> N x C x H x W; N x H x W -> N x 1 x H x W."""
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4 and x.shape[3] in (1, 3) and x.shape[1] not in (1, 3):
        return x.transpose(0, 3, 1, 2)
    return x


def from_arrays(arrays: dict[str, np.ndarray], where: str) -> Dataset:
    """A ``Dataset`` from a user's arrays, checked: ``x_*`` uint8 images (N x H x W, N x H x W x C or N x C x H x W
    with C = 1 or 3), standardised with the training split's per-channel statistics, float arrays N x ...
    used as they are, or other integer arrays N x L: token ids of a text task, as int64; ``y_*`` integer labels
    0 .. K - 1 (K from the training labels; for token ids, from the largest id in the inputs or labels)."""
    out = []
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim < 2 or x.shape[0] == 0:
            raise DatasetError(f"{where}: x_{split} has shape {x.shape}; expected N samples x ... (N > 0)")
        if x.dtype == np.uint8:
            x = _channels_first(x)
            if x.ndim != 4 or x.shape[1] not in (1, 3):
                raise DatasetError(
                    f"{where}: x_{split} has shape {x.shape}; uint8 images must be N x H x W, "
                    "N x H x W x C or N x C x H x W with C = 1 or 3 (or give float arrays)"
                )
        elif np.issubdtype(x.dtype, np.floating):
            x = x.astype(np.float32)
        elif np.issubdtype(x.dtype, np.integer):  # token ids of a text task
            if x.ndim != 2 or x.min() < 0:
                raise DatasetError(
                    f"{where}: x_{split} is {x.dtype} {x.shape}; integer inputs are token ids, N x L and >= 0 "
                    "(images: uint8)"
                )
            x = x.astype(np.int64)
        else:
            raise DatasetError(
                f"{where}: x_{split} must be uint8 images (0..255), float arrays or integer token ids, got {x.dtype}"
            )
        if not np.issubdtype(y.dtype, np.integer):
            raise DatasetError(f"{where}: y_{split} must hold integer labels, got {y.dtype}")
        if y.shape != (x.shape[0],):
            raise DatasetError(f"{where}: y_{split} has shape {y.shape}; expected ({x.shape[0]},)")
        if y.min() < 0:
            raise DatasetError(f"{where}: y_{split} has negative labels; expected 0..K-1")
        out += [torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64))]
    x_train, y_train, x_test, y_test = out
    if x_train.shape[1:] != x_test.shape[1:] or x_train.dtype != x_test.dtype:
        raise DatasetError(
            f"{where}: x_train is {x_train.dtype} {tuple(x_train.shape)} and x_test "
            f"{x_test.dtype} {tuple(x_test.shape)}; samples must have one shape and type"
        )
    num_classes = int(y_train.max()) + 1
    if x_train.dtype == torch.int64:  # a text task: the labels are ids of the same vocabulary as the inputs
        num_classes = max(num_classes, int(x_train.max()) + 1)
    if int(y_test.max()) >= num_classes:
        raise DatasetError(
            f"{where}: y_test has label {int(y_test.max())}, which y_train never has (0..{num_classes - 1})"
        )
    if num_classes < 2:
        raise DatasetError(f"{where}: y_train holds one class; a classifier needs at least 2")
    mean = std = None
    if x_train.dtype == torch.uint8:  # per-channel statistics of the training images, on [0, 1] pixels
        pixels = x_train.float().div_(255.0).transpose(0, 1).reshape(x_train.shape[1], -1)
        mean = tuple(float(v) for v in pixels.mean(1))
        std = tuple(max(float(v), 1e-3) for v in pixels.std(1))
    return Dataset(x_train, y_train, x_test, y_test, num_classes, mean, std)

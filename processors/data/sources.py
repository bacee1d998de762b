"""Dataset sources: torchvision CIFAR-10, seeded synthetic images, or a user's ``.npz``.

Every source yields the same in-memory form: uint8 images N x 3 x 32 x 32 and int64 labels, for a train and a
test split. ``load_dataset`` caches per process, so all simulated devices of a process share one copy: no per-task
dataset load and no DataLoader worker processes.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch

BUILTIN_DATASETS = ("cifar10", "synthetic")
NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
# CIFAR-10 channel statistics (on [0, 1] pixels), applied on the fly.
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class DatasetError(ValueError):
    """A dataset that is missing or malformed; the message names the fix."""


@dataclass(frozen=True)
class DatasetSpec:
    """What to load. Small and JSON-friendly, so it travels inside NVFlare job configs."""

    name: str = "synthetic"  # "cifar10", "synthetic" or a path to a .npz file
    data_root: str = "~/.cache/edgesim-flare/data"
    synthetic_size: int = 20000  # training images for the synthetic source (test split is a fifth of it)
    seed: int = 0

    @property
    def kind(self) -> str:
        if self.name in BUILTIN_DATASETS:
            return self.name
        if self.name.endswith(".npz"):
            return "npz"
        raise DatasetError(f"--dataset {self.name!r}: use cifar10, synthetic, or a path to a .npz file")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Dataset:
    x_train: torch.Tensor  # uint8, N x 3 x 32 x 32
    y_train: torch.Tensor  # int64, N
    x_test: torch.Tensor
    y_test: torch.Tensor

    def to(self, device: torch.device) -> Dataset:
        return Dataset(*(t.to(device) for t in (self.x_train, self.y_train, self.x_test, self.y_test)))


def normalize(x_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 N x 3 x H x W -> float32, scaled to [0, 1] and standardised with the CIFAR statistics."""
    mean = torch.tensor(CIFAR_MEAN, device=x_uint8.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=x_uint8.device).view(1, 3, 1, 1)
    return (x_uint8.float().div_(255.0) - mean) / std


def load_dataset(spec: DatasetSpec) -> Dataset:
    """Load (once per process) the dataset a spec names."""
    return _load_cached(spec)


@functools.lru_cache(maxsize=4)
def _load_cached(spec: DatasetSpec) -> Dataset:
    kind = spec.kind
    if kind == "synthetic":
        return make_synthetic(spec.synthetic_size, max(spec.synthetic_size // 5, 100), spec.seed)
    if kind == "npz":
        return load_npz(spec.name)
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


def make_synthetic(n_train: int, n_test: int, seed: int) -> Dataset:
    """Seeded, class-structured 32x32x3 images: each class has its own smooth colour pattern; samples add a
    random shift, brightness change and pixel noise, so a small CNN must generalise, not memorise."""
    if n_train < NUM_CLASSES * 10:
        raise DatasetError(f"--synthetic-size {n_train} is too small; use at least {NUM_CLASSES * 10}")
    rng = np.random.default_rng(seed)
    coarse = rng.normal(size=(NUM_CLASSES, 3, 4, 4))
    prototypes = np.kron(coarse, np.ones((1, 1, 8, 8)))  # 4x4 blocks upsampled to 32x32
    prototypes = prototypes / np.abs(prototypes).max(axis=(1, 2, 3), keepdims=True)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = rng.integers(0, NUM_CLASSES, size=n)
        shifts = rng.integers(-4, 5, size=(n, 2))
        images = np.empty((n, 3, 32, 32), dtype=np.uint8)
        for start in range(0, n, 4096):  # chunks keep the float temporaries small
            idx = slice(start, min(start + 4096, n))
            base = prototypes[labels[idx]]
            base = np.stack([np.roll(b, tuple(s), axis=(1, 2)) for b, s in zip(base, shifts[idx], strict=True)])
            gain = rng.uniform(0.6, 1.4, size=(base.shape[0], 1, 1, 1))
            noise = rng.normal(scale=0.35, size=base.shape)
            images[idx] = np.clip(128 + 70 * (gain * base + noise), 0, 255).astype(np.uint8)
        return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))

    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    return Dataset(x_train, y_train, x_test, y_test)


NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_npz(path: str) -> Dataset:
    """A user's data: x_* uint8 N x 32 x 32 x 3 (or N x 3 x 32 x 32), y_* integer labels in [0, 10)."""
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

    out = []
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.dtype != np.uint8:
            raise DatasetError(f"--dataset {path}: x_{split} must be uint8 images (0..255), got {x.dtype}")
        if x.ndim == 4 and x.shape[1:] == (32, 32, 3):
            x = x.transpose(0, 3, 1, 2)
        if x.ndim != 4 or x.shape[1:] != IMAGE_SHAPE:
            raise DatasetError(
                f"--dataset {path}: x_{split} has shape {x.shape}; expected N x 32 x 32 x 3 or N x 3 x 32 x 32"
            )
        if not np.issubdtype(y.dtype, np.integer):
            raise DatasetError(f"--dataset {path}: y_{split} must hold integer labels, got {y.dtype}")
        if y.shape != (x.shape[0],):
            raise DatasetError(f"--dataset {path}: y_{split} has shape {y.shape}; expected ({x.shape[0]},)")
        if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
            raise DatasetError(
                f"--dataset {path}: y_{split} labels span {y.min()}..{y.max()}; expected 0..{NUM_CLASSES - 1}"
            )
        if x.shape[0] == 0:
            raise DatasetError(f"--dataset {path}: x_{split} is empty")
        out += [torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64))]
    return Dataset(*out)

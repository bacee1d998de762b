"""What a run's data is, without loading it (and without torch): the dataset's spec, its names and the built-in
sources' statistics. ``processors.data.sources`` loads what a ``DatasetSpec`` names; the config (``jobs.config``)
checks one before any process starts, torch unimported."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

BUILTIN_DATASETS = ("cifar10", "synthetic", "synthetic-text")
LEAF_DATASETS = ("femnist", "shakespeare")  # LEAF's JSON under <data-root>/<name>/data/{train,test}
HF_PREFIX = "hf:"  # hf:PATH[?x=COLUMN&y=COLUMN&user=COLUMN]: a Hugging Face dataset (processors.data.hf)
NUM_CLASSES = 10
IMAGE_SHAPE = (3, 32, 32)
# CIFAR-10 channel statistics (on [0, 1] pixels), applied on the fly.
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
# The std both FedRevive references standardise CIFAR-10 with (a widely copied value, not CIFAR-10's own): inputs
# then come out 1 / 0.82 of ours (``--normalisation references``).
REFERENCES_STD = (0.2023, 0.1994, 0.2010)
NORMALISATIONS = {"cifar": (CIFAR_MEAN, CIFAR_STD), "references": (CIFAR_MEAN, REFERENCES_STD)}
TRAIN_SPLITS = ("all", "references")
# The references' split (R2 prepare_cifar10: random_split(train, [37500, 7500, 5000], seed 42)): devices draw
# from the first three quarters of a seed-42 permutation (validation and KD parts are not used by either).
REFERENCES_SPLIT_SEED = 42
REFERENCES_TRAIN_FRACTION = 0.75


NONFINITE_POLICIES = ("refuse", "drop")  # rows holding NaN or inf (processors.data.finite_rows)


class DatasetError(ValueError):
    """A dataset that is missing or malformed; the message names the fix."""


@dataclass(frozen=True)
class DatasetSpec:
    """What to load. Small and JSON-friendly, so it travels inside NVFlare job configs."""

    # cifar10, synthetic, synthetic-text, femnist, shakespeare, a .npz or .h5 path, hf:PATH, or module:function
    name: str = "synthetic"
    data_root: str = "~/.cache/edgesim-flare/data"
    synthetic_size: int = 20000  # training images for the synthetic source (test split is a fifth of it)
    seed: int = 0
    synthetic_difficulty: float = 0.0  # 0: the easy classes of make_synthetic; 1: the calibrated hard ones
    normalisation: str = "cifar"  # the built-in sources' statistics: a key of NORMALISATIONS
    train_split: str = "all"  # "references": the training images the references' devices draw from
    nonfinite: str = "refuse"  # rows holding NaN or inf: refuse the run, or drop them (NONFINITE_POLICIES)

    @property
    def kind(self) -> str:
        if self.name in BUILTIN_DATASETS:
            return self.name
        if self.name in LEAF_DATASETS:
            return "leaf"
        if self.name.startswith(HF_PREFIX):
            return "hf"
        if self.name.endswith(".npz"):
            return "npz"
        if self.name.endswith(".h5"):
            return "tff"
        if ":" in self.name and os.path.sep not in self.name.partition(":")[0]:
            return "loader"
        raise DatasetError(
            f"--dataset {self.name!r}: use cifar10, synthetic, synthetic-text, femnist, shakespeare, a path to a "
            ".npz file or a TFF .h5 file, hf:PATH, or an import path package.module:function that returns x_train, "
            "y_train, x_test, y_test"
        )

    def to_dict(self) -> dict:
        return asdict(self)

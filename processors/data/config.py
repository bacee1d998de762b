"""The data part of a job's configuration: which dataset, and how it is split over the simulated devices."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Literal

from common.choices import ConfigError, check_positive
from processors.data.sources import BUILTIN_DATASETS, DatasetError, DatasetSpec

Partition = Literal["device", "references"]  # processors.data.partition.PARTITIONS
Normalisation = Literal["cifar", "references"]  # processors.data.sources.NORMALISATIONS
TrainSplit = Literal["all", "references"]  # processors.data.sources.TRAIN_SPLITS


@dataclass(frozen=True)
class DataConfig:
    """Attributes:
    dataset: ``cifar10``, ``synthetic`` (seeded, class-structured images), ``synthetic-text`` (seeded generated
        text for next-character prediction, ``processors.data.text``), ``PATH.npz`` (``x_train``, ``y_train``,
        ``x_test``, ``y_test``), or ``package.module:function`` returning those arrays (``processors.data.sources``).
    data_root: where torchvision's CIFAR-10 lives (downloaded there when the network allows).
    synthetic_size: training images of the synthetic dataset (its test split is a fifth of it).
    synthetic_difficulty: 0 (easy: every method reaches ~1.0) .. 1 (hard: centralised ``cifar10_convnet`` ends in
        CIFAR-10's range, ``benchmarks/calibrate_synthetic.py``), for the synthetic dataset.
    subset_size: training samples each device holds.
    dirichlet_alpha: label skew of each device's samples (Dirichlet concentration); <= 0 means IID.
    partition: how Dirichlet counts become samples: device (a multinomial per device, drawn alone) or
        references (the FedRevive references' rounded counts and class pools dealt in order;
        processors.data.partition).
    normalisation: the built-in sources' per-channel std: cifar (CIFAR-10's own) or references (the FedRevive
        references' (0.2023, 0.1994, 0.2010)).
    train_split: all training images, or references: the seeded 37,500 of CIFAR-10's 50,000 the FedRevive
        references train on (3/4 of any other dataset's).
    """

    dataset: str = "synthetic"
    data_root: str = "~/.cache/edgesim-flare/data"
    synthetic_size: int = 20000
    synthetic_difficulty: float = 0.0
    subset_size: int = 350
    dirichlet_alpha: float = 0.5
    partition: Partition = "device"
    normalisation: Normalisation = "cifar"
    train_split: TrainSplit = "all"

    def __post_init__(self) -> None:
        check_positive({"--subset-size": self.subset_size, "--synthetic-size": self.synthetic_size})
        if not 0.0 <= self.synthetic_difficulty <= 1.0:
            raise ConfigError(f"--synthetic-difficulty {self.synthetic_difficulty}: must be in [0, 1]")
        try:
            _ = self.spec(0).kind  # a name that is no known source fails here
        except DatasetError as ex:
            raise ConfigError(str(ex)) from ex

    def spec(self, seed: int) -> DatasetSpec:
        """What to load: the dataset with absolute paths, and the seed of the synthetic source."""
        name = self.dataset
        if name not in BUILTIN_DATASETS and name.endswith(".npz"):
            name = os.path.abspath(os.path.expanduser(name))
        return DatasetSpec(
            name,
            os.path.abspath(os.path.expanduser(self.data_root)),
            self.synthetic_size,
            seed,
            self.synthetic_difficulty,
            self.normalisation,
            self.train_split,
        )

    def to_dict(self) -> dict:
        return asdict(self)

"""The data part of a job's configuration: which dataset, and how it is split over the simulated devices."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Literal

from common.choices import ConfigError, check_positive
from processors.data.spec import BUILTIN_DATASETS, HF_PREFIX, DatasetError, DatasetSpec
from processors.data.stackoverflow import is_stackoverflow

PER_USER_KINDS = ("leaf", "tff", "hf")  # the sources that know their users (--partition natural)

Partition = Literal["device", "references", "natural", "iid", "dirichlet"]  # processors.data.partition.PARTITIONS
Normalisation = Literal["cifar", "references"]  # processors.data.sources.NORMALISATIONS
TrainSplit = Literal["all", "references"]  # processors.data.sources.TRAIN_SPLITS
NonFinite = Literal["refuse", "drop"]  # processors.data.spec.NONFINITE_POLICIES


@dataclass(frozen=True)
class DataConfig:
    """Attributes:
    dataset: ``cifar10``, ``synthetic`` (seeded, class-structured images), ``synthetic-text`` (seeded generated
        text for next-character prediction, ``processors.data.text``), ``femnist`` or ``shakespeare`` (LEAF's
        JSON under ``DATA_ROOT/NAME/data/train`` and ``.../test``), ``PATH.h5`` (a TFF client file: EMNIST,
        Shakespeare), ``hf:PATH`` (a Hugging Face dataset with a user column), ``PATH.npz`` (``x_train``,
        ``y_train``, ``x_test``, ``y_test``), or ``package.module:function`` returning those arrays
        (docs/datasets.md).
    data_root: where torchvision's CIFAR-10 lives (downloaded there when the network allows), and LEAF's folders.
    synthetic_size: training images of the synthetic dataset (its test split is a fifth of it).
    synthetic_difficulty: 0 (easy: every method reaches ~1.0) .. 1 (hard: centralised ``cifar10_convnet`` ends in
        CIFAR-10's range, ``benchmarks/repro/calibrate_synthetic.py``), for the synthetic dataset.
    subset_size: training samples each device holds.
    dirichlet_alpha: label skew of each device's samples (Dirichlet concentration); <= 0 means IID.
    partition: how devices get samples: device or dirichlet (a Dirichlet multinomial per device, drawn alone),
        references (the FedRevive references' rounded counts and class pools dealt in order), iid (a uniform
        draw, whatever --dirichlet-alpha), or natural (each device is one user of femnist, shakespeare, a TFF
        .h5 or hf: dataset, with all that user's samples; processors.data.partition).
    normalisation: the built-in sources' per-channel std: cifar (CIFAR-10's own) or references (the FedRevive
        references' (0.2023, 0.1994, 0.2010)).
    train_split: all training images, or references: the seeded 37,500 of CIFAR-10's 50,000 the FedRevive
        references train on (3/4 of any other dataset's).
    dataset_nonfinite: rows whose inputs hold NaN or inf: refuse the run before it starts (naming how many and
        where), or drop them and say how many (``processors.data.finite_rows``).
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
    dataset_nonfinite: NonFinite = "refuse"

    def __post_init__(self) -> None:
        check_positive({"--subset-size": self.subset_size, "--synthetic-size": self.synthetic_size})
        if not 0.0 <= self.synthetic_difficulty <= 1.0:
            raise ConfigError(f"--synthetic-difficulty {self.synthetic_difficulty}: must be in [0, 1]")
        try:
            kind = self.spec(0).kind  # a name that is no known source fails here
        except DatasetError as ex:
            raise ConfigError(str(ex)) from ex
        if kind in ("tff", "hf"):  # every process reads the same file, whatever its working directory
            object.__setattr__(self, "dataset", absolute_source(self.dataset))
        if self.partition == "natural" and kind not in PER_USER_KINDS:
            raise ConfigError(
                f"--partition natural: --dataset {self.dataset} has no users; use femnist, shakespeare, a TFF .h5 "
                "file or hf:PATH, or --partition device"
            )
        if kind == "tff" and is_stackoverflow(self.dataset) and self.partition != "natural":
            raise ConfigError(lazy_refusal(self.dataset, self.partition))
        if kind in PER_USER_KINDS and self.train_split != "all":
            raise ConfigError(f"--train-split {self.train_split} is for cifar10 and array datasets: leave it out")

    def validate(self) -> None:
        """The files the dataset names are there (not read yet): one line saying where to put them otherwise."""
        from processors.data.formats import check_files

        try:
            check_files(self.spec(0))
        except DatasetError as ex:
            raise ConfigError(str(ex)) from ex

    def spec(self, seed: int) -> DatasetSpec:
        """What to load: the dataset with absolute paths, and the seed of the synthetic source."""
        name = self.dataset
        if name not in BUILTIN_DATASETS and name.endswith((".npz", ".h5")):
            name = os.path.abspath(os.path.expanduser(name))
        return DatasetSpec(
            name,
            os.path.abspath(os.path.expanduser(self.data_root)),
            self.synthetic_size,
            seed,
            self.synthetic_difficulty,
            self.normalisation,
            self.train_split,
            self.dataset_nonfinite,
        )

    def to_dict(self) -> dict:
        return asdict(self)


def absolute_source(dataset: str) -> str:
    """A TFF file's or a local Hugging Face folder's path made absolute (``hf:`` names in the cache stay)."""
    if not dataset.startswith(HF_PREFIX):
        return os.path.abspath(os.path.expanduser(dataset))
    path, sep, query = dataset[len(HF_PREFIX) :].partition("?")
    local = path.startswith((os.sep, ".", "~")) or os.path.exists(os.path.expanduser(path))
    return HF_PREFIX + (os.path.abspath(os.path.expanduser(path)) if local else path) + sep + query


def lazy_refusal(dataset: str, partition: str) -> str:
    """The one line refusing a partition other than ``natural`` of a dataset read per user (StackOverflow)."""
    return (
        f"--partition {partition}: --dataset {dataset} is read one user at a time (StackOverflow's training file "
        "does not fit in memory), so only --partition natural can split it"
    )

"""The built-in models as the configuration knows them, without importing torch: their names, what each is, the
local training its reference trains it with (its preset), which model ``--model auto`` (the default) picks for a
dataset, and the check of a ``--model`` value. The config (``processors.training_config``, ``jobs.api``) uses them
before any process starts; ``processors.models`` maps each name to its class (``MODEL_CLASSES``, keyed by exactly
these names).

A model's preset fills the local-training flags the user does not give (``jobs.build``), as a
method's preset fills the federation flags: what the model's reference trains it with, so a run on a dataset
learns at the default settings. Flags the user gives win.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from processors.data.spec import HF_PREFIX, DatasetError, DatasetSpec

AUTO = "auto"  # --model auto: the model of the dataset (auto_model)


@dataclass(frozen=True)
class ModelCard:
    """One built-in model.

    Attributes:
        name: its ``--model`` name.
        summary: what it is, in a few words (printed when ``auto`` picks it).
        preset: ``TrainingConfig`` fields its reference trains it with, applied to the flags not given.
        source: where the preset's values come from (printed with them).
    """

    name: str
    summary: str
    preset: dict = field(default_factory=dict)
    source: str = ""


MODELS: dict[str, ModelCard] = {
    card.name: card
    for card in (
        # the project's defaults (Adam 3e-4, 25 x 32) are the FedRevive references' client: no preset
        ModelCard("cifar10_convnet", "the small CNN of NVFlare's edge example"),
        ModelCard("resnet18", "the FedRevive paper's ResNet-18 (statistic trackers, no normalisation)"),
        ModelCard("resnet18_bn", "ResNet-18 with BatchNorm"),
        ModelCard(
            "femnist_cnn",
            "LEAF's FEMNIST CNN",
            {"optimizer": "sgd", "local_lr": 0.004, "local_batch_size": 10},
            "LEAF's FedAvg: SGD at 0.004 on batches of 10, LEAF's paper_experiments/femnist.sh and models/utils/args.py",
        ),
        ModelCard(
            "char_lstm",
            "LEAF's Shakespeare LSTM",
            {"local_batch_size": 10, "local_lr": 1e-2},
            "LEAF's batches of 10, Adam at 1e-2: docs/tasks.md",
        ),
        ModelCard(
            "word_lstm",
            "TFF's StackOverflow LSTM",
            {"optimizer": "sgd", "local_lr": 0.316, "local_batch_size": 16},
            "Reddi et al.'s Stack Overflow FedAvg client, Adaptive Federated Optimization: SGD at 10^-1/2, batches of 16",
        ),
    )
}
BUILT_IN_MODELS = tuple(MODELS)
PRESET_FIELDS = tuple(sorted({name for card in MODELS.values() for name in card.preset}))


def check_model_name(name: str) -> None:
    """``ValueError`` naming the fix unless ``name`` is ``auto``, a built-in name or has an import path's shape
    (nothing is imported: ``processors.models.model_class`` does that)."""
    if name != AUTO and name not in BUILT_IN_MODELS and ":" not in name:
        raise ValueError(
            f"--model {name!r}: use {AUTO}, {', '.join(BUILT_IN_MODELS)} or an import path package.module:Class"
        )


def model_preset(name: str) -> dict:
    """The local-training preset of a model (a user's model has none)."""
    card = MODELS.get(name)
    return dict(card.preset) if card is not None else {}


def auto_model(dataset: str) -> str:
    """The built-in model ``--model auto`` picks for ``--dataset``, by its name (no file is read): the convnet for
    CIFAR-10 and the synthetic images; LEAF's CNN for FEMNIST (LEAF's, or a TFF or Hugging Face file or folder
    whose name says EMNIST); LEAF's char-LSTM for Shakespeare and the generated text; TFF's word-LSTM for
    StackOverflow. Any other data (a user's arrays or function, a file named otherwise): the convnet, as before
    ``auto`` existed; give ``--model`` for it."""
    try:
        kind = DatasetSpec(dataset).kind
    except DatasetError:
        return "cifar10_convnet"  # the data part refuses the name, in its own words
    if kind == "synthetic-text" or (kind == "leaf" and dataset == "shakespeare"):
        return "char_lstm"
    if kind == "leaf":
        return "femnist_cnn"
    if kind in ("tff", "hf"):
        path = dataset[len(HF_PREFIX) :].partition("?")[0] if kind == "hf" else dataset
        name = os.path.basename(os.path.normpath(path)).lower()
        for word, model in (("stackoverflow", "word_lstm"), ("shakespeare", "char_lstm"), ("emnist", "femnist_cnn")):
            if word in name:
                return model
    return "cifar10_convnet"


def auto_words(dataset: str, model: str) -> str:
    """Why ``auto`` picked ``model`` (``auto_model``'s pick, resolved once by the job's build) for ``dataset``, for
    the line that says so."""
    known = model != "cifar10_convnet" or dataset in ("synthetic", "cifar10")
    why = "" if known else " (auto knows the built-in and per-user datasets by name: give --model for other data)"
    return f"{model}, {MODELS[model].summary}, for --dataset {dataset}{why}"

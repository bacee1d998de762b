"""The built-in models' names and the check of a ``--model`` value, without importing torch: the config
(``processors.training_config``) checks a name before any process starts; ``processors.models`` maps each name
to its class (``MODEL_CLASSES``, keyed by exactly these names)."""

from __future__ import annotations

BUILT_IN_MODELS = ("cifar10_convnet", "resnet18", "resnet18_bn", "char_lstm", "word_lstm")


def check_model_name(name: str) -> None:
    """``ValueError`` naming the fix unless ``name`` is a built-in name or has an import path's shape (nothing is
    imported: ``processors.models.model_class`` does that)."""
    if name not in BUILT_IN_MODELS and ":" not in name:
        raise ValueError(f"--model {name!r}: use {', '.join(BUILT_IN_MODELS)} or an import path package.module:Class")

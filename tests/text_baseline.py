"""The accuracy a character model must beat: always the training labels' most frequent character. Only the tests
that train a character model ask for it, so it lives here rather than in ``processors.data.text``."""

from __future__ import annotations

import torch


def frequency_baseline(y_train: torch.Tensor, y_test: torch.Tensor) -> float:
    """Test accuracy of always predicting the training labels' most frequent character."""
    most = int(torch.bincount(y_train).argmax())
    return float((y_test == most).float().mean())

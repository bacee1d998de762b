"""FemnistCNN: LEAF's FEMNIST model (``models/femnist/cnn.py`` in LEAF, github.com/TalwalkarLab/leaf): two 5 x 5
convolutions of 32 and 64 channels, each with TensorFlow's ``padding="same"`` (2 pixels each side at stride 1)
and a ReLU, each followed by a 2 x 2 max-pooling of stride 2 (28 -> 14 -> 7), a dense layer of 2,048 units with a
ReLU on the 7 x 7 x 64 features, and the dense projection to the 62 classes' logits (6,603,710 parameters). Its
input is one 28 x 28 grey image (1 x 28 x 28: FEMNIST, TFF's EMNIST).

Differences from LEAF's TensorFlow layers: PyTorch's initialisation (LEAF's: Glorot uniform weights, zero biases),
the features flattened channel-first (a fixed permutation of the dense layer's inputs), and the images
standardised with the training split's own mean and std (LEAF feeds the [0, 1] pixels; ``processors.data.leaf``).
It has no BatchNorm, so both engines train it (one device at a time, and grouped under ``torch.func.vmap``:
``tests/processors/test_femnist_cnn.py``)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from processors.models.seeding import reset_parameters_seeded

NUM_CLASSES = 62  # FEMNIST's digits, upper- and lower-case letters
SIDE = 28  # pixels per side of an image


class FemnistCNN(nn.Module):
    """conv 1->32 k5 same, pool 2, conv 32->64 k5 same, pool 2, dense 3136->2048, dense 2048->62."""

    def __init__(self, num_classes: int = NUM_CLASSES, init_seed: int | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * (SIDE // 4) ** 2, 2048)
        self.fc2 = nn.Linear(2048, num_classes)
        if init_seed is not None:
            reset_parameters_seeded(self, init_seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)

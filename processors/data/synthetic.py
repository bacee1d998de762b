"""The seeded generated images of the ``synthetic`` dataset: class prototypes, shifts, gains and pixel noise.

Pure numpy from one seed, so every process (and the per-machine cache, ``processors.data.cache``) gets the same
bits; ``processors.data.sources.make_synthetic`` wraps them in a ``Dataset``.
"""

from __future__ import annotations

import numpy as np
import torch

HARD_SHARED = 0.82  # at difficulty 1, this share of every class prototype is a pattern all classes have in common
HARD_NOISE = 0.9  # at difficulty 1, this much more pixel noise (on top of 0.35)


def synthetic_images(
    n_train: int, n_test: int, seed: int, difficulty: float = 0.0, num_classes: int = 10
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded, class-structured 32x32x3 images: each class has its own smooth colour pattern; samples add a
    random shift, brightness change and pixel noise, so a small CNN must generalise, not memorise.

    ``difficulty`` in [0, 1] brings the classes together: each prototype becomes ``(1 - s) x its own + s x a
    pattern shared by all`` with ``s = HARD_SHARED x difficulty``, and the pixel noise grows by ``HARD_NOISE x
    difficulty``. At 0 every method reaches ~1.0 (the default, and the bits of every earlier run); 1 is calibrated
    so that centralised training of ``cifar10_convnet`` ends in CIFAR-10's range for that model
    (``benchmarks/repro/calibrate_synthetic.py``). Returns ``x_train, y_train, x_test, y_test``; the checks of the sizes
    are ``processors.data.sources.make_synthetic``'s."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(size=(num_classes, 3, 4, 4))
    if difficulty > 0:  # drawn only then: the easy data keeps its bits
        shared = HARD_SHARED * difficulty
        coarse = (1 - shared) * coarse + shared * rng.normal(size=(1, 3, 4, 4))
    prototypes = np.kron(coarse, np.ones((1, 1, 8, 8)))  # 4x4 blocks upsampled to 32x32
    prototypes = prototypes / np.abs(prototypes).max(axis=(1, 2, 3), keepdims=True)
    noise_scale = 0.35 + HARD_NOISE * difficulty

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = rng.integers(0, num_classes, size=n)
        shifts = rng.integers(-4, 5, size=(n, 2))
        images = np.empty((n, 3, 32, 32), dtype=np.uint8)
        for start in range(0, n, 4096):  # chunks keep the float temporaries small
            idx = slice(start, min(start + 4096, n))
            base = prototypes[labels[idx]]
            base = np.stack([np.roll(b, tuple(s), axis=(1, 2)) for b, s in zip(base, shifts[idx], strict=True)])
            gain = rng.uniform(0.6, 1.4, size=(base.shape[0], 1, 1, 1))
            noise = rng.normal(scale=noise_scale, size=base.shape)
            images[idx] = np.clip(128 + 70 * (gain * base + noise), 0, 255).astype(np.uint8)
        return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))

    x_train, y_train = draw(n_train)
    x_test, y_test = draw(n_test)
    return x_train, y_train, x_test, y_test

"""The augmentation FedRevive applies to synthetic images, in synthesis and in distillation.

The reference (R1 and NVIDIA's port) uses kornia's ``RandomCrop(32, padding=4, padding_mode="reflect")`` and
``RandomHorizontalFlip()``, drawn per sample and differentiable, so the generator learns images whose crops and
mirror images the teachers still recognise, and the student is distilled on varied views of the pool. This is the
same operation in plain torch (indexing is differentiable in the images), seeded by the caller's generator. It
works on normalised images: crop and flip commute with the per-channel normalisation the reference applies after.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PADDING = 4


def crop_and_flip(
    images: torch.Tensor, generator: torch.Generator, padding: int = PADDING, flip: bool = True
) -> torch.Tensor:
    """Each image of the N x C x H x W batch reflect-padded by ``padding``, cropped back to H x W at a random
    offset, and mirrored left-right with probability 1/2 (``flip`` False: never; the draws are the same, so the
    generator's stream does not depend on it)."""
    n, c, h, w = images.shape
    padded = F.pad(images, (padding, padding, padding, padding), mode="reflect")
    dy = torch.randint(0, 2 * padding + 1, (n, 1), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n, 1), generator=generator)
    flip = (torch.rand(n, 1, generator=generator) < 0.5) & flip
    rows = dy + torch.arange(h)
    cols = dx + torch.arange(w)
    cols = torch.where(flip, cols.flip(1), cols)
    device = images.device
    index_n = torch.arange(n, device=device).view(n, 1, 1, 1)
    index_c = torch.arange(c, device=device).view(1, c, 1, 1)
    return padded[index_n, index_c, rows.to(device).view(n, 1, h, 1), cols.to(device).view(n, 1, 1, w)]

"""Local data augmentation of 32x32 images, as the FedRevive references train their clients: a random crop with
4 pixels of zero padding, then a horizontal flip with probability 1/2 (torchvision's ``RandomCrop(32, padding=4)``
and ``RandomHorizontalFlip()``, on the stored images, before standardisation).

Both engines draw a device's crops and flips from the device's own generator, right after its batch schedule
(``draw``), and apply them with integer indexing (``crop_flip``), so the augmented pixels are the same bits
whichever engine trains the device, and a seeded run repeats exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PADDING = 4


def draw(iters: int, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's crop offsets (``iters x batch x 2``, rows then columns, in ``0 .. 2 * PADDING``) and flips
    (``iters x batch``, bool), drawn from ``generator``."""
    offsets = torch.randint(0, 2 * PADDING + 1, (iters, batch, 2), generator=generator)
    flips = torch.randint(0, 2, (iters, batch), generator=generator).bool()
    return offsets, flips


def crop_flip(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """``x`` (N x C x H x W, any dtype) with sample i cropped at ``offsets[i]`` from its zero-padded copy and
    mirrored where ``flips[i]``."""
    n, c, h, w = x.shape
    device = x.device
    offsets, flips = offsets.to(device), flips.to(device)
    padded = F.pad(x, (PADDING, PADDING, PADDING, PADDING))
    rows = offsets[:, 0, None] + torch.arange(h, device=device)  # n x h
    cols = offsets[:, 1, None] + torch.arange(w, device=device)  # n x w
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    samples = torch.arange(n, device=device)[:, None, None, None]
    channels = torch.arange(c, device=device)[None, :, None, None]
    return padded[samples, channels, rows[:, None, :, None], cols[:, None, None, :]]

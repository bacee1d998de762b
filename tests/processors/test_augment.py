"""Local augmentation (``processors.augment``): the references' RandomCrop(32, padding=4) and horizontal flip,
drawn per device and step from the device's generator."""

from __future__ import annotations

import torch

from processors.augment import PADDING, crop_flip, draw


def test_each_sample_is_its_zero_padded_crop_mirrored_where_drawn():
    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    offsets, flips = draw(1, 6, torch.Generator().manual_seed(1))
    out = crop_flip(x, offsets[0], flips[0])
    assert out.dtype == torch.uint8 and out.shape == x.shape
    padded = torch.nn.functional.pad(x, (PADDING,) * 4)
    for i in range(6):
        r, c = offsets[0, i].tolist()
        want = padded[i, :, r : r + 32, c : c + 32]
        assert torch.equal(out[i], want.flip(-1) if flips[0, i] else want), i


def test_the_draws_repeat_from_a_seed_and_cover_every_offset_and_both_flips():
    a = draw(50, 32, torch.Generator().manual_seed(7))
    b = draw(50, 32, torch.Generator().manual_seed(7))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert set(a[0].unique().tolist()) == set(range(2 * PADDING + 1)) and set(a[1].unique().tolist()) == {0, 1}

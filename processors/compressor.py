"""The compressor's contract (``processors.compress``; ``docs/communication.md``, "Writing a compressor"): one small
class per compressor, on a device's whole update flattened into float32 values, and the split back into its
entries. Its own module so that a compressor kept elsewhere (NVFlare's quantiser, ``processors.nvflare_quantize``)
subclasses it without importing the registry that names it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from common.compression import CompressorSpec

Payload = dict[str, np.ndarray]


class Compressor:
    """One compressor (see the module docstring). Subclasses set ``name`` and implement ``decode_group``,
    ``encode`` and ``decode``; ``spec`` holds the setting."""

    name: ClassVar[str] = ""

    def __init__(self, spec: CompressorSpec):
        self.spec = spec

    @property
    def biased(self) -> bool:
        return self.spec.biased

    def encoded_bytes(self, n: int) -> int:
        """Bytes one device sends for an update of ``n`` values."""
        return self.spec.encoded_bytes(n)

    def with_layout(self, names: list[str], shapes: list) -> Compressor:
        """The compressor for updates of these entries (their names and shapes, in the flattened order): itself,
        unless it works entry by entry (NVFlare's quantiser, ``processors.nvflare_quantize``)."""
        return self

    def decode_group(self, flat: torch.Tensor, seeds: list[int]) -> torch.Tensor:
        """What the server decodes from each of K devices (``flat``: ``[K, n]`` float32, ``seeds``: each device's
        ``device_seed``)."""
        raise NotImplementedError

    def encode(self, flat: torch.Tensor, seed: int) -> Payload:
        """One device's wire form of its update (``flat``: ``[n]``)."""
        raise NotImplementedError

    def decode(self, payload: Payload, n: int) -> torch.Tensor:
        """The update ``[n]`` the server reads from ``encode``'s payload."""
        raise NotImplementedError


def split_flat(flat: np.ndarray, names: list[str], shapes: list) -> dict[str, np.ndarray]:
    """A flattened update back into its entries, in the order it was flattened."""
    sizes = [int(np.prod(s)) for s in shapes]
    parts = np.split(flat, np.cumsum(sizes)[:-1])
    return {n: p.reshape(s).copy() for n, p, s in zip(names, parts, shapes, strict=True)}

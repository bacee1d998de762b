"""The server's model versions, each kept once as the blob it travels in, the oldest spilled to disk past a cap.

An asynchronous run keeps every version a device in flight still trains: with the paper's delays and K = 2,000,
about a thousand versions at once. Each is kept as one packed buffer (``common.packed_weights``), and its arrays
are views of that buffer, so a version costs its size once (it used to cost twice: its arrays and the packed copy
the leaves are sent), and sending it to a leaf copies nothing. Past ``memory_bytes`` the oldest versions but the
newest go to files in ``folder`` (the run's own; removed at the end), and come back from there when a leaf or the
strategy asks for one: memory stays bounded whatever K, at the price of reading back a version a device released
late trains. The bits are the same either way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import numpy as np
from nvflare.fuel.utils.fobs.datum import Datum

from common.packed_weights import LAYOUT, PACKED, PackedArrays, pack, packed_bytes, views

Weights = dict[str, np.ndarray]


class VersionStore:
    """Args:
    memory_bytes: the bytes of versions kept in memory; past it the oldest (never the newest) go to disk.
    folder: gives the folder spilled versions go to (called once, at the first spill); None: a temporary one.
    """

    def __init__(self, memory_bytes: float, folder: Callable[[], str] | None = None):
        self.memory_bytes = memory_bytes
        self._folder_of = folder
        self._folder = ""
        self._layout: dict[int, str] = {}  # version -> its layout (``common.packed_weights.layout_text``)
        self._memory: dict[int, tuple[bytearray, Weights]] = {}  # version -> (its blob, its arrays: views of it)
        self._disk: dict[int, int] = {}  # spilled version -> its bytes
        self._in_memory = 0  # bytes of the blobs in memory
        self._on_disk = 0  # bytes of the spilled ones
        self.peak = (0, 0, 0)  # the most versions kept at once, the most bytes in memory, the most on disk

    def __contains__(self, version: int) -> bool:
        return version in self._layout

    def __len__(self) -> int:
        return len(self._layout)

    def __iter__(self) -> Iterator[int]:
        return iter(self._layout)

    def keys(self):
        return self._layout.keys()

    def put(self, version: int, weights: Weights) -> Weights:
        """Keep ``weights`` as ``version`` (one copy, none when they are already the views of a writable blob of
        their own, as a strategy that writes a version into ``fresh_like``'s arrays returns them); returns its
        arrays as kept (views of its blob)."""
        self.discard(version)
        if isinstance(weights, PackedArrays) and weights.layout and isinstance(weights.blob, bytearray):
            blob, arrays, layout_text = weights.blob, weights, weights.layout
        else:
            packed = pack(weights)
            blob, arrays, layout_text = packed_bytes(packed), views(packed), packed[LAYOUT]
        self._layout[version] = layout_text
        self._memory[version] = (blob, arrays)
        self._in_memory += len(blob)
        self._spill(newest=version)
        self._note()
        return arrays

    def get(self, version: int) -> Weights:
        """A version's arrays (read back from disk if it was spilled: a copy of its own)."""
        kept = self._memory.get(version)
        if kept is not None:
            return kept[1]
        if version not in self._disk:
            raise KeyError(f"model version {version} is not kept")
        return views(self._packed_dict(version, self._read(version)))

    def packed(self, version: int) -> dict:
        """A version as it travels to the leaves (``common.packed_weights``), without copying it."""
        kept = self._memory.get(version)
        return self._packed_dict(version, kept[0] if kept is not None else self._read(version))

    def discard(self, version: int) -> None:
        if self._layout.pop(version, None) is None:
            return
        kept = self._memory.pop(version, None)
        if kept is not None:
            self._in_memory -= len(kept[0])
        spilled = self._disk.pop(version, None)
        if spilled is not None:
            self._on_disk -= spilled
            os.remove(self._path(version))

    def close(self, spilled_only: bool = False) -> None:
        """Forget every version (``spilled_only``: those on disk; the newest never is) and remove the spill
        folder."""
        for version in list(self._disk if spilled_only else self._layout):
            self.discard(version)
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = ""

    # -- disk ---------------------------------------------------------------------------------------------------
    def _spill(self, newest: int) -> None:
        if self._in_memory <= self.memory_bytes:
            return
        for version in sorted(self._memory):  # the oldest first: the last a device in flight still trains
            if self._in_memory <= self.memory_bytes:
                break
            if version == newest:
                continue
            blob, _ = self._memory.pop(version)
            with open(self._path(version), "wb") as f:
                f.write(blob)
            self._in_memory -= len(blob)
            self._disk[version] = len(blob)
            self._on_disk += len(blob)

    def _path(self, version: int) -> str:
        if not self._folder:
            folder = self._folder_of() if self._folder_of is not None else ""
            if folder:
                os.makedirs(folder, exist_ok=True)
            self._folder = folder or tempfile.mkdtemp(prefix="spilled-versions-")
        return os.path.join(self._folder, f"{version}.bin")

    def _read(self, version: int) -> bytearray:
        with open(self._path(version), "rb") as f:
            return bytearray(f.read())

    def _packed_dict(self, version: int, blob) -> dict:
        return {PACKED: 1, LAYOUT: self._layout[version], "data": Datum.blob_datum(blob)}

    def _note(self) -> None:
        peak = self.peak
        self.peak = (max(len(self._layout), peak[0]), max(self._in_memory, peak[1]), max(self._on_disk, peak[2]))

"""The server's model versions, each kept once as the blob it travels in, the oldest spilled to disk past a cap.

An asynchronous run keeps every version a device in flight still trains: with the paper's delays and K = 2,000,
about a thousand versions at once. Each is kept as one packed buffer (``common.packed_weights``), and its arrays
are views of that buffer, so a version costs its size once (it used to cost twice: its arrays and the packed copy
the leaves are sent), and sending it to a leaf copies nothing. Past ``memory_bytes`` the oldest versions but the
newest go to files in ``folder`` (the run's own; removed at the end), and come back from there when a leaf or the
strategy asks for one (mapped, so a strategy that reads a few of a version's arrays reads only their pages):
memory stays bounded whatever K. The bits are the same either way.

With ``shared`` (leaves that share this machine map versions instead of receiving them, ``common.bulk_parent``)
each version lives in a slot of one ring of shared memory of at most ``memory_bytes``, or, once every slot is
taken, in a file of that folder (``aggregation.shared_versions``): a strategy writes the next version straight into
it (``fresh``), a leaf is sent a handle of it (``handle``) and maps it, and nothing is spilled afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator

import numpy as np
from nvflare.fuel.utils.fobs.datum import Datum

from aggregation.shared_versions import Place, SharedVersions
from common.packed_weights import LAYOUT, PACKED, PackedArrays, blob_bytes, pack, pack_into, packed_bytes, views
from common.shared_ring import SharedRing, map_readonly

Weights = dict[str, np.ndarray]


class VersionStore:
    """Args:
    memory_bytes: the bytes of versions kept in memory; past it the oldest (never the newest) go to disk.
    folder: gives the folder spilled versions go to (called once, at the first spill); None: a temporary one.
    shared: keep the versions where leaves on this machine map them (see the module docstring).
    """

    def __init__(self, memory_bytes: float, folder: Callable[[], str] | None = None, shared: bool = False):
        self.memory_bytes = memory_bytes
        self.shared = shared
        self._folder_of = folder
        self._folder = ""
        self._layout: dict[int, str] = {}  # version -> its layout (``common.packed_weights.layout_text``)
        self._memory: dict[int, tuple[object, Weights]] = {}  # version -> (its blob, its arrays: views of it)
        self._disk: dict[int, int] = {}  # spilled version -> its bytes
        self._in_memory = 0  # bytes of the blobs in memory (a shared store: of its slots, leased ones included)
        self._on_disk = 0  # bytes of the spilled ones (a shared store: of its files)
        self.peak = (0, 0, 0)  # the most versions kept at once, the most bytes in memory, the most on disk
        self._lock = threading.RLock()  # the applier's thread keeps versions, the replies' threads lease them
        self._shared = SharedVersions(memory_bytes, lambda: self._spill_folder()) if shared else None
        self._fresh: dict[int, Place] = {}  # id of a blob ``fresh`` handed out -> its place (until it is ``put``)

    def __contains__(self, version: int) -> bool:
        return version in self._layout

    def __len__(self) -> int:
        return len(self._layout)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._layout))

    def keys(self):
        return self._layout.keys()

    # -- shared memory ------------------------------------------------------------------------------------------
    def ring(self) -> SharedRing | None:
        """The ring versions are kept in (made at the first call), or None (not ``shared``, or it failed:
        ``ring_error``)."""
        return self._shared.ring() if self._shared is not None else None

    @property
    def ring_error(self) -> str:
        return self._shared.ring_error if self._shared is not None else ""

    def fresh(self, layout_text: str) -> PackedArrays:
        """New arrays of a layout, for a strategy to write the next version into: where the version will be kept
        (a slot or a file, shared; ``put`` then keeps them without a copy), or a new buffer."""
        nbytes = blob_bytes(layout_text)
        if self._shared is None:
            return views({LAYOUT: layout_text}, bytearray(nbytes))
        with self._lock:
            for abandoned in self._fresh.values():  # handed out for a version never kept
                self._shared.free(abandoned)
            buffer, place = self._shared.new_blob(nbytes)
            arrays = views({LAYOUT: layout_text}, buffer)
            self._fresh = {id(arrays.blob): place}
            return arrays

    def handle(self, version: int, child: str) -> dict | None:
        """A version as ``child`` (a leaf that maps the shared versions) is sent it: a handle of its slot or file,
        the version leased to the child until it reports it holds it no more; None when it is not shared."""
        if self._shared is None or version not in self._layout:
            return None
        return self._shared.handle(version, self._layout[version], child)

    def held(self, child: str, versions: set[int]) -> None:
        """``child`` holds (or views) ``versions`` and no other: its leases of the others end."""
        if self._shared is not None:
            with self._lock:
                for place in self._shared.held(child, versions):
                    self._account(place, -1)

    def _account(self, place: Place, sign: int) -> None:
        """A shared place taken (+1) or freed (-1), in the memory or disk count (under the lock)."""
        if place.slot is not None:
            self._in_memory += sign * place.nbytes
        else:
            self._on_disk += sign * place.nbytes

    # -- versions -----------------------------------------------------------------------------------------------
    def put(self, version: int, weights: Weights) -> Weights:
        """Keep ``weights`` as ``version`` (one copy, none when they are already the views of a blob of their own:
        a ``fresh`` one's, or a writable buffer, as a strategy that writes a version into ``fresh_like``'s arrays
        returns them); returns its arrays as kept (views of its blob)."""
        with self._lock:
            self.discard(version)
            own = isinstance(weights, PackedArrays) and weights.layout
            place = self._fresh.pop(id(weights.blob), None) if own else None
            if place is not None:  # written straight where it is kept
                blob, arrays, layout_text = weights.blob, weights, weights.layout
            else:
                blob, arrays, layout_text, place = self._keep(weights)
            self._layout[version] = layout_text
            self._memory[version] = (blob, arrays)
            if place is not None:
                self._shared.keep(version, place)
                self._account(place, +1)
            else:
                self._in_memory += len(blob)
                self._spill(newest=version)
            self._note()
            return arrays

    def _keep(self, weights: Weights) -> tuple[object, Weights, str, Place | None]:
        """(blob, arrays, layout, place) for weights given as they are: copied where a shared version is kept, kept
        as they are (the views of a writable buffer of their own), or packed into a new buffer."""
        if self._shared is not None:
            places: list[Place] = []

            def allocate(nbytes: int):
                buffer, place = self._shared.new_blob(nbytes)
                places.append(place)
                return buffer

            layout_text, blob = pack_into(weights, allocate)
            return blob, views({LAYOUT: layout_text}, blob), layout_text, places[0]
        if isinstance(weights, PackedArrays) and weights.layout and isinstance(weights.blob, bytearray):
            return weights.blob, weights, weights.layout, None
        packed = pack(weights)
        return packed_bytes(packed), views(packed), packed[LAYOUT], None

    def get(self, version: int) -> Weights:
        """A version's arrays (a spilled one mapped read-only from its file: only the pages read are read)."""
        with self._lock:
            kept = self._memory.get(version)
            if kept is not None:
                return kept[1]
            if version not in self._disk:
                raise KeyError(f"model version {version} is not kept")
            return views(self._packed_dict(version, self._read(version)))

    def packed(self, version: int) -> dict:
        """A version as it travels to the leaves (``common.packed_weights``), without copying it."""
        with self._lock:
            kept = self._memory.get(version)
            return self._packed_dict(version, kept[0] if kept is not None else self._read(version))

    def discard(self, version: int) -> None:
        with self._lock:
            if self._layout.pop(version, None) is None:
                return
            kept = self._memory.pop(version, None)
            if self._shared is not None:
                freed = self._shared.discard(version)  # a leased one, once its leaf lets go: ``held``
                if freed is not None:
                    self._account(freed, -1)
            elif kept is not None:
                self._in_memory -= len(kept[0])
            spilled = self._disk.pop(version, None)
            if spilled is not None:
                self._on_disk -= spilled
                os.remove(self._path(version))

    def close(self, spilled_only: bool = False) -> None:
        """Forget every version (``spilled_only``: those on disk; the newest never is) and remove the spill
        folder."""
        with self._lock:
            for version in list(self._disk if spilled_only else self._layout):
                self.discard(version)
            if self._folder:  # a shared version's file goes too: its mappings here stay valid
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

    def _spill_folder(self) -> str:
        if not self._folder:
            folder = self._folder_of() if self._folder_of is not None else ""
            if folder:
                os.makedirs(folder, exist_ok=True)
            self._folder = folder or tempfile.mkdtemp(prefix="spilled-versions-")
        return self._folder

    def _path(self, version: int) -> str:
        return os.path.join(self._spill_folder(), f"{version}.bin")

    def _read(self, version: int) -> memoryview:
        """A spilled version's blob, mapped read-only from its file (a strategy reads a base version's data
        statistics only, a few pages of it; the mapping outlives the file's removal)."""
        return map_readonly(self._path(version), self._disk[version])

    def _packed_dict(self, version: int, blob) -> dict:
        return {PACKED: 1, LAYOUT: self._layout[version], "data": Datum.blob_datum(blob)}

    def _note(self) -> None:
        peak = self.peak
        self.peak = (max(len(self._layout), peak[0]), max(self._in_memory, peak[1]), max(self._on_disk, peak[2]))

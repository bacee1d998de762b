"""The server's model versions, each kept once as the blob it travels in, the oldest spilled to disk past a cap.

An asynchronous run keeps every version a device in flight still trains: with the paper's delays and K = 2,000,
about a thousand versions at once. Each is kept as one packed buffer (``common.packed_weights``), and its arrays
are views of that buffer, so a version costs its size once (it used to cost twice: its arrays and the packed copy
the leaves are sent), and sending it to a leaf copies nothing. Past ``memory_bytes`` the oldest versions but the
newest go to files in ``folder`` (the run's own; removed at the end), and come back from there when a leaf or the
strategy asks for one: memory stays bounded whatever K, at the price of reading back a version a device released
late trains. The bits are the same either way.

With ``shared`` (leaves that share this machine map versions instead of receiving them, ``simulation.bulk_parent``)
the versions in memory live in the slots of one ring of shared memory (``common.shared_ring``) of at most
``memory_bytes``: a strategy writes the next version straight into a slot (``fresh``), and a leaf is sent a
handle of it (``handle``), or of the file a spilled version is in, which it maps read-only. A version a leaf was
sent a handle of is leased to it until it reports it holds that version no more (``held``): until then it is
never spilled, and its slot or file outlives a discard. A slot is handed out again only once nothing in the
server views it either (``common.shared_ring``: the evaluator may still be scoring a version the run forgot).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator

import numpy as np
from nvflare.fuel.utils.fobs.datum import Datum

from common.packed_weights import LAYOUT, PACKED, PackedArrays, blob_bytes, pack, pack_into, packed_bytes, views
from common.shared_ring import SharedRing, Slot, file_handle, map_readonly

Weights = dict[str, np.ndarray]
MIN_SLOTS = 2  # the newest version, and the next one being made, whatever the cap


class VersionStore:
    """Args:
    memory_bytes: the bytes of versions kept in memory; past it the oldest (never the newest) go to disk.
    folder: gives the folder spilled versions go to (called once, at the first spill); None: a temporary one.
    shared: keep the versions in memory in a ring of shared memory, for leaves that map them (see the module
        docstring).
    """

    def __init__(self, memory_bytes: float, folder: Callable[[], str] | None = None, shared: bool = False):
        self.memory_bytes = memory_bytes
        self.shared = shared
        self._folder_of = folder
        self._folder = ""
        self._layout: dict[int, str] = {}  # version -> its layout (``common.packed_weights.layout_text``)
        self._memory: dict[int, tuple[object, Weights]] = {}  # version -> (its blob, its arrays: views of it)
        self._disk: dict[int, int] = {}  # spilled version -> its bytes
        self._in_memory = 0  # bytes of the blobs in memory (and of slots a leaf may still view)
        self._on_disk = 0  # bytes of the spilled ones
        self.peak = (0, 0, 0)  # the most versions kept at once, the most bytes in memory, the most on disk
        self._lock = threading.RLock()  # the applier's thread keeps versions, the replies' threads lease them
        self._ring: SharedRing | None = None
        self.ring_error = ""  # why versions are not in shared memory although ``shared`` ("": they are)
        self._slots: dict[int, Slot] = {}  # version -> the ring slot it is kept in
        self._fresh: dict[int, Slot] = {}  # id of a blob ``fresh`` handed out -> its slot (until it is ``put``)
        self._leases: dict[int, set[str]] = {}  # version -> the children it was sent to as a handle
        self._pinned: dict[int, tuple[int, Slot]] = {}  # slot index -> (the version gone from it, its slot): leased
        self._doomed: set[int] = set()  # discarded versions whose spill file a leased child may still map

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
        with self._lock:
            if self.shared and self._ring is None and not self.ring_error:
                try:
                    self._ring = SharedRing("versions", self.memory_bytes, min_slots=MIN_SLOTS)
                except OSError as ex:
                    self.ring_error = f"no shared memory on the server ({ex.strerror or ex})"
            return self._ring

    def _slot(self, nbytes: int, newest: int | None) -> Slot | None:
        """A free slot of the ring for a blob of ``nbytes``; when every slot holds a version, the oldest of them
        that no leaf may view (never ``newest``) is spilled to make room (under the lock)."""
        ring = self.ring()
        if ring is None:
            return None
        slot = ring.acquire(nbytes)
        for version in sorted(self._slots):
            if slot is not None or ring.slot_bytes < nbytes:
                break
            if version != newest and version not in self._leases:
                self._spill_one(version)
                slot = ring.acquire(nbytes)
        return slot

    def fresh(self, layout_text: str) -> PackedArrays:
        """New arrays of a layout, for a strategy to write the next version into: views of a slot of the ring
        (``put`` then keeps them there without a copy), or of a new buffer."""
        nbytes = blob_bytes(layout_text)
        with self._lock:
            for abandoned in self._fresh.values():  # handed out for a version never kept: free once unviewed
                self._ring.release(abandoned.index, abandoned.generation)
            self._fresh = {}
            slot = self._slot(nbytes, max(self._layout, default=None)) if self.shared else None
            if slot is None:
                return views({LAYOUT: layout_text}, bytearray(nbytes))
            arrays = views({LAYOUT: layout_text}, slot.data)
            self._fresh[id(arrays.blob)] = slot
            return arrays

    def handle(self, version: int, child: str) -> dict | None:
        """A version as ``child`` (a leaf that maps this ring) is sent it: a handle of its slot, or of its spill
        file; None when it is kept in neither (it then travels packed). The version is leased to ``child``."""
        with self._lock:
            slot = self._slots.get(version)
            if slot is not None:
                found = self._ring.handle(slot, self._layout[version])
            elif version in self._disk:
                found = file_handle(os.path.abspath(self._path(version)), self._disk[version], self._layout[version])
            else:
                return None
            self._leases.setdefault(version, set()).add(child)
            return found

    def held(self, child: str, versions: set[int]) -> None:
        """``child`` holds (or views) ``versions`` and no other: its leases of the others end."""
        with self._lock:
            for version in [v for v, children in self._leases.items() if child in children and v not in versions]:
                children = self._leases[version]
                children.discard(child)
                if not children:
                    del self._leases[version]
                    self._unpin(version)

    def _unpin(self, version: int) -> None:
        """No child views a version gone from the store: its slot and its file go too (under the lock)."""
        for index, (gone, slot) in list(self._pinned.items()):
            if gone == version:
                del self._pinned[index]
                self._in_memory -= slot.length
                self._ring.release(slot.index, slot.generation)
        if version in self._doomed:
            self._doomed.discard(version)
            if version not in self._layout:
                os.remove(self._path(version))

    def _free_slot(self, version: int) -> None:
        """A version leaves its slot (spilled or discarded); a leaf that may view it keeps it (under the lock)."""
        slot = self._slots.pop(version, None)
        if slot is None:
            return
        if version in self._leases:
            self._pinned[slot.index] = (version, slot)
            self._in_memory += slot.length
        else:
            self._ring.release(slot.index, slot.generation)

    # -- versions -----------------------------------------------------------------------------------------------
    def put(self, version: int, weights: Weights) -> Weights:
        """Keep ``weights`` as ``version`` (one copy, none when they are already the views of a blob of their own:
        a ``fresh`` slot's, or a writable buffer, as a strategy that writes a version into ``fresh_like``'s
        arrays returns them); returns its arrays as kept (views of its blob)."""
        with self._lock:
            self.discard(version)
            own = isinstance(weights, PackedArrays) and weights.layout
            slot = self._fresh.pop(id(weights.blob), None) if own else None
            if slot is not None and slot.data is weights.blob:  # written straight into a slot
                blob, arrays, layout_text = weights.blob, weights, weights.layout
            else:
                blob, arrays, layout_text, slot = self._keep(weights)
            if slot is not None:
                self._slots[version] = slot
            self._layout[version] = layout_text
            self._memory[version] = (blob, arrays)
            self._in_memory += len(blob)
            self._spill(newest=version)
            self._note()
            return arrays

    def _keep(self, weights: Weights) -> tuple[object, Weights, str, Slot | None]:
        """(blob, arrays, layout, slot) for weights given as they are: copied into a slot of the ring (shared),
        kept as they are (the views of a writable buffer of their own), or packed into a new buffer."""
        if self.shared:
            slots: list[Slot] = []

            def allocate(nbytes: int):
                slot = self._slot(nbytes, max(self._layout, default=None))
                if slot is not None:
                    slots.append(slot)
                return slot.data if slot is not None else None

            written = pack_into(weights, allocate)
            if written is not None:
                layout_text, blob = written
                return blob, views({LAYOUT: layout_text}, blob), layout_text, slots[0]
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
            if kept is not None:
                self._in_memory -= len(kept[0])
                self._free_slot(version)
            spilled = self._disk.pop(version, None)
            if spilled is not None:
                self._on_disk -= spilled
                if version in self._leases:  # a leaf may not have mapped it yet: removed when its lease ends
                    self._doomed.add(version)
                else:
                    os.remove(self._path(version))

    def close(self, spilled_only: bool = False) -> None:
        """Forget every version (``spilled_only``: those on disk; the newest never is) and remove the spill
        folder."""
        with self._lock:
            for version in list(self._disk if spilled_only else self._layout):
                self.discard(version)
            if self._folder:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = ""
                self._doomed = set()

    # -- disk ---------------------------------------------------------------------------------------------------
    def _spill(self, newest: int) -> None:
        if self._in_memory <= self.memory_bytes:
            return
        for version in sorted(self._memory):  # the oldest first: the last a device in flight still trains
            if self._in_memory <= self.memory_bytes:
                break
            if version == newest or version in self._leases:  # a leaf may be reading it where it is
                continue
            self._spill_one(version)

    def _spill_one(self, version: int) -> None:
        blob, _ = self._memory.pop(version)
        fd = os.open(self._path(version), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the run's user's only
        with open(fd, "wb") as f:
            f.write(blob)
        self._in_memory -= len(blob)
        self._disk[version] = len(blob)
        self._on_disk += len(blob)
        self._free_slot(version)

    def _path(self, version: int) -> str:
        if not self._folder:
            folder = self._folder_of() if self._folder_of is not None else ""
            if folder:
                os.makedirs(folder, exist_ok=True)
            self._folder = folder or tempfile.mkdtemp(prefix="spilled-versions-")
        return os.path.join(self._folder, f"{version}.bin")

    def _read(self, version: int) -> memoryview:
        """A spilled version's blob, mapped read-only from its file (a strategy reads a base version's data
        statistics only, a few pages of it; the mapping outlives the file's removal)."""
        return map_readonly(self._path(version), self._disk[version])

    def _packed_dict(self, version: int, blob) -> dict:
        return {PACKED: 1, LAYOUT: self._layout[version], "data": Datum.blob_datum(blob)}

    def _note(self) -> None:
        peak = self.peak
        self.peak = (max(len(self._layout), peak[0]), max(self._in_memory, peak[1]), max(self._on_disk, peak[2]))

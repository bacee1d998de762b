"""Where the server keeps a version's blob when leaves map versions (``aggregation.version_store`` with ``shared``):
a slot of one ring of shared memory (``common.shared_ring``), or, when every slot is taken, a file of the run's
spill folder, mapped here and written in place. Either way the strategy writes the version straight into it, and a
leaf maps the same bytes read-only from a handle (``handle``): nothing is copied, nothing is spilled later.

* **Slots first.** The ring holds at most ``max_bytes`` (``--version-memory-mb``); a version made while every
  slot holds one goes to a file instead: its pages are the page cache's, which the kernel writes back to disk and
  reclaims under memory pressure. No version is copied from a slot to a file to make room. A file whose version
  is gone is kept, mapped, for a later version of its size (as a slot is): a new file's pages cost their faults
  and zeroing every time (44.7 MB for ResNet-18: more than the version's arithmetic).
* **Leases.** A version sent to a leaf as a handle is leased to it until the leaf reports it holds the version no
  more (``held``): until then its slot is not reused and its file not removed, even once the run forgot it.
* **Nothing read after reuse.** A slot is handed out again only once nothing in the server views it either (the
  evaluator may still be scoring a version the run forgot: ``common.shared_ring``); a removed file's mapping stays
  valid for whoever holds it.
"""

from __future__ import annotations

import itertools
import mmap
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from common.shared_ring import SharedRing, Slot, file_handle

MIN_SLOTS = 2  # the newest version, and the next one being made, whatever the cap


@dataclass(frozen=True)
class Place:
    """Where one blob lives: a ``slot`` of the ring, or a file at ``path`` (``mapped`` here)."""

    nbytes: int
    slot: Slot | None = None
    path: str = ""
    mapped: mmap.mmap | None = None


_SPARE_REFERENCES = 2  # sys.getrefcount of a spare file's mapping that nothing views: its place's, and the call's


class SharedVersions:
    """Args:
    max_bytes: the most bytes of slots (the ring's size).
    folder: gives the run's spill folder (called at the first file).
    """

    def __init__(self, max_bytes: float, folder: Callable[[], str]):
        self.max_bytes = max_bytes
        self._folder = folder
        self._ring: SharedRing | None = None
        self.ring_error = ""  # why there is no ring ("": there is, or none was asked for yet)
        self._places: dict[int, Place] = {}  # version -> where it lives
        self._leases: dict[int, set[str]] = {}  # version -> the children it was sent to as a handle
        self._gone: list[tuple[int, Place]] = []  # (version, place) forgotten by the run, still leased
        self._spare: list[Place] = []  # files no version is kept in, for later versions of their size
        self._names = itertools.count()
        self._lock = threading.RLock()  # the applier keeps versions; the replies' threads lease them

    def ring(self) -> SharedRing | None:
        """The ring (made at the first call), or None when it could not be made (``ring_error``)."""
        with self._lock:
            if self._ring is None and not self.ring_error:
                try:
                    self._ring = SharedRing("versions", self.max_bytes, min_slots=MIN_SLOTS)
                except OSError as ex:
                    self.ring_error = f"no shared memory on the server ({ex.strerror or ex})"
            return self._ring

    def new_blob(self, nbytes: int) -> tuple[memoryview, Place]:
        """A writable buffer for a blob of ``nbytes``: a free slot, else a new file of the spill folder."""
        ring = self.ring()
        slot = ring.acquire(nbytes) if ring is not None else None
        if slot is not None:
            return slot.data, Place(nbytes, slot=slot)
        with self._lock:
            for index, place in enumerate(self._spare):
                if place.nbytes == nbytes and sys.getrefcount(place.mapped) <= _SPARE_REFERENCES:
                    del self._spare[index]
                    return memoryview(place.mapped), place
        folder = self._folder()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"blob-{os.getpid()}-{next(self._names)}.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)  # the run's user's only
        try:
            os.ftruncate(fd, max(1, nbytes))
            mapped = mmap.mmap(fd, max(1, nbytes))
        finally:
            os.close(fd)
        return memoryview(mapped)[:nbytes], Place(nbytes, path=path, mapped=mapped)

    def keep(self, version: int, place: Place) -> None:
        with self._lock:
            self._places[version] = place

    def handle(self, version: int, layout: str, child: str) -> dict | None:
        """``version`` as ``child`` is sent it (a handle of its slot or its file), leased to the child; None when
        it is not kept here."""
        with self._lock:
            place = self._places.get(version)
            if place is None:
                return None
            self._leases.setdefault(version, set()).add(child)
            if place.slot is not None:
                return self._ring.handle(place.slot, layout)
            return file_handle(place.path, place.nbytes, layout)

    def held(self, child: str, versions: set[int]) -> list[Place]:
        """``child`` holds (or views) ``versions`` and no other: its leases of the others end. Returns the places
        of forgotten versions this freed (their slots are free, their files removed)."""
        freed = []
        with self._lock:
            for version in [v for v, children in self._leases.items() if child in children and v not in versions]:
                children = self._leases[version]
                children.discard(child)
                if not children:
                    del self._leases[version]
                    gone = [p for v, p in self._gone if v == version]
                    self._gone = [(v, p) for v, p in self._gone if v != version]
                    for place in gone:
                        self.free(place)
                    freed += gone
        return freed

    def discard(self, version: int) -> Place | None:
        """The run forgot ``version``: its place is freed (and returned), unless a leaf may still view it (then
        once it lets go: ``held``; None now)."""
        with self._lock:
            place = self._places.pop(version, None)
            if place is None:
                return None
            if version in self._leases:
                self._gone.append((version, place))
                return None
            self.free(place)
            return place

    def free(self, place: Place) -> None:
        """A place no version is kept in: a slot or a file is free again (taken once nothing here views it)."""
        if place.slot is not None:
            self._ring.release(place.slot.index, place.slot.generation)
        elif place.path:
            with self._lock:
                self._spare.append(place)

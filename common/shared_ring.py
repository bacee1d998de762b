"""Bulk arrays beside NVFlare's wire: a ring of fixed-size slots in shared memory, written by the process that owns
it and read by another process of the same machine and user.

NVFlare stays the control plane: every message still travels on its wire. Only the bulk arrays (a device's diff
up, a model version down) may move through a ring, and the message then carries a handle in their place (``handle``:
the slot, its generation, the length, the blob's layout). Who uses a ring, and when, is the bulk link's business
(``simulation.bulk_link`` on a leaf or relay, ``common.bulk_parent`` on the server or a relay).

* **Anonymous, owner-only memory.** A ring is one ``memfd_create`` file, mode 0600, never named in ``/dev/shm``: it
  goes when the last process holding it ends, however it ends (``kill -9`` included), so a killed run leaves
  nothing behind and the next run has nothing to clean. A peer maps it through ``/proc/<owner pid>/fd/<fd>``,
  which the kernel opens only for a process allowed to read the owner's memory (its user, or root) and only as the
  file's mode allows (0600: its user). The ring's first page holds a random ``nonce``; the peer compares it with
  the one the owner's message carried, which proves that it mapped this ring and not another process's file (on
  another machine, or in another pid namespace). The standard library's ``multiprocessing.shared_memory`` is not
  used: its resource tracker unlinks a segment when any process that attached to it exits.
* **Fixed slots.** After the header page come up to ``max_slots`` slots of ``stride`` bytes each (a slot's header,
  its generation and length, then the data), the stride set by the first blob and never changed: no general
  allocator. ``acquire`` hands out the lowest free slot and bumps its generation; ``release`` frees it. The ring
  grows one slot at a time up to ``max_slots``, each slot's pages reserved (``posix_fallocate``) when it is first
  used: a ring that cannot grow (a full tmpfs, a memory or file-size limit) says so at once (``acquire`` returns
  None and ``refusal`` says why), rather than failing later with SIGBUS on a page it touched.
* **Generations.** A peer checks a slot's generation against the handle's before it maps or copies the slot, and
  again after a copy: a slot its owner reused is never read as the one a handle named (``StaleHandle``).
* **Nothing read after reuse.** The owner maps each slot once and hands out views of that mapping; every array
  made from one holds a reference to the mapping, so a released slot is handed out again only once nothing in the
  owner's process views it (its reference count is the ring's own again). A peer maps each blob it views anew,
  and a weak reference to that mapping tells it whether anything there still reads the blob (the link then
  reports the version held, and the owner keeps it).
* **Backends.** ``locator()`` is a dict with a ``kind``; ``attach`` maps a locator of a known kind. A CUDA IPC
  backend (a device buffer per slot, its IPC handle in the locator) would be another kind behind the same
  ``acquire``/``release``/``handle`` on its owner and ``view``/``copy`` on its peer.
"""

from __future__ import annotations

import heapq
import mmap
import os
import secrets
import struct
import sys
import threading
import weakref
from dataclasses import dataclass

HANDLE = "edgesim_bulk_handle"  # the key that marks a handle in place of a packed blob
KIND = "memfd"
FILE_KIND = "file"  # a blob in a file of the same machine (a version spilled to disk), mapped read-only
MAGIC = b"EDGESIM-RING-1\0\0"
PAGE = mmap.PAGESIZE
HEADER_BYTES = PAGE  # the ring's header: MAGIC, the nonce, the stride
SLOT_HEADER = 64  # before a slot's data: its generation and length (the data stays 64-byte aligned)
_RING = struct.Struct("<16s32sQ")  # magic, nonce (hex text), stride
_SLOT = struct.Struct("<QQ")  # generation, length
_RING_REFERENCES = 2  # sys.getrefcount of a slot's mapping that nothing views: the ring's list, and the call's own
_POPULATE = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # a slot read or written whole: its pages at once


class BulkUnavailable(Exception):
    """This process cannot map a peer's ring (the message says why); the link then uses NVFlare's wire."""


class StaleHandle(Exception):
    """A handle names a slot generation the ring no longer holds."""


def boot_id() -> str:
    """This machine's boot id: two processes on two machines never share one."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def is_handle(value) -> bool:
    return isinstance(value, dict) and HANDLE in value


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


@dataclass(frozen=True)
class Slot:
    """A slot acquired for one blob: write the blob into ``data`` (``length`` bytes, writable), send ``handle``.
    The slot is not handed out again while ``data``, or a view of it, is alive here."""

    index: int
    generation: int
    length: int
    data: memoryview


class SharedRing:
    """The owner's side of a ring (see the module docstring).

    A slot released (``release``) is handed out again only once nothing in this process still views it: each slot
    is mapped once, and every view of it (``Slot.data``, a numpy array made from it, a view of one) holds a
    reference to that mapping.

    Args:
        label: a few words for ``/proc/<pid>/fd``'s listing (``memfd:edgesim-<label>``).
        max_bytes: the most bytes its slots may take; the slot count is this over the stride (at least
            ``min_slots``).
        min_slots: the fewest slots it may grow to, whatever ``max_bytes``.
    """

    def __init__(self, label: str, max_bytes: float, min_slots: int = 1):
        self.label = label
        self.max_bytes = max_bytes
        self.min_slots = min_slots
        self.nonce = secrets.token_hex(16)
        self.stride = 0  # set by the first blob
        self.max_slots = 0
        self.refusal = ""  # why the last acquire found no slot ("": it found one)
        if not hasattr(os, "memfd_create"):  # not Linux: the link says so and uses NVFlare's wire
            raise OSError(0, "no memfd_create on this system")
        self._fd = os.memfd_create(f"edgesim-{label}", os.MFD_CLOEXEC)
        self._lock = threading.Lock()
        self._generations: list[int] = []  # per slot grown so far
        self._maps: list[mmap.mmap] = []  # per slot grown so far: its one mapping here
        self._free: list[int] = []  # a heap: the lowest free slot first
        self._released: list[int] = []  # released, but still viewed here when last looked at
        self._grow_error = ""  # why the ring cannot grow past its slots ("": it may)
        try:
            os.fchmod(self._fd, 0o600)
            os.posix_fallocate(self._fd, 0, HEADER_BYTES)
            self._header = mmap.mmap(self._fd, HEADER_BYTES)
        except OSError:
            os.close(self._fd)
            raise
        self._header[: _RING.size] = _RING.pack(MAGIC, self.nonce.encode(), 0)
        self._closer = weakref.finalize(self, _close_all, self._fd, self._header, self._maps)

    def locator(self) -> dict:
        """What a peer needs to map this ring (``attach``), as plain values for a message."""
        return {"kind": KIND, "pid": os.getpid(), "fd": self._fd, "nonce": self.nonce, "boot": boot_id()}

    @property
    def slot_bytes(self) -> int:
        """The largest blob a slot holds (0 before the first blob sets the stride)."""
        return self.stride - SLOT_HEADER if self.stride else 0

    @property
    def grown(self) -> int:
        """Slots grown so far (their pages reserved)."""
        return len(self._generations)

    @property
    def in_use(self) -> int:
        """Slots acquired and not yet free (released ones still viewed here count)."""
        with self._lock:
            self._sweep()
            return len(self._generations) - len(self._free)

    def has_room(self) -> bool:
        """Whether ``acquire`` would find a slot now (a free one, or one more it may grow)."""
        with self._lock:
            self._sweep()
            grows = not self._grow_error and (not self.stride or len(self._generations) < self.max_slots)
            return bool(self._free) or grows

    def acquire(self, nbytes: int) -> Slot | None:
        """A free slot for a blob of ``nbytes``, its generation bumped; None when there is none (``refusal``)."""
        with self._lock:
            if not self.stride:
                self.stride = _round_up(SLOT_HEADER + max(1, nbytes), PAGE)
                self.max_slots = max(self.min_slots, int(self.max_bytes // self.stride))
                self._header[: _RING.size] = _RING.pack(MAGIC, self.nonce.encode(), self.stride)
            if nbytes > self.slot_bytes:
                return self._refuse(f"a blob of {nbytes} bytes exceeds the ring's slots of {self.slot_bytes}")
            self._sweep()
            if self._free:
                index = heapq.heappop(self._free)
            elif len(self._generations) >= self.max_slots:
                return self._refuse(f"all {self.max_slots} slots of {self.stride / 2**20:.2f} MB are in use")
            elif self._grow_error:
                return self._refuse(self._grow_error)
            else:
                index = self._grow()
                if index is None:
                    return self._refuse(self._grow_error)
            self._generations[index] += 1
            generation = self._generations[index]
            mapped = self._maps[index]
            mapped[: _SLOT.size] = _SLOT.pack(generation, nbytes)
            self.refusal = ""
            return Slot(index, generation, nbytes, memoryview(mapped)[SLOT_HEADER : SLOT_HEADER + nbytes])

    def _refuse(self, why: str) -> None:
        self.refusal = why
        return None

    def _viewed(self, index: int) -> bool:
        """Whether anything here still views slot ``index``: references to its mapping beyond the ring's own."""
        return sys.getrefcount(self._maps[index]) > _RING_REFERENCES

    def _sweep(self) -> None:
        """Released slots that nothing here views any more become free (under the lock)."""
        if self._released:
            still = []
            for index in self._released:
                if self._viewed(index):
                    still.append(index)
                else:
                    heapq.heappush(self._free, index)
            self._released = still

    def _grow(self) -> int | None:
        """One more slot, its pages reserved and mapped; None when the memory cannot grow (``_grow_error`` says
        why)."""
        index = len(self._generations)
        offset = HEADER_BYTES + index * self.stride
        try:
            os.posix_fallocate(self._fd, offset, self.stride)
        except OSError as ex:
            try:
                os.ftruncate(self._fd, offset)  # nothing half-grown is left for a peer to map
            except OSError:
                pass
            self._grow_error = (
                f"shared memory cannot grow past {offset / 2**20:.1f} MB ({index} slots): {ex.strerror or ex}"
            )
            return None
        self._maps.append(mmap.mmap(self._fd, self.stride, offset=offset, flags=_POPULATE))
        self._generations.append(0)
        return index

    def release(self, index: int, generation: int) -> None:
        """Free a slot (once nothing here views it); a release of an older generation (the slot was handed out
        again since) does nothing."""
        with self._lock:
            current = index < len(self._generations) and self._generations[index] == generation
            if current and index not in self._released and index not in self._free:
                self._released.append(index)

    def handle(self, slot: Slot, layout: str) -> dict:
        """The slot as a message carries it, for a blob of ``layout`` (``common.packed_weights.layout_text``)."""
        return {
            HANDLE: KIND,
            "slot": slot.index,
            "generation": slot.generation,
            "length": slot.length,
            "layout": layout,
        }

    def close(self) -> None:
        """Close the ring's file (mappings still viewed stay valid until they go; the memory goes with the last)."""
        self._closer()


def _close_all(fd: int, header: mmap.mmap, maps: list[mmap.mmap]) -> None:
    for m in [header, *maps]:
        try:
            m.close()
        except BufferError:  # still viewed: unmapped when the views go
            pass
    try:
        os.close(fd)
    except OSError:
        pass


class PeerRing:
    """A ring another process owns, mapped read-only (see the module docstring).

    Raises ``BulkUnavailable`` naming the reason when it cannot be mapped here.
    """

    def __init__(self, locator: dict):
        if locator.get("kind") != KIND:
            raise BulkUnavailable(f"a ring of kind {locator.get('kind')!r} (this process maps {KIND!r})")
        if locator.get("boot") != boot_id():
            raise BulkUnavailable("the peer runs on another machine (another boot id)")
        pid, fd = int(locator["pid"]), int(locator["fd"])
        try:
            self._fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as ex:
            raise BulkUnavailable(f"cannot open process {pid}'s ring: {ex.strerror or ex}") from ex
        try:
            st = os.fstat(self._fd)
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise BulkUnavailable(
                    f"the ring is not this user's alone (uid {st.st_uid}, mode {st.st_mode & 0o777:o})"
                )
            if st.st_size < HEADER_BYTES:
                raise BulkUnavailable("the file named is not a ring")
            self._header = mmap.mmap(self._fd, HEADER_BYTES, prot=mmap.PROT_READ)
            magic, nonce, _ = _RING.unpack_from(self._header)
            if magic != MAGIC or nonce.decode(errors="replace") != locator.get("nonce"):
                raise BulkUnavailable("the ring mapped is not the one named (its nonce differs)")
        except BaseException:
            os.close(self._fd)
            raise
        self._lock = threading.Lock()
        self._copy_maps: dict[int, mmap.mmap] = {}  # slot -> a mapping kept for copies (never handed out)
        self._closer = weakref.finalize(self, _close_all, self._fd, self._header, [])

    def _map(self, index: int, flags: int) -> mmap.mmap:
        stride = _RING.unpack_from(self._header)[2]
        try:
            return mmap.mmap(self._fd, stride, offset=HEADER_BYTES + index * stride, flags=flags, prot=mmap.PROT_READ)
        except (ValueError, OSError) as ex:  # past the ring's end: no such slot
            raise StaleHandle(f"slot {index} is not in the ring ({ex})") from ex

    @staticmethod
    def _check(mapped: mmap.mmap, handle: dict) -> None:
        generation, length = _SLOT.unpack_from(mapped)
        if generation != handle["generation"] or length != handle["length"]:
            raise StaleHandle(
                f"slot {handle['slot']} holds generation {generation}, not the handle's {handle['generation']}"
            )

    def view(self, handle: dict) -> memoryview:
        """The slot's blob, read-only, without a copy, through a mapping of its own (``view(...).obj``: a weak
        reference to it tells whether anything here still views the blob; its owner must keep the slot for as
        long: the link's business)."""
        mapped = self._map(int(handle["slot"]), mmap.MAP_SHARED)
        self._check(mapped, handle)
        return memoryview(mapped)[SLOT_HEADER : SLOT_HEADER + int(handle["length"])]

    def copy(self, handle: dict, into=None):
        """The slot's blob, copied into this process's memory (a new ``bytearray``, or ``into``, a writable buffer of
        its length); the generation is checked before and after, so the copy is the blob the handle named, whatever
        its owner does with the slot afterwards."""
        index = int(handle["slot"])
        with self._lock:
            mapped = self._copy_maps.get(index)
            if mapped is None:
                mapped = self._copy_maps[index] = self._map(index, _POPULATE)
        self._check(mapped, handle)
        blob = memoryview(mapped)[SLOT_HEADER : SLOT_HEADER + int(handle["length"])]
        if into is None:
            data = bytearray(blob)
        else:
            data = into
            memoryview(into)[:] = blob
        del blob
        self._check(mapped, handle)
        return data

    def close(self) -> None:
        with self._lock:
            maps, self._copy_maps = list(self._copy_maps.values()), {}
        for m in maps:
            m.close()
        self._closer()


def file_handle(path: str, length: int, layout: str) -> dict:
    """A blob kept in a file of this machine (a version spilled to disk) as a message carries it."""
    return {HANDLE: FILE_KIND, "path": path, "length": length, "layout": layout}


def map_file(handle: dict) -> memoryview:
    """A file handle's blob, mapped read-only (the file may be removed afterwards: the mapping stays). The file
    must be this user's alone, as a ring is."""
    try:
        fd = os.open(handle["path"], os.O_RDONLY | os.O_CLOEXEC)
    except OSError as ex:
        raise BulkUnavailable(f"cannot open {handle['path']}: {ex.strerror or ex}") from ex
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size < int(handle["length"]):
            raise BulkUnavailable(f"{handle['path']} is not this user's alone, or is short")
        return _mapped(fd, int(handle["length"]))
    finally:
        os.close(fd)  # the mapping keeps the file's pages


def map_readonly(path: str, length: int) -> memoryview:
    """The first ``length`` bytes of a file of this process's own, mapped read-only."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _mapped(fd, length)
    finally:
        os.close(fd)


def _mapped(fd: int, length: int) -> memoryview:
    return memoryview(mmap.mmap(fd, length, prot=mmap.PROT_READ)) if length else memoryview(b"")


def attach(locator: dict) -> PeerRing:
    """Map a peer's ring from its locator (``SharedRing.locator``); ``BulkUnavailable`` says why not."""
    return PeerRing(locator)

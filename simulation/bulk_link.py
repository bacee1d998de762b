"""A leaf's (or relay's) bulk link to its parent: its diffs up, and the model versions it receives, through shared
memory when the parent shares this machine and user (``common.shared_ring``); NVFlare's wire otherwise.

Detected, not configured (``--bulk auto``): with its first report the node offers its ring (``BULK``: its
locator, with the ring's nonce). A parent that maps it and reads the same nonce answers with its own ring's
locator (a relay client still settling its own link answers ``later``: the node offers again); the node maps that one
and checks its nonce too, and says so in its next report (``ready``). A pack's server answers with each run's ring
(run 0's as ``ring``, a later run's in ``runs``), each mapped here, or with ``None`` for its ring: diffs go up through
shared memory, versions come on the wire (``common.bulk_parent``). From then on:

* **up**: each diff is written once, into a slot of the node's ring, as the report is made (``pack_diff``); the
  report carries the slot's handle. The parent copies it on receipt, so the slots of a report are free again once
  its reply has come (``on_reply``). A report takes as many diffs as the ring has slots; the rest go in the next
  report, at once (``VersionedUpdater``). A diff that finds no slot because the ring cannot grow (a memory limit)
  goes on the wire, and the link says so once;
* **down**: a version the parent sends as a handle is mapped read-only where the server keeps it (a slot of its
  ring, or a file of its run folder): no copy (``weights``; in a pack, from the ring of the version's run). The
  node reports every version it still views, besides those it holds (``held``, by run): the parent never reuses
  their memory before.

Whatever fails (the parent does not answer the offer: NVFlare's own; a ring that cannot be mapped; a handle that
cannot be read) puts the link on the wire for the rest of the run, said once, and tells the parent
(``ready`` False, with the reason). ``--bulk wire``, or ``EDGESIM_BULK=wire`` in a site's environment, never offers.
The bits are the same either way: the same blobs, byte for byte.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

from common.packed_weights import (
    LAYOUT,
    PACKED,
    is_packed,
    pack_blob_into,
    pack_into,
    packed_bytes,
    packed_or_none,
    unpack,
    views,
)
from common.protocol import DeviceUpdate
from common.shared_ring import (
    FILE_KIND,
    HANDLE,
    BulkUnavailable,
    PeerRing,
    SharedRing,
    Slot,
    StaleHandle,
    attach,
    is_handle,
    map_file,
)

SITE_OVERRIDE = "EDGESIM_BULK"  # a site's environment may force its links onto the wire: EDGESIM_BULK=wire
RING_BYTES = 64 * 2**20  # a node's ring for its diffs: the most bytes of diffs one report carries this way
MIN_SLOTS = 2  # ... and at least this many diffs, however large


def wire_bytes(u: DeviceUpdate | dict) -> int:
    """The size of an update's diff on the wire (a child's entry: its blob as it came; a handle: none)."""
    if isinstance(u, DeviceUpdate):
        return sum(getattr(a, "nbytes", 0) for a in (u.diff or {}).values())
    diff = u.get("diff")
    return len(packed_bytes(diff)) if diff and not is_handle(diff) else 0


def site_mode(mode: str) -> tuple[str, str]:
    """The mode this site uses, and why it differs from ``mode`` ("" when it does not): ``EDGESIM_BULK=wire`` in
    its environment turns shared memory off here, whatever the job says."""
    override = os.environ.get(SITE_OVERRIDE, "").strip().lower()
    if override == "wire" and mode != "wire":
        return "wire", f"{SITE_OVERRIDE}=wire in this site's environment"
    return mode, ""


class LeafBulk:
    """Args:
    mode: ``auto`` (shared memory when the parent shares this machine, else the wire), ``shm`` (the same: the
        server stops the run if it cannot be had) or ``wire`` (NVFlare's wire only).
    log: where the link's one-line news go (its choice, a fallback).
    ring_bytes: the most bytes of diffs one report carries through the ring.
    """

    def __init__(self, mode: str = "auto", log: Callable[[str], None] = print, ring_bytes: int = RING_BYTES):
        self.mode, self.reason = site_mode(mode)
        self.log = log
        self.ring_bytes = ring_bytes
        self.state = "wire" if self.mode == "wire" else "new"  # new -> offered (-> again -> offered) -> up, or wire
        self._word: dict | None = None  # what the next report tells the parent (once)
        if self.state == "wire":
            self._word = {"ready": False, "reason": self.reason or "--bulk wire"}
        self._ring: SharedRing | None = None
        self._parents: dict[int, PeerRing] = {}  # run -> the ring its versions come from (run 0: a standalone job's)
        self.parent_locator: dict | None = None  # run 0's ring (a relay passes it on)
        self._sent: list[Slot] = []  # the slots of the last report's diffs: free once its reply has come
        self._viewed: dict[tuple[int, int], weakref.ref] = {}  # (run, version) -> its mapping (alive: still viewed)
        self._said: set[str] = set()

    @property
    def up(self) -> bool:
        return self.state == "up"

    # -- the report -----------------------------------------------------------------------------------------------
    def report_word(self) -> dict | None:
        """The ``BULK`` field of the next report (None: nothing to say)."""
        if self.state == "new":
            try:
                self._ring = SharedRing("diffs", self.ring_bytes, min_slots=MIN_SLOTS)
            except OSError as ex:
                self._to_wire(f"no shared memory here ({ex.strerror or ex})")
            else:
                self.state = "offered"
                return {"offer": self._ring.locator()}
        if self.state == "again":
            self.state = "offered"
            return {"offer": self._ring.locator()}
        word, self._word = self._word, None
        return word

    def pack_diff(self, diff: dict | None) -> dict | None:
        """A diff as the report carries it: a handle of the slot it was written into, once; else packed for the
        wire (None stays None). A diff that came packed (a relay's child's, copied out of its ring or off the wire)
        is written into the slot as the blob it is."""
        if diff is None or not self.up:
            return packed_or_none(diff)
        slots: list[Slot] = []

        def allocate(nbytes: int):
            slot = self._ring.acquire(nbytes)
            if slot is not None:
                slots.append(slot)
            return slot.data if slot is not None else None

        written = pack_blob_into(diff, allocate) if is_packed(diff) else pack_into(diff, allocate)
        if written is None:
            self.say_once("diff", f"bulk arrays: a diff went over NVFlare's wire: {self._ring.refusal}")
            return packed_or_none(diff)
        self._sent.append(slots[0])
        return self._ring.handle(slots[0], written[0])

    def next_batch(self, pending: list, max_bytes: int) -> list[dict]:
        """The pending updates (``DeviceUpdate`` objects, or a relay's children's entries) to send now, as they
        travel, in arrival order: at least one; up to ``max_bytes`` of diffs on the wire, and as many as the ring
        holds through shared memory (the rest wait for the next report, sent at once)."""
        sent: list[dict] = []
        total = shared = 0
        for u in pending:
            room = self.has_room()
            if shared and not room:
                break  # the ring is full of this report's diffs
            size = 0 if room else wire_bytes(u)
            if total + size > max_bytes and sent:
                break
            entry = u.to_dict(self.pack_diff if room else packed_or_none) if isinstance(u, DeviceUpdate) else u
            if room and not isinstance(u, DeviceUpdate) and is_packed(entry.get("diff")):
                entry = entry | {"diff": self.pack_diff(entry["diff"])}
            shared += is_handle(entry.get("diff"))
            total += size
            sent.append(entry)
        return sent

    def has_room(self) -> bool:
        """Whether one more diff of the report being made finds a slot (else it waits for the next report, sent
        at once, rather than going on the wire)."""
        return self.up and self._ring.has_room()

    def held(self, models: set[int], run: int = 0) -> list[int]:
        """The versions of ``run`` to report held: ``models``, and every one whose mapping something here still
        views."""
        self._viewed = {key: ref for key, ref in self._viewed.items() if ref() is not None}
        return sorted(models | {v for r, v in self._viewed if r == run})

    # -- the reply ------------------------------------------------------------------------------------------------
    def on_reply(self, word: dict | None) -> None:
        """The parent's reply came: the last report's slots are free; take its word on the offer, if any."""
        for slot in self._sent:
            self._ring.release(slot.index, slot.generation)
        self._sent = []
        if self.state != "offered":
            return
        if not word:
            self._to_wire("the parent does not share memory (it did not answer the offer)")
        elif word.get("later"):  # a relay settling its own link: offer again with the next report
            self.state = "again"
        elif "refused" in word:
            self._to_wire(f"the parent refused: {word['refused']}")
        elif word.get("ring") is None:  # a pack's server: it keeps no ring of versions
            self.state = "up"
            self._word = {"ready": True}
            self.log("bulk arrays: shared memory with the parent (diffs up; versions on NVFlare's wire)")
        else:
            rings = {0: word["ring"], **{int(run): ring for run, ring in (word.get("runs") or {}).items()}}
            parents: dict[int, PeerRing] = {}
            try:
                for run, ring in rings.items():
                    parents[run] = attach(ring)
            except BulkUnavailable as ex:
                for peer in parents.values():
                    peer.close()
                self._to_wire(f"the parent's ring cannot be mapped here: {ex}")
            else:
                self._parents = parents
                self.parent_locator = word["ring"]
                self.state = "up"
                self._word = {"ready": True}
                self.log("bulk arrays: shared memory with the parent (diffs up, versions down)")

    def weights(self, version: int, value: dict, run: int = 0) -> dict:
        """A version of ``run`` the reply carries: mapped where the parent keeps it (a handle, of that run's ring),
        else unpacked from the wire (a copy of its own); None when a handle cannot be read (the link is then on
        the wire: the parent sends the version again)."""
        if not is_handle(value):
            return unpack(value)
        try:
            parent = self._parents.get(run)
            if parent is None:
                raise BulkUnavailable("a handle came before the parent's ring was mapped")
            blob = map_file(value) if value[HANDLE] == FILE_KIND else parent.view(value)
        except (BulkUnavailable, StaleHandle, OSError) as ex:
            self._to_wire(f"version {version} could not be mapped: {ex}")
            return None
        self._viewed[run, version] = weakref.ref(blob.obj)
        return views({PACKED: 1, LAYOUT: value["layout"]}, blob)

    # -- fallbacks ------------------------------------------------------------------------------------------------
    def _to_wire(self, reason: str) -> None:
        was = self.state
        self.state, self.reason = "wire", reason
        self._word = {"ready": False, "reason": reason}
        self.log(
            f"bulk arrays: NVFlare's wire ({reason})" if was != "up" else f"bulk arrays: back on the wire: {reason}"
        )

    def say_once(self, what: str, message: str) -> None:
        """Log ``message`` the first time something of kind ``what`` happens."""
        if what not in self._said:
            self._said.add(what)
            self.log(f"{message} (said once)")

"""A parent's bulk links to its children (the server's, ``scheduling.exact_assessor``, or a relay's,
``simulation.bulk_relay``): which child's diffs and versions move through shared memory (``common.shared_ring``),
which through NVFlare's wire, and why.

A child's first report offers its ring (``simulation.bulk_link``). The parent maps it and checks its nonce (the
proof that they share this machine and user); if that works, and the run does not say ``--bulk wire``, the reply
carries the locator of the ring the versions are kept in (the server's, ``aggregation.version_store``); the child
maps that one in turn and says whether it could. A relay whose own link to its parent is not settled yet answers
``later`` (the child offers again with its next report). From then on, for that child:

* a diff it sends as a handle is copied out of its ring as the report is read (``resolve``): the parent's copy is
  its own, whatever the child does with its slot after the reply (it frees it then);
* each version it needs is sent as a handle of the server's slot or spill file (``model``), leased to the child
  until a report says it holds that version no more (``GlobalModel.held_by``, from ``HELD_VERSIONS``; a relay
  reports the versions its children view as its own).

A pack's server (``scheduling.pack_links``) names each run's ring in its answer. When one of its runs keeps no
ring, its links carry diffs up only (``versions=False``): the answer says ``{"ring": None}``, and the child sends
its diffs through its ring and takes every version off the wire.

Every other child (it offered nothing: NVFlare's own executor; a site with ``EDGESIM_BULK=wire``; its ring could
not be mapped; it could not map the versions' ring) uses the wire as before. Each child's choice is logged once and
recorded (``choices``; the server's go into ``metrics.json``'s ``bulk``, a relay's up to it with its reports).
With ``--bulk shm`` a child that cannot share memory stops the run (``required_failure``).
"""

from __future__ import annotations

import mmap
import sys
import threading
from collections.abc import Callable, Mapping

from common.packed_weights import LAYOUT, PACKED
from common.protocol import DEVICE_UPDATES, SELECTION_SUMS, DeviceUpdate, SelectionSum
from common.shared_ring import BulkUnavailable, PeerRing, StaleHandle, attach, is_handle

POOLED_BYTES = 8 * 2**20  # a diff at least this large is copied into a buffer reused once nothing reads it
POOL_BYTES = 2 * 2**30  # the most bytes of such buffers kept for reuse


class ReceiveBuffers:
    """Buffers for large diffs copied out of the leaves' rings, reused once nothing reads the diff any more (its
    update applied and dropped): a fresh one of 44.7 MB (ResNet-18) costs its page faults again every time, more
    than the copy itself. A buffer is one anonymous mapping; its reference count tells whether anything views it
    (as ``common.shared_ring``'s slots)."""

    def __init__(self, max_bytes: float = POOL_BYTES):
        self.max_bytes = max_bytes
        self._buffers: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int):
        """A writable buffer of ``nbytes``: a reused one, a new pooled one, or (past the pool's bytes) a plain
        ``bytearray``."""
        if nbytes < POOLED_BYTES:
            return bytearray(nbytes)
        with self._lock:
            for index in range(len(self._buffers)):
                if len(self._buffers[index]) == nbytes and sys.getrefcount(self._buffers[index]) <= _POOL_REFERENCES:
                    return memoryview(self._buffers[index])
            if (len(self._buffers) + 1) * nbytes > self.max_bytes:
                return bytearray(nbytes)
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
            self._buffers.append(mmap.mmap(-1, nbytes, flags=flags))
            return memoryview(self._buffers[-1])


_POOL_REFERENCES = 2  # sys.getrefcount of a pooled buffer nothing views: the pool's list, and the call's own


class BulkError(Exception):
    """A handle a child sent cannot be read: its update is lost, and the run cannot go on exactly."""


class BulkLinks:
    """Args:
    mode: the run's ``--bulk``: ``auto``, ``shm`` or ``wire``.
    log: logs one line (a child's choice).
    versions: whether versions go down as handles of the server's memory; False: diffs up only (a pack one of
        whose runs keeps no ring: every version travels on the wire).
    """

    def __init__(self, mode: str = "auto", log: Callable[[str], None] = print, versions: bool = True):
        self.mode = mode
        self.log = log
        self.versions = versions
        self._peers: dict[str, PeerRing] = {}  # child -> its ring, mapped here
        self._ready: set[str] = set()  # children that map the server's ring: versions go as handles
        self.choices: dict[str, str] = {}  # child -> "shm", or "wire: why"
        self.required_failure = ""  # with --bulk shm, why a child cannot share memory ("": none)
        self.error = ""  # the last diff that could not be read from a child's shared memory ("": none): the run stops
        self._said: set[str] = set()
        self._buffers = ReceiveBuffers()
        self._lock = threading.Lock()

    def on_report(self, child: str, word: dict | None, model) -> dict | None:
        """Take a child's word on its link (``BULK``, None for none); the word of the reply (None: nothing to say).
        ``model``: the run's global model (its ``bulk_locator``, ``bulk_error``; unused without ``versions``)."""
        if not word:
            if child not in self.choices:
                self._choose(child, "wire: it offers no shared memory (NVFlare's own executor)")
            return None
        if "offer" in word:
            if self.versions and model.bulk_locator() is None and getattr(model, "bulk_pending", False):
                return {"later": True}  # a relay still settling its own link: the child offers again
            why = self._refusal(child, word["offer"], model)
            if why:
                self._choose(child, f"wire: {why}")
                return {"refused": why}
            return {"ring": model.bulk_locator() if self.versions else None}
        if word.get("ready"):
            with self._lock:
                self._ready.add(child)
            self._choose(child, "shm")
        else:  # the child's reason, unless the server gave its own (it refused the offer)
            self._drop(child)
            if self.choices.get(child, "shm") == "shm":
                self._choose(child, f"wire: {word.get('reason') or 'the child could not map the server ring'}")
        return None

    def _refusal(self, child: str, locator: dict, model) -> str:
        """Why the server will not share memory with ``child`` ("": it will, its ring mapped here)."""
        if self.mode == "wire":
            return "--bulk wire"
        if self.versions and model.bulk_locator() is None:
            return model.bulk_error or "the server keeps no shared memory"
        try:
            peer = attach(locator)
        except BulkUnavailable as ex:
            return f"its ring cannot be mapped by the server: {ex}"
        with self._lock:
            self._peers[child] = peer
        return ""

    def _choose(self, child: str, choice: str) -> None:
        with self._lock:
            changed = self.choices.get(child) != choice
            self.choices[child] = choice
        if changed:
            word = f"shared memory ({self.carried})" if choice == "shm" else f"NVFlare's {choice}"
            self.log(f"bulk arrays of {child}: {word}")
        if choice != "shm" and self.mode == "shm" and not self.required_failure:
            self.required_failure = f"--bulk shm, but {child} cannot share memory with the server ({choice[6:]})"

    @property
    def carried(self) -> str:
        """What shared memory carries on these links, as the log says it."""
        return "diffs up, versions down" if self.versions else "diffs up; versions on NVFlare's wire"

    def _drop(self, child: str) -> None:
        with self._lock:
            self._ready.discard(child)

    def note_below(self, choices: dict | None) -> None:
        """A relay's word on the links of the leaves below it: recorded (and logged) as theirs."""
        for leaf, choice in (choices or {}).items():
            self._choose(leaf, choice)

    def ready(self, child: str) -> bool:
        return child in self._ready

    def resolve(self, child: str, entry: dict) -> dict:
        """A device update or selection sum as it came, its diff copied out of the child's ring when it came as a
        handle (``BulkError`` when it cannot be read)."""
        diff = entry.get("diff")
        if not is_handle(diff):
            return entry
        peer = self._peers.get(child)
        if peer is None:
            raise BulkError(f"{child} sent a diff as a handle of shared memory the server never mapped")
        try:
            data = peer.copy(diff, self._buffers.take(int(diff["length"])))
        except (StaleHandle, OSError, ValueError) as ex:
            raise BulkError(f"{child}'s diff could not be read from its shared memory: {ex}") from ex
        return entry | {"diff": {PACKED: 1, LAYOUT: diff["layout"], "data": data}}

    def updates_of(self, child: str, report: Mapping) -> tuple[list[DeviceUpdate], str]:
        """The device updates a child's report brings (a synchronous leaf's sums as one per device), their diffs
        copied out of the child's ring when they came as handles; and why a diff could not be read ("": each
        could), kept in ``error`` too (the run stops: an update is lost), the rest of the report dropped."""
        updates: list[DeviceUpdate] = []
        try:
            for entry in report.get(DEVICE_UPDATES) or ():
                updates.append(DeviceUpdate.from_dict(self.resolve(child, entry)))
            for entry in report.get(SELECTION_SUMS) or ():
                updates += SelectionSum.from_dict(self.resolve(child, entry)).device_updates()
        except BulkError as ex:
            self.error = str(ex)
            return updates, self.error
        return updates, ""

    def model(self, child: str, version: int, model, packed: Callable[[int], dict]) -> dict:
        """A version as ``child`` is sent it: a handle when it maps the server's ring and the version is kept
        there, else ``packed(version)``."""
        if child in self._ready and self.versions:
            found = model.model_handle(version, child)
            if found is not None:
                return found
            self.say_once(
                "version",
                f"bulk arrays: version {version} went to {child} over NVFlare's wire (it is kept outside the shared "
                "memory: made while every slot held a version a leaf may view, or it carries the method's extras)",
            )
        return packed(version)

    def say_once(self, what: str, message: str) -> None:
        """Log ``message`` the first time something of kind ``what`` happens."""
        with self._lock:
            first = what not in self._said
            self._said.add(what)
        if first:
            self.log(f"{message} (said once)")

    def forget(self, child: str) -> None:
        """A lost child: its ring is unmapped here."""
        with self._lock:
            self._ready.discard(child)
            peer = self._peers.pop(child, None)
        if peer is not None:
            peer.close()

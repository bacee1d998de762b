"""A relay's bulk links to its children, beside its own link to its parent (``simulation.bulk_link``): leaves below
a relay share memory with the server when all three share a machine and a user.

* **Up.** A child's diff that came as a handle of its ring is copied out as its report is read (``BulkLinks.resolve``,
  as the server does), and goes up with the relay's next report through the relay's own ring (or the wire).
* **Down.** A version the relay received as a handle of the server's memory goes down to a child that maps that
  memory as the very same handle: the relay answers a child's offer with the server's ring (its own link's
  ``parent_locator``), so leaves map the server's versions directly. A child that cannot gets them packed.
* **Held.** The server keeps a version it sent as a handle until the relay reports it holds it no more; the relay
  reports, besides its own, every version its children say they hold.

Until the relay's own link is settled (its first reports), a child's offer is answered ``later``; if the relay
ends on the wire, its children do too (``refused``, with the reason).
"""

from __future__ import annotations

from common.bulk_parent import BulkLinks
from common.packed_weights import pack
from common.protocol import BULK, BULK_BELOW, DEVICE_UPDATES, HELD_VERSIONS, SELECTION_SUMS
from common.shared_ring import is_handle
from simulation.bulk_link import LeafBulk


class RelayBulk:
    """Args:
    own: the relay's link to its parent.
    mode: the run's ``--bulk``.
    """

    def __init__(self, own: LeafBulk, mode: str):
        self.own = own
        self.links = BulkLinks(mode, log=own.log)
        self._handles: dict[int, dict] = {}  # version -> the handle it came down as
        self._children_held: dict[str, set[int]] = {}
        self._said_below: dict[str, str] = {}  # the children's choices last sent up

    # -- what ``BulkLinks`` asks of the parent's versions -------------------------------------------------------
    def bulk_locator(self) -> dict | None:
        return self.own.parent_locator if self.own.up else None

    @property
    def bulk_pending(self) -> bool:
        return self.own.state in ("new", "offered", "again")

    @property
    def bulk_error(self) -> str:
        if self.own.up:  # diffs up only (a pack's server): no ring of versions to pass on
            return "the relay's versions come on NVFlare's wire"
        return f"the relay shares no memory with its parent ({self.own.reason})"

    def model_handle(self, version: int, child: str) -> dict | None:
        return self._handles.get(version)

    # -- the relay's updater ------------------------------------------------------------------------------------
    def on_child_report(self, child: str, update) -> dict | None:
        """Take a child's report: its word on its link (the reply's word returned), its diffs copied out of its
        ring (in ``update``), the versions it holds."""
        word = self.links.on_report(child, update.get(BULK), self)
        for key in (DEVICE_UPDATES, SELECTION_SUMS):
            if update.get(key):
                update[key] = [self.links.resolve(child, entry) for entry in update[key]]
        self._children_held[child] = set(update.get(HELD_VERSIONS) or ())
        return word

    def child_model(self, child: str, version: int, models: dict) -> dict:
        """A version as ``child`` is sent it: the server's handle, or packed (``models``: version -> its DXO)."""
        return self.links.model(child, version, self, lambda v: pack(models[v].data))

    def keep(self, version: int, value: dict) -> None:
        """A version the parent sent: its handle is kept for the children, if it came as one."""
        if is_handle(value):
            self._handles[version] = value

    def add_to_report(self, report, own: set[int]) -> set[int]:
        """What the relay's report to its parent says of its children: their links' choices when they changed
        (``BULK_BELOW``, for the run's record). Returns the versions to report held: the relay's own and those its
        children hold (the handles of the others are forgotten)."""
        choices = dict(self.links.choices)
        if choices != self._said_below:
            report[BULK_BELOW], self._said_below = choices, choices
        held = own.union(*self._children_held.values())
        self._handles = {v: h for v, h in self._handles.items() if v in held}
        return held

"""What a leaf tells the server besides device updates: its own worker plan, and a line per device report.

In a provisioned deployment a leaf's disk is not the user's, so nothing a leaf knows about the run may stay on
it: the leaf's device simulator puts its plan (once) and its per-device report lines here, and the leaf's updater
takes them into its next report to its parent (``common.protocol``'s ``LEAF_PLANS`` / ``LEAF_REPORTS``,
forwarded unchanged by relays). The server writes them into the results folder, whichever environment the run is in.

The leaf's runner hands the outbox to the updater as a sticky ``FLContext`` property (``OUTBOX_PROP``): both are
components of the same leaf process and know nothing else of each other.
"""

from __future__ import annotations

import threading

OUTBOX_PROP = "edgesim.leaf_outbox"


class LeafOutbox:
    """Args:
    leaf: this leaf's client name.
    """

    def __init__(self, leaf: str):
        self.leaf = leaf
        self._lock = threading.Lock()
        self._plan: dict | None = None
        self._reports: list[dict] = []

    def set_plan(self, plan: dict) -> None:
        with self._lock:
            self._plan = plan

    def add_report(self, record: dict) -> None:
        with self._lock:
            self._reports.append(record)

    def take(self) -> tuple[dict, dict]:
        """(plans, reports) to send up now, each keyed by this leaf (empty when there is nothing new)."""
        with self._lock:
            plans = {self.leaf: self._plan} if self._plan is not None else {}
            reports = {self.leaf: self._reports} if self._reports else {}
            self._plan, self._reports = None, []
        return plans, reports

"""The server's watch over its leaves: which leaves sit below each child (NVFlare's client hierarchy), when each
leaf was last heard of (its own syncs, or a relay's word), and which are lost after ``leaf_timeout`` seconds of
silence. What a loss does to the run (stop, or go on without the leaf) is the assessor's decision
(``scheduling.exact_assessor``)."""

from __future__ import annotations

import time

from nvflare.fuel.utils.tree_utils import Forest, Node


def leaves_under(hierarchy: Forest | None) -> dict[str, set[str]]:
    """Each client's leaves (itself, for a leaf), from NVFlare's client hierarchy; empty without one."""
    if hierarchy is None:
        return {}

    def leaves(node: Node) -> set[str]:
        return {node.obj.name} if not node.children else set().union(*(leaves(c) for c in node.children))

    return {name: leaves(node) for name, node in hierarchy.nodes.items()}


class LeafWatch:
    """Args:
    leaf_timeout: seconds of silence after which a leaf is lost (a leaf syncs every ``update_interval`` + up to
        0.5 s, even while its devices train).
    """

    def __init__(self, leaf_timeout: float) -> None:
        self.leaf_timeout = leaf_timeout
        self.leaves_under: dict[str, set[str]] = {}  # child -> the leaves in its subtree
        self.root_of: dict[str, str] = {}  # leaf -> the server's child above it (itself, without relays)
        self.lost: set[str] = set()
        self._seen: dict[str, float] = {}  # leaf -> wall time it was last heard of

    def set_hierarchy(self, hierarchy: Forest | None) -> None:
        """NVFlare's client hierarchy (None: every child is a leaf)."""
        self.leaves_under = leaves_under(hierarchy)
        roots = list(hierarchy.roots) if hierarchy is not None else []
        self.root_of = {leaf: root for root in roots for leaf in self.leaves_under.get(root, {root})}

    def child_of(self, leaf: str) -> str:
        """The server's child that carries ``leaf``'s news."""
        return self.root_of.get(leaf, leaf)

    def leaves_of(self, child: str) -> set[str]:
        """The leaves below ``child`` (itself, for a leaf)."""
        return self.leaves_under.get(child, {child})

    def heard(self, child: str, leaves_seen: dict | None) -> None:
        """``child`` reported now; a relay also says how many seconds ago it last heard of each leaf below it."""
        now = time.time()
        if child in self.leaves_of(child):  # a leaf itself, not a relay
            self._seen[child] = now
        for leaf, age in (leaves_seen or {}).items():
            self._seen[leaf] = max(self._seen.get(leaf, 0.0), now - float(age))

    def newly_lost(self) -> set[str]:
        """The leaves silent for longer than ``leaf_timeout`` that were not lost before (now counted lost)."""
        now = time.time()
        lost = {leaf for leaf, seen in self._seen.items() if now - seen > self.leaf_timeout} - self.lost
        self.lost |= lost
        return lost

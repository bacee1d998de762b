"""The devices the server may select, and seeded uniform sampling among the idle ones, at any pool size.

A simulated leaf registers its devices as one range (``site-1`` with 100,000 devices means ``site-1#0`` ...
``site-1#99999``); real devices register one by one. The pool never lists a range's devices: a device is a global
index (ranges in name order, then single devices in name order), and only the busy (selected, not yet arrived)
and retired (``device_reuse`` off) devices are kept as sets. So memory and selection time do not grow with the
pool, only with the devices in flight.

Sampling is uniform over idle devices, without replacement, as the FedRevive reference simulator selects clients
(``np.random.choice(inactive_clients, size, replace=False)``); NVFlare's own device manager balances over leaves
instead. It draws from one ``numpy.random.Generator`` seeded by the run seed: rejection sampling of global indices
while at least half the pool is idle, an exact draw from the list of idle indices otherwise. Given the same pool,
the same busy and retired sets and the same generator state, the draw is the same, in any process.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from common.seeds import stable_seed

NUM_INDICATOR = "#"  # NVFlare's SpecialDeviceId.NUM_INDICATOR: device i of leaf prefix p is "p#i"


REJECTION_DRAWS = 50  # sampling with ``accept``: draws per device asked for before settling for fewer


def range_device(prefix: str, index: int) -> str:
    return f"{prefix}{NUM_INDICATOR}{index}"


class DevicePool:
    """Args: seed (the run's: the draws are a function of it); ranges: leaf -> devices, each registered as the
    range ``<leaf>#0..`` of that leaf (``register_range``), as a simulated run's leaves are."""

    def __init__(self, seed: int, ranges: dict[str, int] | None = None):
        self.rng = np.random.default_rng(stable_seed("device-selection", seed))
        self._ranges: dict[str, tuple[int, str]] = {}  # prefix -> (count, leaf)
        self._singles: dict[str, str] = {}  # device id -> leaf
        self._layout: tuple[list[str], list[int], list[str]] | None = None  # prefixes, offsets, sorted singles
        self._indices: dict[str, int] = {}  # global index of busy or retired devices, while the mask is kept
        self._mask: np.ndarray | None = None  # see _excluded_mask
        self.busy: set[str] = set()
        self.retired: set[str] = set()
        for leaf, count in (ranges or {}).items():
            self.register_range(leaf, count, leaf)

    # -- membership ---------------------------------------------------------------------------------------------
    def register_range(self, prefix: str, count: int, leaf: str) -> None:
        if count < 0:
            raise ValueError(f"device range {prefix}: negative count {count}")
        if self._ranges.get(prefix) != (count, leaf):
            self._ranges[prefix] = (count, leaf)
            self._relayout()

    def register(self, device_id: str, leaf: str) -> None:
        if device_id not in self and self._singles.get(device_id) != leaf:
            self._singles[device_id] = leaf
            self._relayout()

    def __contains__(self, device_id: str) -> bool:
        prefix, _, index = device_id.rpartition(NUM_INDICATOR)
        if prefix in self._ranges and index.isdigit():
            return int(index) < self._ranges[prefix][0]
        return device_id in self._singles

    def remove_leaf(self, leaf: str) -> list[str]:
        """Forget every device of ``leaf`` (a lost leaf); returns those of them still busy (in flight)."""
        busy = sorted(d for d in self.busy if self.leaf_of(d) == leaf)
        self.busy -= set(busy)
        self.retired = {d for d in self.retired if self.leaf_of(d) != leaf}
        self._relayout()
        self._ranges = {p: v for p, v in self._ranges.items() if v[1] != leaf}
        self._singles = {d: lf for d, lf in self._singles.items() if lf != leaf}
        self._relayout()
        return busy

    def leaf_of(self, device_id: str) -> str | None:
        prefix, _, index = device_id.rpartition(NUM_INDICATOR)
        if prefix in self._ranges and index.isdigit():
            return self._ranges[prefix][1]
        return self._singles.get(device_id)

    @property
    def leaves(self) -> set[str]:
        return {leaf for _, leaf in self._ranges.values()} | set(self._singles.values())

    def __len__(self) -> int:
        return sum(count for count, _ in self._ranges.values()) + len(self._singles)

    @property
    def idle_count(self) -> int:
        return len(self) - len(self.busy | self.retired)

    # -- selection ----------------------------------------------------------------------------------------------
    def _relayout(self) -> None:
        """Membership changed: device indices (and the excluded mask) are recomputed when next needed."""
        self._layout = None
        self._indices = {}
        self._mask = None

    def _excluded_mask(self) -> np.ndarray:
        """A bool per global index, True for busy and retired devices: built once, then kept up to date by
        ``sample`` and ``release``, so an exact draw costs no walk over the devices in flight."""
        if self._mask is None:
            self._mask = np.zeros(len(self), dtype=bool)
            for device in self.busy | self.retired:
                index = self._indices[device] = self.index_of(device)
                self._mask[index] = True
        return self._mask

    def _index_layout(self) -> tuple[list[str], list[int], list[str]]:
        if self._layout is None:
            prefixes = sorted(self._ranges)
            offsets, total = [], 0
            for p in prefixes:
                offsets.append(total)
                total += self._ranges[p][0]
            self._layout = (prefixes, offsets, sorted(self._singles))
        return self._layout

    def device_at(self, index: int) -> str:
        prefixes, offsets, singles = self._index_layout()
        ranged = sum(self._ranges[p][0] for p in prefixes)
        if index >= ranged:
            return singles[index - ranged]
        i = bisect.bisect_right(offsets, index) - 1
        return range_device(prefixes[i], index - offsets[i])

    def index_of(self, device_id: str) -> int:
        prefixes, offsets, singles = self._index_layout()
        prefix, _, index = device_id.rpartition(NUM_INDICATOR)
        if prefix in self._ranges and index.isdigit():
            return offsets[prefixes.index(prefix)] + int(index)
        ranged = sum(self._ranges[p][0] for p in prefixes)
        return ranged + bisect.bisect_left(singles, device_id)

    def sample(self, count: int, accept: Callable[[str], bool] | None = None) -> list[str]:
        """Up to ``count`` idle devices, uniformly without replacement (fewer when fewer are idle); marks them busy.
        ``accept``: only devices it accepts (online ones); then fewer may come back when few idle devices pass (at
        most ``REJECTION_DRAWS`` draws per device asked for, beyond the first thousand)."""
        total = len(self)
        excluded = len(self.busy) + len(self.retired)  # disjoint: a retired device is never busy again
        count = min(count, total - excluded)
        if count <= 0:
            return []
        chosen: list[str] = []
        if excluded <= total // 2:
            seen: set[str] = set()
            draws, limit = 0, 1000 + REJECTION_DRAWS * count
            while len(chosen) < count and (accept is None or draws < limit):
                draws += 1
                device = self.device_at(int(self.rng.integers(total)))
                if device not in self.busy and device not in self.retired and device not in seen:
                    seen.add(device)
                    if accept is None or accept(device):
                        chosen.append(device)
            self._mark_in_mask(chosen)
        else:
            mask = self._excluded_mask()
            idle = np.flatnonzero(~mask)
            if accept is not None:
                idle = np.asarray([i for i in idle if accept(self.device_at(int(i)))], dtype=np.int64)
                count = min(count, len(idle))
                if count == 0:
                    return []
            # the last idle device: numpy's choice of one out of one draws nothing, so neither does this (an
            # asynchronous run that selects every device comes here once per update)
            picks = idle if len(idle) == 1 else self.rng.choice(idle, size=count, replace=False)
            chosen = [self.device_at(int(i)) for i in picks]
            mask[picks] = True
            self._indices.update(zip(chosen, (int(i) for i in picks), strict=True))
        self.busy.update(chosen)
        return chosen

    def take(self, devices: list[str], count: int) -> list[str]:
        """Up to ``count`` of ``devices`` (idle ones), uniformly without replacement; marks them busy."""
        if not devices or count <= 0:
            return []
        picks = self.rng.choice(len(devices), size=min(count, len(devices)), replace=False)
        chosen = [devices[int(i)] for i in picks]
        self._mark_in_mask(chosen)
        self.busy.update(chosen)
        return chosen

    def claim(self, devices: list[str]) -> None:
        """Mark ``devices`` (idle ones a selection policy chose) busy."""
        self._mark_in_mask(devices)
        self.busy.update(devices)

    def _mark_in_mask(self, devices: list[str]) -> None:
        """Newly busy ``devices`` into the excluded mask, while it is kept."""
        if self._mask is not None:
            for device in devices:
                index = self._indices[device] = self.index_of(device)
                self._mask[index] = True

    def idle_devices(self) -> list[str]:
        """Every idle device (a scan of the whole pool: for the rare moment no selected device is left)."""
        return [self.device_at(int(i)) for i in np.flatnonzero(~self._excluded_mask())]

    def release(self, device_id: str, retire: bool = False) -> None:
        """A device's update arrived: it is idle again, or retired for good (``device_reuse`` off)."""
        self.busy.discard(device_id)
        if retire:
            self.retired.add(device_id)
            return
        index = self._indices.pop(device_id, None)
        if self._mask is not None:
            self._mask[index if index is not None else self.index_of(device_id)] = False

    # -- checkpointing ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "ranges": {p: list(v) for p, v in self._ranges.items()},
            "singles": dict(self._singles),
            "busy": sorted(self.busy),
            "retired": sorted(self.retired),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        self._ranges = {p: (int(c), leaf) for p, (c, leaf) in state["ranges"].items()}
        self._singles = dict(state["singles"])
        self._relayout()
        self.busy, self.retired = set(state["busy"]), set(state["retired"])
        self.rng.bit_generator.state = state["rng"]

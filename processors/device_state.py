"""Per-device state on a simulated leaf: the arrays a method's training rule keeps for each device across its
tasks (``processors.device_rule``), held only for devices that have trained.

Entries are keyed by (device, selection id): a task of selection ``s`` starts from the device's newest entry with
a selection id below ``s`` and writes its own under ``s``. So a task trained again (a resumed run retrains the
devices its checkpoint holds in flight, and every later selection, with the same selection ids) starts from
exactly the state it started from the first time, whatever the killed run trained after its checkpoint.

Memory: the newest entry of the most recently used devices stays in memory up to ``memory_budget`` bytes (an
idle device costs nothing; a device that has trained costs its arrays, in memory or on disk). Past the budget the
least recently used device's entry goes to disk, one ``.npz`` file per entry under ``directory/<device>/``.

Durable (a run that writes checkpoints): every entry is also written to disk when it is made, and a device keeps
exactly the entries a resume can need. The store lives in the run's results folder (``device_state/``), which
``--resume`` reuses; a fresh run clears each device's folder the first time it touches the device. The server
writes, after each checkpoint, the lowest selection id a resume from it trains again (its *floor*:
``checkpoint/selection_floor.json``, ``scheduling.checkpoint``). A resumed task of selection ``s >= floor`` reads
the device's newest entry below ``s``: its newest entry below the floor, or one the resumed run itself wrote
again (a task's entry replaces those of the device's later selections: the resumed run trains them again). So a
device keeps its newest entry below the floor and every entry from the floor on, and drops the older ones each
time it writes: exact for any number of tasks after the checkpoint, and the disk holds per device one entry plus
its tasks since the last checkpoint's floor (before the first checkpoint, all its tasks of the run so far).

Why a file next to the checkpoint rather than a field in the server's replies to the leaves: it is written
right after the checkpoint itself and lives in the same folder as the store (a durable store exists only where
the results folder is the leaves' too: SimEnv), so the floor a leaf reads is never ahead of the checkpoint on
disk (a crash between the two leaves the previous, lower floor: more kept, never too little), a fresh run's
cleared folder has none, and no message, leaf path (the executor's gateway, NVFlare's edge requests) or relay
has to carry it. Reading it costs one ``stat`` per durable write (the file is read again only when it changed).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections import OrderedDict

import numpy as np

from common.result_files import CHECKPOINT, SELECTION_FLOOR

Arrays = dict[str, np.ndarray]
NO_SELECTION = -1  # the key of a task whose selection id is not known (NVFlare's per-device path, a real device)


def _nbytes(arrays: Arrays) -> int:
    return sum(a.nbytes for a in arrays.values())


class DeviceStateStore:
    """Args:
    directory: where entries spill (and, ``durable``, are all written).
    memory_budget: bytes of entries kept in memory (0: none; every read then comes from disk).
    durable: write every entry to disk as it is made (a run that may be resumed).
    fresh: a new run: a device's files from an earlier run in ``directory`` are removed when it is first used.
    floor_file: the server's selection floor (durable; default: ``checkpoint/selection_floor.json`` beside
        ``directory``, i.e. in the same results folder).
    """

    def __init__(
        self, directory: str, memory_budget: int, durable: bool = False, fresh: bool = True, floor_file: str = ""
    ):
        self.directory = directory
        self.floor_file = floor_file or os.path.join(os.path.dirname(directory), CHECKPOINT, SELECTION_FLOOR)
        self._floor_seen: tuple[int, int] | None = None  # the floor file's (mtime, size) when last read
        self._floor = 0  # no checkpoint yet: every entry from selection 0 on is kept
        self.memory_budget = memory_budget
        self.durable = durable
        self.fresh = fresh
        self._lock = threading.Lock()
        self._memory: OrderedDict[str, tuple[int, Arrays]] = OrderedDict()  # device -> its newest entry, LRU order
        self._memory_bytes = 0
        self._on_disk: dict[str, list[int]] = {}  # device -> selection ids of its files, ascending
        self.spills = 0

    # -- what a task reads and writes ----------------------------------------------------------------------------

    def get(self, device: str, before: int | None = None) -> Arrays | None:
        """The device's newest state from a task of a selection below ``before`` (``None``: its newest); ``None``
        for a device without one."""
        newest = before is None or before < 0
        with self._lock:
            held = self._memory.get(device)
            if held is not None and (newest or held[0] < before):
                self._memory.move_to_end(device)
                return held[1]
            found = [s for s in self._disk_index(device) if newest or s < before]
            if not found:
                return None
            return self._read(device, found[-1])

    def put(self, device: str, selection: int | None, arrays: Arrays) -> None:
        """The device's new state, made by its task of ``selection``."""
        selection = NO_SELECTION if selection is None else selection
        arrays = {n: np.ascontiguousarray(a, dtype=np.float32) for n, a in arrays.items()}
        with self._lock:
            self._disk_index(device)  # a fresh run clears the device's old files before its first write
            old = self._memory.pop(device, None)
            if old is not None:
                self._memory_bytes -= _nbytes(old[1])
            if self.durable:
                for later in [s for s in self._on_disk[device] if s > selection]:  # a resumed run redoes these
                    os.remove(self._path(device, later))
                    self._on_disk[device].remove(later)
                self._write(device, selection, arrays)
                self._prune(device)
            else:
                self._trim(device, 0)  # a spilled older entry is superseded
            self._memory[device] = (selection, arrays)
            self._memory_bytes += _nbytes(arrays)
            self._spill()

    # -- figures ---------------------------------------------------------------------------------------------------

    def floor(self) -> int:
        """The selection floor of the server's last checkpoint (0 before the first): see the module docstring."""
        try:
            st = os.stat(self.floor_file)
        except OSError:
            return self._floor
        seen = (st.st_mtime_ns, st.st_size)
        if seen != self._floor_seen:
            try:
                with open(self.floor_file) as f:
                    self._floor = max(self._floor, int(json.load(f)["selection_floor"]))  # never goes down
            except (OSError, ValueError, KeyError, TypeError):
                return self._floor  # half-visible or foreign: read it again next time
            self._floor_seen = seen
        return self._floor

    def memory_bytes(self) -> int:
        return self._memory_bytes

    def disk_bytes(self) -> int:
        total = 0
        for root, _, files in os.walk(self.directory):
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
        return total

    def devices(self) -> int:
        with self._lock:
            return len(set(self._memory) | {d for d, s in self._on_disk.items() if s})

    # -- disk ------------------------------------------------------------------------------------------------------

    def _folder(self, device: str) -> str:
        return os.path.join(self.directory, device.replace(os.sep, "_").replace("#", "_"))

    def _disk_index(self, device: str) -> list[int]:
        index = self._on_disk.get(device)
        if index is None:
            folder = self._folder(device)
            if self.fresh:
                shutil.rmtree(folder, ignore_errors=True)
                index = []
            else:
                names = os.listdir(folder) if os.path.isdir(folder) else []
                index = sorted(int(n[:-4]) for n in names if n.endswith(".npz") and not n.startswith("."))
            self._on_disk[device] = index
        return index

    def _path(self, device: str, selection: int) -> str:
        return os.path.join(self._folder(device), f"{selection}.npz")

    def _write(self, device: str, selection: int, arrays: Arrays) -> None:
        path = self._path(device, selection)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".{selection}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)  # a crash mid-write leaves no half entry
        index = self._on_disk[device]
        if selection not in index:
            index.append(selection)
            index.sort()

    def _read(self, device: str, selection: int) -> Arrays:
        with np.load(self._path(device, selection)) as data:
            return {n: data[n] for n in data.files}

    def _prune(self, device: str) -> None:
        """Drop the device's entries a resume cannot need: those below its newest entry below the floor."""
        index, floor = self._on_disk[device], self.floor()
        below = [s for s in index if s < floor]
        for selection in below[:-1]:
            os.remove(self._path(device, selection))
            index.remove(selection)

    def _trim(self, device: str, keep: int) -> None:
        index = self._on_disk[device]
        while len(index) > keep:
            os.remove(self._path(device, index.pop(0)))

    def _spill(self) -> None:
        """Past the budget, the least recently used devices' entries leave memory (to disk unless already there)."""
        while self._memory_bytes > self.memory_budget and self._memory:
            device, (selection, arrays) = self._memory.popitem(last=False)
            self._memory_bytes -= _nbytes(arrays)
            if not self.durable:
                self._write(device, selection, arrays)
                self._trim(device, 1)
            self.spills += 1

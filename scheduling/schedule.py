"""Exact simulated time: the event schedule of an asynchronous (or synchronous) FL run, as a pure state machine.

Semantics (the FedRevive reference simulator's, ``research/fed-revive/codes/server.py``; issue "Exact asynchronous
time inside NVFlare"):

* A device selected at server time ``s`` to train the then-current version ``v`` starts at ``s + download`` and
  its update arrives at ``a = s + download + train + upload``. The durations are a seeded function of (seed,
  device id, how many tasks that device has done) (``common.delays``), so any process can compute them.
* Updates are applied strictly in arrival order, ties broken by device id. With ``B`` updates per model a version
  is made from exactly ``B`` updates, at the ``B``-th arrival's time.
* Staleness ``tau`` = versions made between the update's base version and its arrival.
* When an arrival leaves ``min_hole_to_fill`` free slots (of ``selection_size`` devices in flight), replacements
  are selected at that arrival's time (uniformly among idle devices, ``scheduling.device_pool``, or by the
  method's selection policy, ``scheduling.selection``, which sees what was applied up to and including this
  arrival) and train the version current at that time: after the arrival's own version, if it made one.
* A device is idle again once its update has arrived (never again with ``device_reuse`` off); with
  ``one_update_per_version`` (differential privacy: each device contributes to a version at most once), once the
  version its counted update goes into is made.
* A failed device (its update counts nothing) frees its slot at its arrival but does not count towards ``B``.
  A synchronous run (``B`` = min hole = ``selection_size``: FedAvg) makes its version once every device of the
  round has landed, from the updates that counted (all ``B`` of them when none failed), as FedAvg averages the
  devices that report; a round in which every device failed makes none and selects again.
* Under an availability model (``common.availability``) only devices online at the moment are selected, and a
  device whose session ends before its update would arrive drops out then: it fails at that time. When no device
  is in flight and no idle device is online, time moves on to the first moment one comes online.
* Computation takes no simulated time. Nothing here depends on wall time, worker counts or message timing.

``ExactSchedule`` only decides *when* and *which*: the server's assessor feeds it the arrivals it has received and
applies the updates it releases, in its order (``scheduling``); ``scheduling.event_reference`` runs it alone to
give the trace a run must reproduce. Selection ids are unique per selection event (a device reselected at the
same model version is a new selection), and ``selection_version`` maps each to the model version it trains.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from common.capacity import device_capacity
from common.delays import DeviceDelays
from common.seeds import stable_seed
from scheduling.device_pool import DevicePool
from scheduling.selection import DeviceKnowledge, SelectionPolicy


@dataclass(frozen=True)
class Dispatch:
    """A device in flight: selected by selection ``selection_id`` at ``selected_at`` to train ``base_version``."""

    device: str
    selection_id: int
    base_version: int
    selected_at: float
    arrival: float  # when its update arrives, or, when it ``drops``, when it goes offline
    task_number: int  # the device's tasks before this one
    drops: bool = False  # it goes offline before its update arrives: at ``arrival`` it fails

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Arrival:
    """An applied update: the event trace's line (``trace_record``)."""

    device: str
    base_version: int
    arrival: float
    tau: int  # versions made between its base version and its arrival
    version: int  # the version it goes into (made now if ``made_version``, else later)
    made_version: bool
    counted: bool  # False: a failed device, freed its slot only
    upload_bytes: int = 0  # its encoded size (common.compression), recorded when compression or a bandwidth is on

    def trace_record(self) -> dict:
        """One line of ``events.jsonl`` (``failed``: the update counted nothing, or the device dropped out;
        ``upload_bytes``: a counted update's encoded bytes, when known)."""
        record = {
            "version": self.version,
            "device": self.device,
            "base_version": self.base_version,
            "arrival": round(self.arrival, 9),
            "tau": self.tau,
        }
        if not self.counted:
            record["failed"] = True
        elif self.upload_bytes:
            record["upload_bytes"] = self.upload_bytes
        return record


class ExactSchedule:
    """Args:
    pool: the devices that may be selected (registered before ``start``).
    delays: the run's delay model.
    selection_size: devices in flight (K).
    updates_per_version: updates per new model version (B).
    min_hole_to_fill: free slots before replacements are selected.
    device_reuse: a device may be selected again after its update arrived.
    max_model_version: no update is applied once this version exists.
    max_sim_time: no update arriving later than this is applied (None: no limit).
    policy: the method's selection policy (``scheduling.selection``); None: uniform among idle devices.
    one_update_per_version: a device whose counted update waits for its version is not selected again before that
        version is made (differential privacy's bound on one device's share of an aggregate).
    """

    def __init__(
        self,
        pool: DevicePool,
        delays: DeviceDelays,
        selection_size: int,
        updates_per_version: int,
        min_hole_to_fill: int,
        device_reuse: bool = True,
        max_model_version: int | None = None,
        max_sim_time: float | None = None,
        policy: SelectionPolicy | None = None,
        one_update_per_version: bool = False,
    ):
        self.policy = policy
        self.one_update_per_version = one_update_per_version
        self._held: list[str] = []  # devices whose counted update waits for its version (one_update_per_version)
        self.knowledge = DeviceKnowledge()  # fed only when a policy reads it
        # the policy's own generator: the pool's is left to uniform sampling, whose draws stay today's
        self.policy_rng = (
            np.random.default_rng(stable_seed("selection-policy", delays.seed)) if policy is not None else None
        )
        self.pool = pool
        self.delays = delays
        self.selection_size = selection_size
        self.updates_per_version = updates_per_version
        self.min_hole_to_fill = min_hole_to_fill
        self.device_reuse = device_reuse
        self.max_model_version = max_model_version
        self.max_sim_time = max_sim_time
        self.synchronous = updates_per_version == min_hole_to_fill == selection_size
        self.now = 0.0
        self.version = 0  # 1 once started: version 1 is the initial model
        self.buffered = 0  # counted updates waiting for the next version
        self.applied = 0  # updates applied so far, failed ones included
        self.failed = 0  # of them, failed ones (dropped out, or counted nothing)
        self.bytes_sent = 0  # real devices' counted updates: their bytes, as their leaves measured them (--compress)
        self.in_flight: dict[str, Dispatch] = {}
        self.task_counts: dict[str, int] = {}
        self.selection_seq = 0  # the last selection id issued
        self.selection_version: dict[int, int] = {}  # selection id -> the model version its devices train
        self._due: list[tuple[float, str, int]] = []  # heap of (arrival, device, selection id)
        self._base_counts: Counter[int] = Counter()  # model version -> devices in flight training it
        self._sid_counts: Counter[int] = Counter()  # selection id -> its devices in flight
        self._finished_sids: set[int] = set()  # selections with no device in flight any more
        self._maybe_unneeded: set[int] = set()  # versions that may have stopped being needed since last asked

    # -- queries ------------------------------------------------------------------------------------------------
    def next_due(self) -> Dispatch | None:
        """The in-flight device whose update is applied next (earliest arrival, then device id)."""
        while self._due:
            arrival, device, sid = self._due[0]
            d = self.in_flight.get(device)
            if d is not None and d.selection_id == sid:
                return d
            heapq.heappop(self._due)  # stale entry of an arrival already applied
        return None

    @property
    def done(self) -> bool:
        """No further update will be applied: the last version exists, the time budget is spent, or nothing is in
        flight."""
        if self.max_model_version is not None and self.version >= self.max_model_version:
            return True
        nxt = self.next_due()
        return nxt is None or (self.max_sim_time is not None and nxt.arrival > self.max_sim_time)

    def selection(self) -> dict[str, int]:
        """Device -> selection id of every device in flight (what the leaves see)."""
        return {d: f.selection_id for d, f in self.in_flight.items()}

    def fleet(self) -> dict:
        """The fleet now, for results: devices online (all of them without an availability model), updates applied
        and, of them, failed; with an update's size known, ``bytes_up`` and ``bytes_down``."""
        online = self.delays.availability.online_count(self.pool, self.now)
        fleet = {"online": online, "devices": len(self.pool), "updates": self.applied, "failed": self.failed}
        c = self.delays.config  # an update's size known (compression, a bandwidth): the bytes moved so far
        if c.upload_bytes or self.bytes_sent:  # a real device's measured bytes when it sent them
            up = self.bytes_sent or (self.applied - self.failed) * c.upload_bytes
            fleet |= {"bytes_up": up, "bytes_down": sum(self.task_counts.values()) * c.download_bytes}
        return fleet

    def needed_versions(self) -> set[int]:
        """Model versions some in-flight device trains, plus the current one."""
        return set(self._base_counts) | {self.version}

    def take_unneeded_versions(self) -> set[int]:
        """The versions that stopped being needed (no device in flight trains them, and they are not the current
        one) since the last call: what the server may forget now. Called after every update, so it looks only at
        the versions whose last device landed or that stopped being current, not at every version in flight
        (hundreds with the paper's delays)."""
        unneeded = {v for v in self._maybe_unneeded if v not in self._base_counts and v != self.version}
        self._maybe_unneeded = set()  # the rest are needed again; they come back when that ends
        return unneeded

    # -- transitions --------------------------------------------------------------------------------------------
    def start(self) -> list[Dispatch]:
        """The initial model is version 1 at time 0; select the first devices."""
        if self.version:
            raise RuntimeError("the schedule has started already")
        self.version = 1
        return self._select_until_one_is_online(self.selection_size)

    def apply(
        self, device: str, counted: bool = True, at: float | None = None, reports: dict | None = None, sent: int = 0
    ) -> tuple[Arrival, list[Dispatch]]:
        """Apply the arrival of ``device`` (at its scheduled time, or ``at``: the real-time mode's receipt time);
        returns it and the devices selected in reply. ``reports``: its update's (``Update.reports``), for the
        selection policy, from this arrival on. ``sent``: a real device's bytes (0: the delay model's size)."""
        dispatch = self.in_flight.pop(device)
        counted = counted and not dispatch.drops  # gone offline: whatever it trained is lost
        self._landed(dispatch)
        self.now = max(self.now, dispatch.arrival if at is None else at)
        tau = self.version - dispatch.base_version
        made = False
        self.applied += 1
        self.failed += not counted
        if counted:
            self.buffered, self.bytes_sent = self.buffered + 1, self.bytes_sent + sent
        round_over = self.synchronous and not self.in_flight  # a synchronous round ends with its last device
        if self.buffered and (self.buffered >= self.updates_per_version or round_over):
            self.buffered = 0
            self.version += 1
            self._maybe_unneeded.add(self.version - 1)
            made = True
        target = self.version if made else self.version + 1
        if self.policy is not None and counted:
            self.knowledge.applied(device, reports, self.now - dispatch.selected_at, self.version)
        if self.one_update_per_version and counted and not made:
            self._held.append(device)  # busy until its version is made
        else:
            self.pool.release(device, retire=not self.device_reuse)
        if made and self._held:
            for held in self._held:
                self.pool.release(held, retire=not self.device_reuse)
            self._held = []
        selected: list[Dispatch] = []
        holes = self.selection_size - len(self.in_flight)
        last = self.max_model_version is not None and self.version >= self.max_model_version
        if holes >= self.min_hole_to_fill and not last:
            selected = self._select_until_one_is_online(holes)
        size = sent or self.delays.config.upload_bytes
        arrival = Arrival(device, dispatch.base_version, dispatch.arrival, tau, target, made, counted, size)
        return arrival, selected

    def refill(self) -> list[Dispatch]:
        """Select the devices the last arrival left unselected because the last version then existed: a run
        resumed with a larger ``max_model_version`` goes on exactly as one that was never capped (the same state,
        the same generator, the same moment). Nothing when no such hole is open (a checkpoint mid-run)."""
        holes = self.selection_size - len(self.in_flight)
        last = self.max_model_version is not None and self.version >= self.max_model_version
        if not self.version or last or holes < self.min_hole_to_fill:
            return []
        return self._select_until_one_is_online(holes)

    def _select_until_one_is_online(self, count: int) -> list[Dispatch]:
        """Select ``count`` online devices now; if none is in flight afterwards because no idle device is online,
        time moves on to the first moment one comes online and they are selected then (nothing else can happen
        before: no update is on its way)."""
        selected = self._select(count)
        availability = self.delays.availability
        if self.in_flight or availability.always:
            return selected
        idle = self.pool.idle_devices()
        wakes = {d: availability.online_from(d, self.now) for d in idle}
        wake = min(wakes.values(), default=float("inf"))
        if wake == float("inf"):
            return selected  # no idle device ever comes online: the run ends
        self.now = max(self.now, wake)
        woken = [d for d in idle if wakes[d] <= wake]
        if self.policy is not None:
            return self._select(count, self._policy_pick(count, among=woken))
        return self._select(count, self.pool.take(woken, count))

    def _select(self, count: int, devices: list[str] | None = None) -> list[Dispatch]:
        """Select ``count`` idle devices (online ones, under an availability model), or dispatch ``devices``."""
        availability = self.delays.availability
        if devices is None:  # under an availability model, only devices online now (each may go offline later)
            accept = None if availability.always else lambda d: availability.online(d, self.now)
            devices = self.pool.sample(count, accept) if self.policy is None else self._policy_pick(count, accept)
        if not devices:
            return []
        self.selection_seq += 1
        sid = self.selection_seq
        self.selection_version[sid] = self.version
        out = []
        for device in sorted(devices):
            n = self.task_counts.get(device, 0)
            self.task_counts[device] = n + 1
            arrival = self.now + self.delays.durations(device, n).total
            offline = availability.session_end(device, self.now)
            d = Dispatch(device, sid, self.version, self.now, min(arrival, offline), n, offline < arrival)
            self.in_flight[device] = d
            self._base_counts[d.base_version] += 1
            self._sid_counts[sid] += 1
            heapq.heappush(self._due, (d.arrival, device, sid))
            out.append(d)
        for done in self._finished_sids:  # keep only the selections still in flight
            self.selection_version.pop(done, None)
        self._finished_sids = set()
        return out

    def _policy_pick(self, count: int, accept=None, among: list[str] | None = None) -> list[str]:
        """The policy's choice of up to ``count`` candidates (``among``, or idle devices ``accept`` takes: all of
        them, or the uniform sample the policy asks for); marks them busy."""
        pool = self.pool
        if among is None:
            size = self.policy.sample_size(count, pool.idle_count)
            if size is None:
                among = [d for d in pool.idle_devices() if accept is None or accept(d)]
            else:  # drawn like a uniform selection, then handed back: they are candidates only
                among = pool.sample(size, accept)
                for d in among:
                    pool.release(d)
        if not among or count <= 0:
            return []
        candidates = self.knowledge.candidates(among, self.task_counts, self._speed)
        picked = list(self.policy.select(candidates, count, self.version, self.now, self.policy_rng))
        allowed = set(among)
        if len(set(picked)) != len(picked) or len(picked) > count or not set(picked) <= allowed:
            raise ValueError(
                f"selection policy {type(self.policy).__name__} returned {picked[:5]}...: it must return at most "
                f"{count} distinct devices among its candidates"
            )
        pool.claim(picked)
        return picked

    def _speed(self, device: str) -> float | None:
        """Training samples per simulated second from the capacity trace, when one is given."""
        path = self.delays.config.capacity_file
        if not path:
            return None
        ms_per_sample, _ = device_capacity(path, self.delays.seed, device)
        return 1000.0 / ms_per_sample if ms_per_sample > 0 else None

    def _landed(self, dispatch: Dispatch) -> None:
        """A device is no longer in flight: count it out of its version and its selection."""
        for counts, key in ((self._base_counts, dispatch.base_version), (self._sid_counts, dispatch.selection_id)):
            counts[key] -= 1
            if not counts[key]:
                del counts[key]
                if counts is self._base_counts:
                    self._maybe_unneeded.add(key)
        if dispatch.selection_id not in self._sid_counts:
            self._finished_sids.add(dispatch.selection_id)

    # -- checkpointing ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {
            "now": self.now,
            "version": self.version,
            "buffered": self.buffered,
            "applied": self.applied,
            "failed": self.failed,
            **({"bytes_sent": self.bytes_sent} if self.bytes_sent else {}),
            "in_flight": [d.to_dict() for d in self.in_flight.values()],
            "task_counts": dict(self.task_counts),
            "selection_seq": self.selection_seq,
            "selection_version": {str(k): v for k, v in self.selection_version.items()},
            "pool": self.pool.state_dict(),
        } | (self._selection_state() if self.policy is not None else {})
        return state | ({"held": list(self._held)} if self._held else {})

    def _selection_state(self) -> dict:
        """The selection policy's part of a checkpoint: what the run knows, its generator and its own state."""
        return {
            "selection": {
                "knowledge": self.knowledge.state_dict(),
                "rng": self.policy_rng.bit_generator.state,
                "policy": self.policy.state_dict(),
            }
        }

    def load_state_dict(self, state: dict) -> None:
        self.now, self.version, self.buffered = state["now"], state["version"], state["buffered"]
        self.applied, self.failed, self.bytes_sent = (state.get(k, 0) for k in ("applied", "failed", "bytes_sent"))
        self.in_flight = {d["device"]: Dispatch(**d) for d in state["in_flight"]}
        self._base_counts = Counter(d.base_version for d in self.in_flight.values())
        self._maybe_unneeded = set()
        self._sid_counts = Counter(d.selection_id for d in self.in_flight.values())
        self._due = [(d.arrival, d.device, d.selection_id) for d in self.in_flight.values()]
        heapq.heapify(self._due)
        self.task_counts = dict(state["task_counts"])
        self.selection_seq = state["selection_seq"]
        self.selection_version = {int(k): v for k, v in state["selection_version"].items()}
        self._finished_sids = set(self.selection_version) - set(self._sid_counts)
        self.pool.load_state_dict(state["pool"])
        self._held = list(state.get("held", []))
        if self.policy is not None and "selection" in state:
            self.knowledge.load_state_dict(state["selection"]["knowledge"])
            self.policy_rng.bit_generator.state = state["selection"]["rng"]
            self.policy.load_state_dict(state["selection"]["policy"])

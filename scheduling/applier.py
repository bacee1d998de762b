"""Applies received device updates in the schedule's order, on a thread of its own.

The assessor hands it every per-device update a leaf reports (``receive``) and answers the leaf at once; this
thread applies them: strictly in simulated arrival order (exact time: the earliest due update only once it has
arrived, every later one waits), or as received, on the wall clock (real devices, and the simulated real-time
mode: time = wall seconds since the start / ``time_scale``), so a slow step never holds a leaf's report long.

On the wall clock a selected device that has not reported within the device timeout counts as failed at that
moment (its slot is refilled; a late report is refused), so a device that vanishes never stalls the run; the
timeout is fixed, or ``FIRST_DEVICE_TIMEOUT`` until a task is measured, then 3x the slowest task seen. A run whose
devices keep failing stops (``scheduling.failure_streak``), and so does one whose DP budget is spent.

What a child is told (``child_view``: the current version, its leaves' part of the selection, the model version
and the release of each of its selection ids) is kept per leaf as updates are applied and received, so answering
a child costs in proportion to its own devices in flight, not to the whole selection. A device whose update has
arrived is left out at once (its leaf need not train it again, e.g. after a resume).

Releases: on exact time, selected devices are held back and handed to the leaves in releases, each a function of
the schedule alone: every device selected since the last release goes out when the update due next is one of
them (the server cannot go on without it), never earlier. A leaf trains a release's devices together, each from
its own model version (``simulation.fast_simulator``), so an asynchronous run, which selects one replacement per
update, still trains its devices in large groups, and the groups (hence every diff's bits) do not depend on when
a leaf happens to sync. A synchronous round is one release, as it was one selection. A checkpoint waits until
every released device has reported (``wait_released``), so a resumed run holds back, and releases, exactly the
devices the uninterrupted run does. On the wall clock every selection is released at once.

Over 400 lines: one thread and the state only it changes (what is received, released, applied); a reader follows
an update from ``receive`` to ``apply`` in one file, and the views it publishes are built under the same lock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common.device_timeout import FIRST_DEVICE_TIMEOUT
from common.jsonio import JsonlWriter
from common.privacy import BudgetSpent
from common.protocol import FLEET, DeviceUpdate, reports_of
from scheduling.failure_streak import FailureStreak
from scheduling.schedule import Dispatch, ExactSchedule
from scheduling.update_check import FiniteUpdates


@dataclass(frozen=True)
class ChildView:
    """What the server tells one child (a leaf, or a relay above leaves).

    Attributes:
        version: the current model version (0 before the first selection).
        selection_version: changes whenever ``selection`` changes (the sum of its leaves' counters).
        selection: device -> selection id, for the child's in-flight devices whose update has not arrived yet.
        selection_versions: selection id -> the model version its devices train, for the ids in ``selection``.
        awaited: the child's devices whose update the server is waiting for now.
        selection_releases: selection id -> the release it came in, for the ids in ``selection``.
        releases: the run's releases so far (every child's, not only this one's).
        ended: the run makes no more releases (its schedule is done, or it stopped).
    """

    version: int = 0
    selection_version: int = 0
    selection: dict[str, int] = field(default_factory=dict)
    selection_versions: dict[int, int] = field(default_factory=dict)
    awaited: tuple[str, ...] = ()
    selection_releases: dict[int, int] = field(default_factory=dict)
    releases: int = 0
    ended: bool = False


class UpdateApplier:
    """Args:
    schedule: the run's schedule (started).
    global_model: the run's global model (``aggregation.global_model``; the method's strategy makes versions).
    events: where each applied update's trace line goes.
    new_context: makes an ``FLContext`` for this thread (the engine's ``new_context``).
    time_scale: 0: exact order; S > 0: the real-time mode (apply as received, at wall / S).
    on_version: called after each new model version (the checkpoint hook), on this thread.
    log_error: reports a failed update application.
    on_selected: called with the devices of each release (their leaves have news), on this thread, under the
        applier's lock.
    on_stalled: called, under the applier's lock, when the update due next has not arrived (with its device), once
        per device awaited.
    device_timeout: on the wall clock, seconds a device may take before it counts as failed; 0: derived (see the
        module docstring); ``math.inf``: never (simulated devices always report).
    max_consecutive_failures: failed updates with a device error in a row (from as many devices) that stop the
        run (``scheduling.failure_streak``); 0: never.
    """

    def __init__(
        self,
        schedule: ExactSchedule,
        global_model,
        events: JsonlWriter,
        new_context: Callable,
        time_scale: float = 0.0,
        on_version: Callable[[], None] | None = None,
        log_error: Callable[[str], None] = print,
        on_selected: Callable[[list[str]], None] | None = None,
        on_stalled: Callable[[str], None] | None = None,
        device_timeout: float = math.inf,
        max_consecutive_failures: int = 0,
    ):
        self.schedule = schedule
        self.failures = FailureStreak(max_consecutive_failures)
        self.device_timeout = device_timeout
        self.slowest = 0.0  # wall seconds of the slowest task measured so far (wall clock only)
        self.on_selected = on_selected
        self.on_stalled = on_stalled
        self._awaited: str | None = None  # the device the applier waits for (its update has not arrived)
        self.global_model = global_model
        self.events = events
        self.new_context = new_context
        self.time_scale = time_scale
        self.on_version = on_version
        self.log_error = log_error
        self.received: dict[str, DeviceUpdate] = {}
        self.applied = 0  # updates applied (lines in events.jsonl)
        self.error = ""  # why the run must stop: an update could not be applied, or the devices keep failing
        self.finished = False  # the schedule is done and its last update fully applied (its version announced)
        self._by_leaf: dict[str, dict[str, int]] = {}  # leaf -> {device: selection id} released, not arrived
        self._held: dict[str, Dispatch] = {}  # selected, not released yet (exact time)
        self._release_of: dict[int, int] = {}  # selection id -> the release it came in
        self.releases = 0  # releases so far
        self._leaf_counters: dict[str, int] = {}  # leaf -> how often its part changed
        self._version = 0  # the published current version
        self._finite = FiniteUpdates(log_error)  # the server's own refusal of NaN and inf
        self._applying = False  # an update was taken for applying and its publish has not come yet
        self._started_at = time.time()
        # one lock, two conditions: ``_cond`` wakes the applier's thread (arrivals), ``_idle`` the replies waiting for
        # it to settle, once it has nothing left to apply (a burst of hundreds of updates wakes such a reply once)
        self._cond = threading.Condition(lock := threading.RLock())
        self._idle = threading.Condition(lock)
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- from the assessor --------------------------------------------------------------------------------------
    def receive(self, update: DeviceUpdate) -> str:
        """Keep an arrived update until its turn; "" if accepted, else why not."""
        with self._cond:
            flight = self.schedule.in_flight.get(update.device)
            if flight is None or flight.selection_id != update.selection_id:
                return f"device {update.device} is not in flight for selection {update.selection_id}"
            if update.base_version != flight.base_version:
                was = f"trained version {update.base_version} but was selected for {flight.base_version}"
                return f"device {update.device} {was}"
            self.received[update.device] = update
            self._held.pop(update.device, None)  # a lost leaf's device, failed before it was released
            self._unlist(update.device)
            self._cond.notify_all()
        return ""

    def _leaf_part(self, device: str) -> tuple[str | None, dict[str, int] | None]:
        leaf = self.schedule.pool.leaf_of(device)
        return leaf, (self._by_leaf.setdefault(leaf, {}) if leaf is not None else None)

    def _unlist(self, device: str) -> None:
        """``device``'s update arrived (or it is gone): out of its leaf's part."""
        leaf, part = self._leaf_part(device)
        if part is not None and part.pop(device, None) is not None:
            self._leaf_counters[leaf] = self._leaf_counters.get(leaf, 0) + 1

    def publish(self, selected: list | None = None) -> None:
        """Tell children what changed: the current version, and the devices ``selected`` (dispatches) since: held
        back until their release on exact time (see the module docstring), released at once on the wall clock."""
        with self._cond:
            fresh = [d for d in selected or () if d.device not in self.received and not d.drops]
            if self.time_scale > 0:
                self._release(fresh)
            else:  # a device that drops out never reports: nothing to train, nothing to hold
                self._held.update((d.device, d) for d in fresh)
            self._version = self.schedule.version
            self._applying = False
            self._cond.notify_all()

    def _release(self, dispatches: list[Dispatch]) -> None:
        """Hand ``dispatches`` to their leaves, as one release (under the lock)."""
        if not dispatches:
            return
        self.releases += 1
        known = self.schedule.selection_version
        if len(self._release_of) > 2 * len(known) + 16:  # forget selections no longer in flight
            self._release_of = {sid: r for sid, r in self._release_of.items() if sid in known}
        for d in dispatches:
            self._release_of[d.selection_id] = self.releases
            leaf, part = self._leaf_part(d.device)
            if part is not None:
                part[d.device] = d.selection_id
                self._leaf_counters[leaf] = self._leaf_counters.get(leaf, 0) + 1
        if self.on_selected is not None:
            self.on_selected([d.device for d in dispatches])
        self._cond.notify_all()

    def _release_held(self) -> None:
        """Release every held device at once, in (selection, device) order (under the lock)."""
        held, self._held = self._held, {}
        self._release(sorted(held.values(), key=lambda d: (d.selection_id, d.device)))

    def wait_released(self, timeout: float) -> bool:
        """Wait (up to ``timeout`` seconds) until every released device has reported: then a checkpoint holds
        every update its leaves trained, and a resumed run releases exactly what this one would. False if the
        time ran out first."""
        deadline = time.time() + timeout
        with self._cond:
            while not self._stop and any(self._by_leaf.values()):
                left = deadline - time.time()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))  # on the applier's thread (a checkpoint): woken by each arrival
        return True

    def republish(self) -> None:
        """Rebuild what children are told from the schedule (at the start, and after a resume: every device in
        flight whose update has not arrived is held until its release)."""
        with self._cond:
            self._by_leaf, self._leaf_counters = {}, {leaf: n + 1 for leaf, n in self._leaf_counters.items()}
            self._held = {}
        self.publish(list(self.schedule.in_flight.values()))

    def forget_leaf(self, leaf: str) -> None:
        """A lost leaf: nothing more is told about it."""
        with self._cond:
            self._by_leaf.pop(leaf, None)
            self._cond.notify_all()

    def child_view(self, leaves: set[str]) -> ChildView:
        """What a child whose subtree holds ``leaves`` is told now."""
        with self._cond:
            selection: dict[str, int] = {}
            for leaf in leaves:
                selection.update(self._by_leaf.get(leaf) or {})
            known = self.schedule.selection_version
            sids = set(selection.values())
            awaited = self._awaited
            mine = (
                awaited in self.schedule.in_flight
                and awaited not in self.received
                and self.schedule.pool.leaf_of(awaited) in leaves
            )
            return ChildView(
                self._version,
                sum(self._leaf_counters.get(leaf, 0) for leaf in leaves),
                selection,
                {sid: known[sid] for sid in sids},
                (awaited,) if mine else (),
                {sid: self._release_of[sid] for sid in sids if sid in self._release_of},
                self.releases,
                self._stop or self.schedule.done,
            )

    def model(self, version: int) -> dict:
        """A version's packed weights (one a published selection trains is always kept)."""
        return self.global_model.model_packed(version)

    def wait_settled(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) until every received update that can be applied now has been: the next
        one due has not arrived, or the schedule is done. A leaf's reply then brings what its own updates caused."""
        deadline = time.time() + timeout
        with self._cond:
            while not self._stop and not self.finished:
                due = self.schedule.next_due() if self.time_scale <= 0 else None
                busy = self._applying or (due is not None and due.device in self.received)
                if self.time_scale > 0:
                    busy = self._applying or bool(self.received)
                left = deadline - time.time()
                if not busy or left <= 0:
                    return
                self._idle.wait(left)

    def start(self) -> None:
        self._started_at = time.time()
        with self._cond:  # from here on the applier forgets versions as they stop being needed
            self.schedule.take_unneeded_versions()
            self.global_model.retain(self.schedule.needed_versions())
        self.republish()
        self._thread = threading.Thread(target=self._run, name="update-applier", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            self._idle.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def lock(self) -> threading.Condition:
        """Held while the schedule changes: read the schedule (or change its pool) only under it."""
        return self._cond

    # -- the thread ---------------------------------------------------------------------------------------------
    def _next(self) -> tuple[DeviceUpdate, float | None] | None:
        """The next update to apply and its real-time arrival (None: exact), once there is one."""
        with self._cond:
            while not self._stop:
                if self.schedule.done:
                    self.events.flush()
                    self.finished = True
                    return None
                if self.time_scale > 0:
                    now = self.wall_now()
                    if self.received:
                        device = next(iter(self.received))
                        self._applying = True
                        return self.received.pop(device), now
                    late = self._timed_out(now)
                    if late is not None:  # it never reported: it fails now, and a late report is refused
                        self._unlist(late.device)
                        self._applying = True
                        return DeviceUpdate(late.device, late.selection_id, late.base_version, None, count=0), now
                else:
                    due = self.schedule.next_due()
                    if due is not None and due.drops:  # it went offline: it fails now, whatever it sent
                        self.received.pop(due.device, None)
                        self._unlist(due.device)
                        self._applying = True
                        return DeviceUpdate(due.device, due.selection_id, due.base_version, None, count=0), None
                    if due is not None and due.device in self.received:
                        self._applying = True
                        if due.device == self._awaited:  # reselected later, it is awaited anew
                            self._awaited = None
                        return self.received.pop(due.device), None
                    if due is not None and due.device in self._held:  # the server needs it: release
                        self._release_held()
                    if due is not None and due.device != self._awaited:
                        self._awaited = due.device
                        if self.on_stalled is not None:
                            self.on_stalled(due.device)  # its leaf, or one holding news, may be asleep: wake it
                self.events.flush()  # nothing to apply now: the trace so far goes to disk
                self._idle.notify_all()  # settled: the replies waiting for it go out
                self._cond.wait(0.5)
        return None

    def wall_now(self) -> float:
        """The wall clock's time: seconds since the applier started, / ``time_scale``."""
        return (time.time() - self._started_at) / self.time_scale

    def timeout(self) -> float:
        """Wall seconds a device may take now (fixed, or derived from the slowest task measured)."""
        if self.device_timeout > 0:
            return self.device_timeout
        return max(FIRST_DEVICE_TIMEOUT, 3 * self.slowest)

    def _timed_out(self, now: float) -> Dispatch | None:
        """The in-flight device selected longest ago, if it has taken longer than the timeout (none has reported;
        called under the lock)."""
        if self.device_timeout == math.inf or not self.schedule.in_flight:
            return None
        oldest = min(self.schedule.in_flight.values(), key=lambda d: (d.selected_at, d.device))
        late = (now - oldest.selected_at) * self.time_scale > self.timeout()
        return oldest if late else None

    def _run(self) -> None:
        try:
            self._apply_until_done()
        finally:  # finished, stopped or failed: whoever waits for it to settle stops waiting
            with self._cond:
                self._idle.notify_all()

    def _apply_until_done(self) -> None:
        fl_ctx = self.new_context()
        while True:
            item = self._next()
            if item is None:
                return
            try:
                self.apply(*item, fl_ctx)
            except Exception as ex:  # a bug or a broken update (or DP's budget spent): stop the run, state kept
                failed = f"applying the update of device {item[0].device} failed: {type(ex).__name__}: {ex}"
                self.error = str(ex) if isinstance(ex, BudgetSpent) else failed
                self.log_error(self.error)
                return
            with self._cond:
                stalled = self.failures.reason(len(self.schedule.pool))
            if stalled:  # nothing after it is applied: the outcome is the state this update left
                self.error = stalled
                self.log_error(stalled)
                return

    def apply(self, update: DeviceUpdate, now: float | None, fl_ctx) -> None:
        s, model = self.schedule, self.global_model
        update = self._finite.checked(update)
        counted = update.count > 0
        with self._cond:
            if now is not None and counted:  # the wall clock: how long a device took (the derived timeout)
                took = (now - s.in_flight[update.device].selected_at) * self.time_scale
                self.slowest = max(self.slowest, took)
            # the selection policy sees this update's own reports (a leaf's sum of a selection carries none)
            reports = reports_of(update.diff) if s.policy is not None and counted else None
            arrival, selected = s.apply(
                update.device, counted=counted, at=now, reports=reports, sent=update.upload_bytes
            )
            self.failures.note(update.device, arrival.counted, update.error)
            if arrival.made_version:  # the fleet as the version is made, for its results record
                fl_ctx.set_prop(FLEET, s.fleet(), private=True, sticky=False)  # this run's: not sticky
        if counted:
            model.add_update(update, arrival.tau, fl_ctx, sim_time=arrival.arrival)
        if arrival.made_version:
            model.make_version(s.version, s.now, fl_ctx)
        record = arrival.trace_record() | ({"error": update.error} if update.error else {})  # why it failed
        if now is not None:
            record["arrival"] = round(now, 9)
        self.events.write(record, flush=False)  # flushed when the applier waits, and before a checkpoint
        self.applied += 1
        model.forget(s.take_unneeded_versions())  # kept: every in-flight device's version, held back or not
        self.publish(selected)
        if arrival.made_version and self.on_version is not None:
            self.on_version()

"""Applies received device updates in the schedule's order, on a thread of its own.

The assessor hands it every per-device update a leaf reports (``receive``) and answers the leaf at once; this
thread applies them: strictly in simulated arrival order (exact time: the earliest due update only once it has
arrived, every later one waits), or as received (the real-time mode). So a slow step (FedRevive's distillation,
seconds per update on a CPU) never holds a leaf's report past its timeout.

After each applied update it publishes a ``ServerView``: what leaves are told (current version, selection, the
model version of each selection id, the models still needed). A selection is published only together with the
model version it trains, and devices whose update has already arrived are left out of it (a leaf need not train
them again, e.g. after a resume).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nvflare.apis.dxo import DXO

from common.jsonio import JsonlWriter
from common.protocol import DeviceUpdate
from simulation.schedule import ExactSchedule


@dataclass(frozen=True)
class ServerView:
    """A consistent snapshot of what the server tells its children.

    Attributes:
        version: the current model version (0 before the first selection).
        selection_version: bumped whenever ``selection`` changes.
        selection: device -> selection id, for in-flight devices whose update has not arrived yet.
        selection_versions: selection id -> the model version its devices train.
        models: model version -> WEIGHTS DXO, for the current version and every version a listed device trains.
    """

    version: int = 0
    selection_version: int = 0
    selection: dict[str, int] = field(default_factory=dict)
    selection_versions: dict[int, int] = field(default_factory=dict)
    models: dict[int, DXO] = field(default_factory=dict)


class UpdateApplier:
    """Args:
    schedule: the run's schedule (started).
    model_manager: the method's model manager (``aggregation.model_manager``).
    events: where each applied update's trace line goes.
    new_context: makes an ``FLContext`` for this thread (the engine's ``new_context``).
    time_scale: 0: exact order; S > 0: the real-time mode (apply as received, at wall / S).
    on_version: called after each new model version (the checkpoint hook), on this thread.
    log_error: reports a failed update application.
    """

    def __init__(
        self,
        schedule: ExactSchedule,
        model_manager,
        events: JsonlWriter,
        new_context: Callable,
        time_scale: float = 0.0,
        on_version: Callable[[], None] | None = None,
        log_error: Callable[[str], None] = print,
    ):
        self.schedule = schedule
        self.model_manager = model_manager
        self.events = events
        self.new_context = new_context
        self.time_scale = time_scale
        self.on_version = on_version
        self.log_error = log_error
        self.received: dict[str, DeviceUpdate] = {}
        self.applied = 0  # updates applied (lines in events.jsonl)
        self.error = ""  # set when an update could not be applied: the run must stop
        self.finished = False  # the schedule is done and its last update fully applied (its version announced)
        self.view = ServerView()
        self.selection_version = 0
        self._started_at = time.time()
        self._cond = threading.Condition()
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
                return (
                    f"device {update.device} trained version {update.base_version} but was selected for "
                    f"{flight.base_version}"
                )
            self.received[update.device] = update
            self._cond.notify_all()
        return ""

    def publish(self) -> None:
        """Make the schedule's current selection, versions and models what children are told."""
        with self._cond:
            s, mm = self.schedule, self.model_manager
            selection = {d: f.selection_id for d, f in s.in_flight.items() if d not in self.received}
            if selection != self.view.selection or mm.current_version != self.view.version:
                self.selection_version += 1
            versions = {f.selection_id: f.base_version for f in s.in_flight.values()}
            needed = {f.base_version for d, f in s.in_flight.items() if d in selection} | {mm.current_version}
            self.view = ServerView(
                mm.current_version, self.selection_version, selection, versions, {v: mm.model_dxo(v) for v in needed}
            )

    def start(self) -> None:
        self._started_at = time.time()
        self.publish()
        self._thread = threading.Thread(target=self._run, name="update-applier", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
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
                    self.finished = True
                    return None
                if self.time_scale > 0:
                    if self.received:
                        device = next(iter(self.received))
                        now = (time.time() - self._started_at) / self.time_scale
                        return self.received.pop(device), now
                else:
                    due = self.schedule.next_due()
                    if due is not None and due.device in self.received:
                        return self.received.pop(due.device), None
                self._cond.wait(0.5)
        return None

    def _run(self) -> None:
        fl_ctx = self.new_context()
        while True:
            item = self._next()
            if item is None:
                return
            try:
                self.apply(*item, fl_ctx)
            except Exception as ex:  # a bug or a broken update: stop the run rather than train on wrong state
                self.error = f"applying the update of device {item[0].device} failed: {type(ex).__name__}: {ex}"
                self.log_error(self.error)
                return

    def apply(self, update: DeviceUpdate, now: float | None, fl_ctx) -> None:
        s, mm = self.schedule, self.model_manager
        counted = update.count > 0
        with self._cond:
            arrival, _ = s.apply(update.device, counted=counted, at=now)
        if counted:
            mm.add_update(update, arrival.tau, fl_ctx)
        if arrival.made_version:
            mm.make_version(s.now, fl_ctx)
        record = arrival.trace_record()
        if now is not None:
            record["arrival"] = round(now, 9)
        if not counted:
            record["failed"] = True
        self.events.write(record)
        self.applied += 1
        mm.retain(s.needed_versions())
        self.publish()
        if arrival.made_version and self.on_version is not None:
            self.on_version()

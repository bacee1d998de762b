"""The server's workflow brain on exact simulated time: apply device updates in arrival order, select in reply.

NVFlare's edge workflow (``ScatterAndGatherForEdge``) calls the assessor with each report from a child (a leaf,
or a relay above leaves) and asks it, every ``assess_interval``, whether the run is done. NVFlare's own
``ModelUpdateAssessor`` applies whatever a report brings, in the order reports happen to arrive. This one keeps
``simulation.schedule.ExactSchedule``: it knows every in-flight device's arrival time from the moment it selects
it, holds the per-device updates it has received, and applies the earliest due one only once it has it, i.e.
once every device due earlier has reported. Leaves just train as fast as they can. So the trace of applied
updates (``events.jsonl``: version, device, base version, arrival, tau) is the reference schedule's, whatever the
machine's load, worker counts or sync intervals.

Around the schedule it:

* waits until every expected leaf has registered its devices before the first selection (a start-up race
  otherwise decides which leaf's devices are picked);
* has the model manager buffer each applied update and make a version after exactly B of them, at the B-th
  arrival's simulated time;
* replies to each child with the current version, the selection (device -> selection id), the model version each
  selection id trains and every version the child's selected devices still need;
* keeps only the model versions some in-flight device trains (``model_manager.retain``).

``time_scale`` > 0 is the real-time mode for load tests: leaves hold each result for its delays x S wall seconds
and updates are applied as received, at simulated time (wall - start) / S.
"""

from __future__ import annotations

import os
import threading
import time

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.abstract.learnable_persistor import LearnablePersistor
from nvflare.app_common.abstract.model import ModelLearnable
from nvflare.app_common.app_event_type import AppEventType
from nvflare.edge.assessor import Assessment, Assessor
from nvflare.edge.mud import BaseState, PropKey, StateUpdateReply, StateUpdateReport
from nvflare.fuel.utils.tree_utils import Forest, Node

from common.delays import DelayConfig, DeviceDelays
from common.jsonio import JsonlWriter
from common.output import output_dir
from common.protocol import (
    DEVICE_RANGES,
    DEVICE_UPDATES,
    MODELS,
    SELECTION_SUMS,
    SELECTION_VERSIONS,
    DeviceUpdate,
    SelectionSum,
)
from simulation.device_pool import DevicePool
from simulation.schedule import ExactSchedule


def leaves_under(hierarchy: Forest | None) -> dict[str, set[str]]:
    """Each client's leaves (itself, for a leaf), from NVFlare's client hierarchy; empty without one."""
    if hierarchy is None:
        return {}

    def leaves(node: Node) -> set[str]:
        return {node.obj.name} if not node.children else set().union(*(leaves(c) for c in node.children))

    return {name: leaves(node) for name, node in hierarchy.nodes.items()}


class ExactTimeAssessor(Assessor):
    """Args:
    persistor_id: component id of the persistor holding the initial model.
    model_manager_id: component id of the method's model manager (``aggregation.model_manager``).
    num_leaves: leaves whose devices must all be registered before the first selection.
    selection_size: devices in flight (K).
    updates_per_version: updates per new model version (B).
    min_hole_to_fill: free slots before replacements are selected.
    device_reuse: a device may be selected again after its update arrived.
    max_model_version: the last version.
    delays: ``DelayConfig.to_dict()``.
    seed: the run seed (delays and selection).
    time_scale: 0: exact time; S > 0: real-time mode (apply on receipt, simulated time = wall / S).
    device_wait_timeout: seconds to wait for the leaves' devices before stopping the job.
    max_sim_time: stop before the first update arriving later (None: no limit).
    results_dir: where ``events.jsonl`` goes ("": the server app's run folder).
    """

    def __init__(
        self,
        persistor_id: str,
        model_manager_id: str,
        num_leaves: int,
        selection_size: int,
        updates_per_version: int,
        min_hole_to_fill: int,
        device_reuse: bool = True,
        max_model_version: int = 10,
        delays: dict | None = None,
        seed: int = 0,
        time_scale: float = 0.0,
        device_wait_timeout: float = 120.0,
        max_sim_time: float | None = None,
        results_dir: str = "",
    ):
        super().__init__()
        self.persistor_id = persistor_id
        self.model_manager_id = model_manager_id
        self.num_leaves = num_leaves
        self.selection_size = selection_size
        self.updates_per_version = updates_per_version
        self.min_hole_to_fill = min_hole_to_fill
        self.device_reuse = device_reuse
        self.max_model_version = max_model_version
        self.delays = delays or {}
        self.seed = seed
        self.time_scale = time_scale
        self.device_wait_timeout = device_wait_timeout
        self.max_sim_time = max_sim_time
        self.results_dir = results_dir
        self.schedule: ExactSchedule | None = None
        self.model_manager = None
        self.stop_reason = ""  # why the run ended early ("" while it runs or when it ended normally)
        self._initial: dict | None = None
        self._received: dict[str, DeviceUpdate] = {}
        self._selection_version = 0  # bumped whenever the selection changes
        self._started_at: float | None = None  # wall time of simulated time 0 (real-time mode)
        self._waiting_since = time.time()
        self._events: JsonlWriter | None = None
        self._leaves_under: dict[str, set[str]] = {}  # child -> the leaves in its subtree
        self._lock = threading.Lock()
        self.register_event_handler(EventType.START_RUN, self._start_run)
        self.register_event_handler(EventType.END_RUN, self._end_run)

    # -- run lifecycle ------------------------------------------------------------------------------------------
    def _start_run(self, _event: str, fl_ctx: FLContext) -> None:
        engine = fl_ctx.get_engine()
        persistor = engine.get_component(self.persistor_id)
        if not isinstance(persistor, LearnablePersistor):
            self.system_panic(f"component {self.persistor_id!r} must be a LearnablePersistor", fl_ctx)
            return
        self.model_manager = engine.get_component(self.model_manager_id)
        model = persistor.load(fl_ctx)
        if not isinstance(model, ModelLearnable):
            self.system_panic(f"the persistor returned {type(model)}, not a ModelLearnable", fl_ctx)
            return
        self._initial = dict(model["weights"])
        self.fire_event(AppEventType.INITIAL_MODEL_LOADED, fl_ctx)
        pool = DevicePool(self.seed)
        self.schedule = ExactSchedule(
            pool, DeviceDelays(DelayConfig.from_dict(self.delays), self.seed), self.selection_size,
            self.updates_per_version, self.min_hole_to_fill, self.device_reuse, self.max_model_version,
            self.max_sim_time,
        )  # fmt: skip
        self._events = JsonlWriter(os.path.join(output_dir(self.results_dir, fl_ctx), "events.jsonl"))
        self._waiting_since = time.time()
        self._leaves_under = leaves_under(fl_ctx.get_prop(FLContextKey.CLIENT_HIERARCHY))

    def _end_run(self, _event: str, fl_ctx: FLContext) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def start_task(self, fl_ctx: FLContext) -> Shareable:
        return BaseState(model_version=0, model=None, device_selection_version=0, device_selection={}).to_shareable()

    def assess(self, fl_ctx: FLContext) -> Assessment:
        with self._lock:
            s = self.schedule
            if s is None:
                return Assessment.CONTINUE
            if not s.version:
                if time.time() - self._waiting_since > self.device_wait_timeout:
                    self.stop_reason = (
                        f"only leaves {sorted(s.pool.leaves)} of {self.num_leaves} registered devices within "
                        f"--device-wait-timeout {self.device_wait_timeout:g} s"
                    )
                    self.log_error(fl_ctx, f"stopping the job: {self.stop_reason}")
                    return Assessment.WORKFLOW_DONE
                return Assessment.CONTINUE
            if s.done:
                if s.version < self.max_model_version and s.next_due() is None and self.max_sim_time is None:
                    self.stop_reason = "no device left to select (the pool is exhausted: --no-device-reuse)"
                    self.log_error(fl_ctx, f"stopping the job: {self.stop_reason}")
                self.log_info(fl_ctx, f"done at version {s.version}, simulated time {s.now:.3f}")
                return Assessment.WORKFLOW_DONE
            return Assessment.CONTINUE

    # -- reports from children ----------------------------------------------------------------------------------
    def process_child_update(self, update: Shareable, fl_ctx: FLContext) -> tuple[bool, Shareable | None]:
        with self._lock:
            if self.schedule is None:
                return False, None
            report = StateUpdateReport.from_shareable(update)
            self._register_devices(update, report, fl_ctx)
            if not self.schedule.version and len(self.schedule.pool.leaves) >= self.num_leaves:
                self._start(fl_ctx)
            for entry in update.get(DEVICE_UPDATES) or ():
                self._receive(DeviceUpdate.from_dict(entry), fl_ctx)
            for entry in update.get(SELECTION_SUMS) or ():
                for device_update in SelectionSum.from_dict(entry).device_updates():
                    self._receive(device_update, fl_ctx)
            self._apply_due(fl_ctx)
            return True, self._reply(report, fl_ctx.get_peer_context().get_identity_name())

    def _register_devices(self, update: Shareable, report: StateUpdateReport, fl_ctx: FLContext) -> None:
        pool = self.schedule.pool
        for prefix, (count, leaf) in (update.get(DEVICE_RANGES) or {}).items():
            pool.register_range(prefix, int(count), leaf)
        for device_id, device in (report.available_devices or {}).items():
            pool.register(device_id, device.client_name)

    def _start(self, fl_ctx: FLContext) -> None:
        self.log_info(fl_ctx, f"all {self.num_leaves} leaves registered {len(self.schedule.pool)} devices: starting")
        self.model_manager.start(self._initial, fl_ctx)
        self._started_at = time.time()
        self.schedule.start()
        self._selection_version += 1

    def _receive(self, update: DeviceUpdate, fl_ctx: FLContext) -> None:
        flight = self.schedule.in_flight.get(update.device)
        if flight is None or flight.selection_id != update.selection_id:
            self.log_warning(fl_ctx, f"dropped an update of device {update.device} for selection "
                                     f"{update.selection_id}: not in flight")  # fmt: skip
            return
        if update.base_version != flight.base_version:
            self.log_error(fl_ctx, f"device {update.device} trained version {update.base_version}, selected for "
                                   f"{flight.base_version}")  # fmt: skip
        self._received[update.device] = update

    def _apply_due(self, fl_ctx: FLContext) -> None:
        s = self.schedule
        if not s.version:
            return
        if self.time_scale > 0:  # real-time mode: in the order received
            for device in list(self._received):
                if s.done:
                    break
                now = (time.time() - self._started_at) / self.time_scale
                self._apply(self._received.pop(device), now, fl_ctx)
            return
        while not s.done:
            due = s.next_due()
            if due.device not in self._received:
                return  # wait for it: every later update waits too
            self._apply(self._received.pop(due.device), None, fl_ctx)

    def _apply(self, update: DeviceUpdate, now: float | None, fl_ctx: FLContext) -> None:
        s, mm = self.schedule, self.model_manager
        counted = update.count > 0
        arrival, _ = s.apply(update.device, counted=counted, at=now)
        self._selection_version += 1
        if counted:
            mm.add_update(update, arrival.tau, fl_ctx)
        if arrival.made_version:
            mm.make_version(s.now, fl_ctx)
        record = arrival.trace_record() | {"base_version": update.base_version}
        if now is not None:
            record["arrival"] = round(now, 9)
        self._events.write(record)
        mm.retain(s.needed_versions())

    def _reply(self, report: StateUpdateReport, child: str) -> Shareable:
        """What ``child`` needs: the current version, its part of the selection, the version of each of its
        selection ids, and every version its in-flight devices train that it does not hold yet (it holds the
        version it reported and every older one its devices still need)."""
        s, mm = self.schedule, self.model_manager
        if not s.version:
            return StateUpdateReply(0, None, 0, None).to_shareable()
        leaves = self._leaves_under.get(child, {child})
        mine = [f for f in s.in_flight.values() if s.pool.leaf_of(f.device) in leaves]
        child_version = report.current_model_version or 0
        model = mm.model_dxo(mm.current_version) if child_version != mm.current_version else None
        changed = report.current_device_selection_version != self._selection_version
        selection = {f.device: f.selection_id for f in mine} if changed else None
        reply = StateUpdateReply(mm.current_version, model, self._selection_version, selection).to_shareable()
        if changed:
            reply[PropKey.DEVICE_SELECTION] = selection  # even when empty: the child's devices are all done
        needed = {f.base_version for f in mine if f.base_version > child_version} - {mm.current_version}
        if needed:
            reply[MODELS] = {v: mm.model_dxo(v) for v in sorted(needed)}
        reply[SELECTION_VERSIONS] = {f.selection_id: f.base_version for f in mine}
        return reply

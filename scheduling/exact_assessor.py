"""The server's workflow brain on exact simulated time: device updates applied in arrival order, selection in reply.

NVFlare's edge workflow (``ScatterAndGatherForEdge``) calls the assessor with each report from a child (a leaf, or
a relay above leaves) and asks it, every ``assess_interval``, whether the run is done. NVFlare's own
``ModelUpdateAssessor`` applies whatever a report brings, in the order reports happen to arrive. This one keeps an
``ExactSchedule`` (``scheduling.schedule``): it knows every in-flight device's arrival time from the moment it
selects it, and its ``UpdateApplier`` thread applies the earliest due update only once it has arrived, i.e. once
every device due earlier has reported. Leaves just train as fast as they can. So the trace of applied updates
(``events.jsonl``) is the reference schedule's, whatever the machine's load, worker counts or sync intervals.

Around the schedule it:

* waits until every expected leaf has registered its devices before the first selection (a start-up race
  otherwise decides which leaf's devices are picked);
* answers each report at once, from the applier's last published view: the current version, the child's part of
  the selection (devices are handed out in releases, ``scheduling.applier``), the model version and the release
  of each selection id, and the versions its devices still need;
* watches the leaves: a leaf silent for ``leaf_timeout`` seconds is lost (a leaf syncs every ``update_interval``
  + up to 0.5 s, even while its devices train). ``on_leaf_loss`` ``stop`` ends the run, naming the leaf;
  ``continue`` treats its in-flight devices as failed at their arrival times (their slots are refilled from the
  living leaves, which keeps exact order for the rest) and never selects its devices again;
* ends the run when the schedule is done (the last version or the time budget), a leaf is lost (``stop``), the
  devices never all registered, an update could not be applied, or the devices keep failing with errors and
  nothing counts (``max_consecutive_failures``, ``scheduling.failure_streak``), and fires ``RUN_OUTCOME`` saying
  which;
* can save its whole state and restore it (``scheduling.checkpoint``).

With real devices (``real_devices``) the same machinery runs on the wall clock: it starts once ``selection_size``
devices have registered (at whichever leaves NVFlare's routing proxy sent them), tells every child the whole
selection (the proxy routes a device to a leaf by a hash of its id, so any leaf may have to serve any device), and
its applier applies updates as they arrive, failing a device that does not report within the device timeout.

Over 400 lines: this is the one NVFlare component the edge workflow calls (run start and end, each child's report,
``assess``), with 23 documented constructor arguments that NVFlare writes into the job's config; its parts live
beside it (``scheduling.applier``, ``scheduling.leaf_watch``, ``scheduling.child_reply``, ``scheduling.checkpoint``,
``scheduling.waker``), and what remains is the wiring between them.
"""

from __future__ import annotations

import math
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
from nvflare.edge.mud import BaseState, StateUpdateReply, StateUpdateReport

from common import startup_gc
from common.bulk_parent import BulkError, BulkLinks
from common.delays import DelayConfig, DeviceDelays
from common.device_timeout import device_timeout_words
from common.heartbeat import Heartbeat
from common.jsonio import JsonlWriter
from common.nvflare_private import install_nvflare_fixes
from common.output import output_dir
from common.process_settings import settle_process
from common.protocol import (
    BULK,
    BULK_BELOW,
    CHECKPOINT_DUE,
    DEVICE_UPDATES,
    GLOBAL_MODEL_ALIAS,
    HELD_VERSIONS,
    LEAF_INFO,
    LEAF_PLANS,
    LEAF_REPORTS,
    LEAVES_SEEN,
    MODELS,
    RUN_OUTCOME,
    RUN_RESUMED,
    SELECTION_SUMS,
    DeviceUpdate,
    SelectionSum,
)
from common.result_files import EVENTS
from processors.local_work import device_work
from scheduling import checkpoint
from scheduling.applier import UpdateApplier
from scheduling.child_reply import register_devices, reply_to
from scheduling.device_pool import DevicePool
from scheduling.leaf_watch import LeafWatch
from scheduling.nvflare_private import quick_engine_checks
from scheduling.schedule import ExactSchedule
from scheduling.selection import make_policy
from scheduling.waker import Waker

# seconds a report's reply may wait for the updates it brought to be applied (then it carries the selections they
# caused); a slower method (FedRevive's distillation) answers sooner, and the waker brings the news later
SETTLE_SECONDS = 0.05


# the server's last word on its traffic (a log line): benchmarks/perf/bench_transport_floor.py reads it
PROTOCOL_SUMMARY = (
    "protocol: {reports} reports from children, {wakes} wake messages, {applied} updates applied, {models} models sent"
)


class ExactTimeAssessor(Assessor):
    """Args:
    persistor_id: component id of the persistor holding the initial model.
    global_model_id: component id of the run's global model (``aggregation.global_model``).
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
    leaf_timeout: seconds of silence after which a leaf is lost.
    on_leaf_loss: ``stop`` (end the run) or ``continue`` (go on with the living leaves).
    checkpoint_every: versions between checkpoints; 0: automatic (at most 5% of the wall time); -1: never.
    resume: continue from the results folder's checkpoint instead of starting afresh.
    results_dir: where ``events.jsonl`` and ``checkpoint/`` go ("": the server app's run folder).
    real_devices: devices are real (see the module docstring): the wall clock, ``selection_size`` devices to
        start, the whole selection for every child.
    device_timeout: with real devices, seconds a selected device may take (0: derived, ``scheduling.applier``).
    selection: the method's selection policy by import path (``scheduling.selection``); "": uniform.
    selection_args: its constructor's keyword arguments.
    max_consecutive_failures: failed device updates with an error in a row, from as many devices (or the whole
        pool), with none counting since, that stop the run naming the last error; 0: never (the job passes
        ``--max-consecutive-failures``).
    work: ``{"data": DataConfig.to_dict(), "training": TrainingConfig.to_dict()}`` when each device's training
        time scales with its own work (``--local-epochs``; ``processors.local_work.device_work``); None: it does not.
        With ``--partition natural`` also ``"offsets"``: the global device layout the users are mapped by.
    one_update_per_version: each device contributes to a version at most once (differential privacy,
        ``scheduling.schedule``).
    bulk: ``--bulk``: ``auto`` (a child that shares this machine and user sends its diffs and gets its versions
        through shared memory, ``common.bulk_parent``), ``shm`` (the same, and a child that cannot stops the
        run) or ``wire`` (NVFlare's wire for all).
    """

    def __init__(
        self,
        persistor_id: str,
        global_model_id: str,
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
        leaf_timeout: float = 60.0,
        on_leaf_loss: str = "stop",
        checkpoint_every: int = 0,
        resume: bool = False,
        results_dir: str = "",
        real_devices: bool = False,
        device_timeout: float = 0.0,
        selection: str = "",
        selection_args: dict | None = None,
        work: dict | None = None,
        one_update_per_version: bool = False,
        max_consecutive_failures: int = 0,
        bulk: str = "auto",
    ):
        super().__init__()
        self.bulk = bulk
        self.links = BulkLinks(bulk, self.logger.info)
        self._bulk_error = ""  # a diff that could not be read from a child's shared memory: the run stops
        self.max_consecutive_failures = max_consecutive_failures
        self.selection = selection
        self.selection_args = selection_args or {}
        self.work = work
        self.one_update_per_version = one_update_per_version
        self.real_devices = real_devices
        self.device_timeout = device_timeout
        install_nvflare_fixes()  # one thread for finished streams, no payload rendering (nvflare_private)
        self.persistor_id = persistor_id
        self.global_model_id = global_model_id
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
        self.leaf_timeout = leaf_timeout
        self.on_leaf_loss = on_leaf_loss
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.results_dir = results_dir
        self.schedule: ExactSchedule | None = None
        self.applier: UpdateApplier | None = None
        self.global_model = None
        self.outcome: dict | None = None
        self.leaves = LeafWatch(leaf_timeout)
        self._initial: dict | None = None
        self._engine = None
        self._out = ""
        self._started_wall = time.time()
        self._wall_offset = 0.0  # wall seconds of the run before a resume
        self._policy = checkpoint.CheckpointPolicy(checkpoint_every)
        self._events: JsonlWriter | None = None
        self._waker: Waker | None = None
        self._news: set[str] = set()  # children with newly selected devices they have not heard of yet
        self.reports = 0  # reports (syncs) received from children
        self.models_sent = 0  # model versions carried by the replies to them
        self._news_lock = threading.Lock()
        self._waiting_since = time.time()
        self._lock = threading.Lock()
        self.register_event_handler(EventType.START_RUN, self._start_run)
        self.register_event_handler(EventType.END_RUN, self._end_run)

    # -- run lifecycle ------------------------------------------------------------------------------------------
    def _start_run(self, _event: str, fl_ctx: FLContext) -> None:
        startup_gc.resume()  # the server is built (paused for its start-up in SimEnv: common.early_start)
        self._engine = fl_ctx.get_engine()
        quick_engine_checks(self._engine)  # the simulator's server ends soon after END_RUN (nvflare_private, 9)
        persistor = self._engine.get_component(self.persistor_id)
        if not isinstance(persistor, LearnablePersistor):
            self.system_panic(f"component {self.persistor_id!r} must be a LearnablePersistor", fl_ctx)
            return
        self.global_model = self._engine.get_component(self.global_model_id)
        model = persistor.load(fl_ctx)
        if not isinstance(model, ModelLearnable):
            self.system_panic(f"the persistor returned {type(model)}, not a ModelLearnable", fl_ctx)
            return
        self._initial = dict(model["weights"])
        self.fire_event(AppEventType.INITIAL_MODEL_LOADED, fl_ctx)
        pool = DevicePool(self.seed)
        self.schedule = ExactSchedule(
            pool,
            DeviceDelays(
                DelayConfig.from_dict(self.delays),
                self.seed,
                device_work(self.work["data"], self.work["training"], self.seed, self.work.get("offsets"))
                if self.work
                else None,
            ),
            self.selection_size,
            self.updates_per_version,
            self.min_hole_to_fill,
            self.device_reuse,
            self.max_model_version,
            self.max_sim_time,
            make_policy(self.selection, self.selection_args),
            self.one_update_per_version,
        )
        self._out = output_dir(self.results_dir, fl_ctx)
        self._events = JsonlWriter(os.path.join(self._out, EVENTS))
        self._waiting_since = self._started_wall = time.time()
        self.leaves.set_hierarchy(fl_ctx.get_prop(FLContextKey.CLIENT_HIERARCHY))
        self._waker = Waker(self._engine, self._engine.new_context, lambda msg: self.log_warning(fl_ctx, msg))
        if self.resume:
            self._restore(checkpoint.read(self._out), fl_ctx)

    def _end_run(self, _event: str, fl_ctx: FLContext) -> None:
        if self.applier is not None:
            self.applier.stop()
            wakes = self._waker.sent if self._waker is not None else 0
            self.log_info(
                fl_ctx,
                PROTOCOL_SUMMARY.format(
                    reports=self.reports, wakes=wakes, applied=self.applier.applied, models=self.models_sent
                ),
            )
        if self._waker is not None:
            self._waker.stop()
        if self.outcome is None:  # ended by NVFlare (an abort) before the schedule was done
            self._finish("stopped", "the run was aborted before its last version", fl_ctx)
        if self._events is not None:
            self._events.close()
            self._events = None

    def start_task(self, fl_ctx: FLContext) -> Shareable:
        return BaseState(model_version=0, model=None, device_selection_version=0, device_selection={}).to_shareable()

    def _ready(self) -> bool:
        """Whether the first selection can be made: every leaf's devices registered (simulated), or enough
        devices for one selection (real ones)."""
        pool = self.schedule.pool
        return len(pool) >= self.selection_size if self.real_devices else len(pool.leaves) >= self.num_leaves

    def _start(self, fl_ctx: FLContext) -> None:
        if self.real_devices:
            self.log_info(
                fl_ctx,
                f"{len(self.schedule.pool)} real devices registered: starting on the wall clock; a device that "
                f"does not report within {device_timeout_words(self.device_timeout)} counts as failed",
            )
        else:
            self.log_info(
                fl_ctx, f"all {self.num_leaves} leaves registered {len(self.schedule.pool)} devices: starting"
            )
        selected = self.schedule.start()
        self.global_model.start(self._initial, self.schedule.version, fl_ctx)
        self._note_news([d.device for d in selected])
        settle_process()  # what the run keeps is built: the per-update garbage and buffers cost less from here
        self._make_applier(fl_ctx).start()

    def _note_news(self, devices: list[str]) -> None:
        """Newly selected ``devices``: the children above their leaves have news (they hear it on their next
        sync, or are woken when the applier waits)."""
        pool = self.schedule.pool
        with self._news_lock:
            self._news.update(self.leaves.child_of(leaf) for leaf in map(pool.leaf_of, devices) if leaf is not None)

    def _wake_for(self, awaited: str) -> None:
        """The applier waits for ``awaited``'s update: wake every child that has not heard of its newly selected
        devices yet, and the one holding ``awaited`` (an idle leaf sleeps until woken; a busy one batches its
        results, except an awaited device's)."""
        leaf = self.schedule.pool.leaf_of(awaited)
        holder = self.leaves.child_of(leaf) if leaf is not None else None
        with self._news_lock:
            news, self._news = self._news, set()
        if self._waker is not None:
            self._waker.wake(news, holder, awaited)

    def _make_applier(self, fl_ctx: FLContext) -> UpdateApplier:
        self.applier = UpdateApplier(
            self.schedule,
            self.global_model,
            self._events,
            self._engine.new_context,
            1.0 if self.real_devices else self.time_scale,
            on_version=lambda: self._on_version(fl_ctx),
            log_error=lambda msg: self.log_error(fl_ctx, msg),
            on_selected=self._note_news,
            on_stalled=self._wake_for,
            device_timeout=self.device_timeout if self.real_devices else math.inf,
            max_consecutive_failures=self.max_consecutive_failures,
        )
        return self.applier

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def _state(self) -> dict:
        """The whole server state (called on the applier thread, between two updates)."""
        wall = self._wall_offset + time.time() - self._started_wall
        return checkpoint.server_state(self.applier, self.schedule, wall) | {
            GLOBAL_MODEL_ALIAS: self.global_model.state_dict()
        }

    def _restore(self, state: dict, fl_ctx: FLContext) -> None:
        meta = state["meta"]
        self.schedule.load_state_dict(state["schedule"])
        # a run that ended at its last version, resumed with a larger one: the devices its last arrival left
        # unselected are selected now, as that arrival would have without the cap
        self._note_news([d.device for d in self.schedule.refill()])
        self.global_model.load_state_dict(state[GLOBAL_MODEL_ALIAS], fl_ctx)
        applier = self._make_applier(fl_ctx)
        checkpoint.restore_received(applier, state)
        self._events.truncate(meta["applied"])
        self._wall_offset = meta["wall_seconds"]
        self.log_info(fl_ctx, f"resumed at version {meta['version']}, simulated time {meta['sim_seconds']:.6g}")
        self.fire_event_with_data(RUN_RESUMED, fl_ctx, RUN_RESUMED, meta)
        applier.start()

    def _on_version(self, fl_ctx: FLContext) -> None:
        version = self.schedule.version
        if not self._policy.due(version):
            return
        # every released device's update in the checkpoint: a resumed run then releases what this one does
        if not self.applier.wait_released(self.leaf_timeout):
            self.log_warning(
                fl_ctx,
                f"checkpoint at version {version}: released devices still unreported after {self.leaf_timeout:g} s; "
                "a run resumed from it may train them in other groups (the same versions, other float rounding)",
            )
        # the evaluator records what it still owes up to this version (a resume starts after it)
        self.fire_event_with_data(CHECKPOINT_DUE, fl_ctx, CHECKPOINT_DUE, version)
        try:
            self._events.flush()  # the trace up to the checkpoint is on disk: a resume truncates it there
            with Heartbeat(self._out, "checkpoint", version):  # a large model's takes seconds: not a hang
                seconds = checkpoint.write(self._out, self._state())
        except OSError as ex:
            self.log_error(fl_ctx, f"checkpoint at version {version} not written ({ex}); the previous one is kept")
            return
        self._policy.written(seconds)
        self.log_info(fl_ctx, f"checkpoint at version {version} written in {seconds:.2f} s")

    # -- when is it over ----------------------------------------------------------------------------------------
    def _finish(self, status: str, reason: str, fl_ctx: FLContext) -> None:
        s = self.schedule
        version = s.version if s else 0
        if self.global_model is not None:  # a version the schedule counted but the model never made (DP's budget)
            version = min(version, self.global_model.current_version)
        self.outcome = {
            "status": status,
            "reason": reason,
            "version": version,
            "sim_seconds": round(s.now, 9) if s else 0.0,
        }
        log = self.log_info if status == "completed" else self.log_error
        log(fl_ctx, f"run {status}: {reason}")
        self.fire_event_with_data(RUN_OUTCOME, fl_ctx, RUN_OUTCOME, self.outcome)

    def assess(self, fl_ctx: FLContext) -> Assessment:
        with self._lock:
            if self.outcome is not None:
                return Assessment.WORKFLOW_DONE
            s = self.schedule
            if s is None:
                return Assessment.CONTINUE
            if not s.version:
                if time.time() - self._waiting_since > self.device_wait_timeout:
                    self._finish("stopped", self._not_ready_reason(), fl_ctx)
                    return Assessment.WORKFLOW_DONE
                return Assessment.CONTINUE
            with self.applier.lock:  # the applier thread changes the schedule
                self._check_leaves(fl_ctx)
                if self.outcome is not None:
                    return Assessment.WORKFLOW_DONE
                bulk = self._bulk_error or self.links.required_failure
                if bulk:
                    self._finish("stopped", bulk, fl_ctx)
                elif self.applier.error:
                    self._finish("stopped", self.applier.error, fl_ctx)
                elif self.applier.finished:
                    if s.version >= self.max_model_version:
                        self._finish("completed", f"version {s.version} (--max-model-version)", fl_ctx)
                    elif self.max_sim_time is not None and s.next_due() is not None:
                        self._finish(
                            "completed", f"simulated time {s.now:.6g} (--max-sim-time {self.max_sim_time:g})", fl_ctx
                        )
                    else:
                        self._finish(
                            "stopped",
                            f"no device left to select at version {s.version} (the pool is "
                            "exhausted: --no-device-reuse, or every leaf lost)",
                            fl_ctx,
                        )
            return Assessment.WORKFLOW_DONE if self.outcome is not None else Assessment.CONTINUE

    def _not_ready_reason(self) -> str:
        wait = f"within --device-wait-timeout {self.device_wait_timeout:g} s"
        pool = self.schedule.pool
        if self.real_devices:
            return (
                f"only {len(pool)} real devices registered {wait}, and one selection needs "
                f"{self.selection_size}: start more devices (docs/real-devices.md) or lower "
                "--device-selection-size"
            )
        return f"only leaves {sorted(pool.leaves)} of {self.num_leaves} registered devices {wait}"

    def _check_leaves(self, fl_ctx: FLContext) -> None:
        lost = self.leaves.newly_lost()
        if not lost:
            return
        names = ", ".join(sorted(lost))
        if self.on_leaf_loss == "stop":
            self._finish(
                "stopped",
                f"leaf {names} sent nothing for {self.leaf_timeout:g} s (--leaf-timeout): lost "
                "(--on-leaf-loss stop); metrics.json keeps the versions made so far",
                fl_ctx,
            )
            return
        self.log_error(
            fl_ctx,
            f"leaf {names} lost: its in-flight devices count as failed, its devices are never "
            "selected again (--on-leaf-loss continue)",
        )
        for leaf in lost:
            self.applier.forget_leaf(leaf)
            self.links.forget(leaf)
            self.global_model.held_by(leaf, set())  # its leases of versions end with it
            for device in self.schedule.pool.remove_leaf(leaf):
                if device in self.applier.received:  # it reported before the leaf went silent
                    continue
                flight = self.schedule.in_flight[device]
                self.applier.receive(DeviceUpdate(device, flight.selection_id, flight.base_version, None, count=0))

    # -- reports from children ----------------------------------------------------------------------------------
    def process_child_update(self, update: Shareable, fl_ctx: FLContext) -> tuple[bool, Shareable | None]:
        child = fl_ctx.get_peer_context().get_identity_name()
        received = False
        bulk_word, chosen = None, dict(self.links.choices)
        if self.global_model is not None:
            bulk_word = self.links.on_report(child, update.get(BULK), self.global_model)
            self.links.note_below(update.get(BULK_BELOW))
        with self._lock:  # each child's reports arrive on a thread of their own: the counts are kept under it
            self.reports += 1
            if self.schedule is None:
                return False, None
            report = StateUpdateReport.from_shareable(update)
            self.leaves.heard(child, update.get(LEAVES_SEEN))
            if self.applier is None:
                register_devices(self.schedule.pool, update, report, self.leaves.lost)
                if self._ready():
                    self._start(fl_ctx)
            else:
                with self.applier.lock:
                    register_devices(self.schedule.pool, update, report, self.leaves.lost)
            if self.applier is not None:
                updates = self._updates_of(child, update, fl_ctx)
                for u in updates:
                    refused = self.applier.receive(u)
                    if refused:
                        self.log_warning(fl_ctx, f"dropped an update: {refused}")
                received = bool(updates)
        plans, lines = update.get(LEAF_PLANS), update.get(LEAF_REPORTS)
        bulk = self.links.choices if self.links.choices != chosen else {}
        if plans or lines or bulk:  # recorded by the result components (evaluation)
            info = {"plans": plans or {}, "reports": lines or {}, "bulk": dict(bulk)}
            self.fire_event_with_data(LEAF_INFO, fl_ctx, LEAF_INFO, info)
        if received:  # answer with what they caused (new selections), unless applying them takes long
            self.applier.wait_settled(SETTLE_SECONDS)
        with self._news_lock:
            self._news.discard(child)  # this reply is built from the view as of now: it carries the news
        if self.applier is None:
            reply = StateUpdateReply(0, None, 0, None).to_shareable()
        else:
            held = set(update.get(HELD_VERSIONS) or ())
            if self.links.ready(child):  # the versions it no longer views may be spilled, or their memory reused
                self.global_model.held_by(child, held)
            # real devices: every leaf may be asked by any device (the proxy's hash decides), so each hears everything
            leaves = self.schedule.pool.leaves if self.real_devices else self.leaves.leaves_of(child)
            applier = self.applier
            reply = reply_to(
                applier, leaves, report, held, lambda v: self.links.model(child, v, self.global_model, applier.model)
            )
            with self._lock:
                self.models_sent += len(reply.get(MODELS) or ())
        if bulk_word:
            reply[BULK] = bulk_word
        return True, reply

    def _updates_of(self, child: str, update: Shareable, fl_ctx: FLContext) -> list[DeviceUpdate]:
        """The device updates a report brings (a synchronous leaf's sums as one per device), their diffs copied out
        of the child's shared memory when they came as handles; a diff that cannot be read stops the run."""
        updates: list[DeviceUpdate] = []
        try:
            for entry in update.get(DEVICE_UPDATES) or ():
                updates.append(DeviceUpdate.from_dict(self.links.resolve(child, entry)))
            for entry in update.get(SELECTION_SUMS) or ():
                updates += SelectionSum.from_dict(self.links.resolve(child, entry)).device_updates()
        except BulkError as ex:
            self._bulk_error = str(ex)
            self.log_error(fl_ctx, self._bulk_error)
        return updates

"""One run's server on exact simulated time: its schedule, applier thread, global model, ``events.jsonl``,
checkpoints and outcome. ``scheduling.exact_assessor.ExactTimeAssessor`` holds one; a pack (several runs in one
job, ``docs/packs.md``) holds one per run (``scheduling.pack_assessor``), and what a job has once (the leaves'
watch, the wake messages, the bulk links, the children's reports) stays with the assessor.

A ``RunServer`` speaks through its ``host``, the NVFlare component that holds it: its log lines, its events
(``INITIAL_MODEL_LOADED``, ``RUN_RESUMED``, ``CHECKPOINT_DUE``, ``RUN_OUTCOME``) and its panics. Two callbacks
reach the job: ``on_selected`` (newly selected devices: their children have news) and ``on_stalled`` (the applier
waits for a device: wake its child).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.learnable_persistor import LearnablePersistor
from nvflare.app_common.abstract.model import ModelLearnable
from nvflare.app_common.app_event_type import AppEventType

from common.delays import DelayConfig, DeviceDelays
from common.heartbeat import Heartbeat
from common.jsonio import JsonlWriter
from common.output import output_dir
from common.process_settings import settle_process
from common.protocol import CHECKPOINT_DUE, GLOBAL_MODEL_ALIAS, RUN_OUTCOME, RUN_RESUMED, DeviceUpdate
from common.result_files import EVENTS
from common.run_scope import mark
from processors.local_work import device_work
from scheduling import checkpoint
from scheduling.applier import UpdateApplier
from scheduling.device_pool import DevicePool
from scheduling.schedule import ExactSchedule
from scheduling.selection import make_policy


@dataclass(frozen=True)
class RunOptions:
    """One run's settings (``ExactTimeAssessor``'s arguments of the same names say what each means)."""

    persistor_id: str
    global_model_id: str
    selection_size: int
    updates_per_version: int
    min_hole_to_fill: int
    device_reuse: bool = True
    max_model_version: int = 10
    delays: dict = field(default_factory=dict)
    seed: int = 0
    time_scale: float = 0.0
    max_sim_time: float | None = None
    checkpoint_every: int = 0
    resume: bool = False
    results_dir: str = ""
    real_devices: bool = False
    device_timeout: float = 0.0
    selection: str = ""
    selection_args: dict = field(default_factory=dict)
    work: dict | None = None
    one_update_per_version: bool = False
    max_consecutive_failures: int = 0
    leaf_timeout: float = 60.0  # how long a checkpoint waits for the released devices' updates
    run: int | None = None  # in a pack, this run's index (its events are marked with it: common.run_scope)


class RunServer:
    """Args:
    options: the run's settings.
    host: the NVFlare component that holds it (logs, events, panics).
    on_selected: called with newly selected device ids.
    on_stalled: called with the device the applier waits for.
    """

    def __init__(
        self,
        options: RunOptions,
        host: FLComponent,
        on_selected: Callable[[list[str]], None],
        on_stalled: Callable[[str], None],
    ):
        self.options = options
        self.host = host
        self.on_selected = on_selected
        self.on_stalled = on_stalled
        self.schedule: ExactSchedule | None = None
        self.applier: UpdateApplier | None = None
        self.global_model = None
        self.outcome: dict | None = None
        self.out = ""
        self.events: JsonlWriter | None = None
        self._engine = None
        self._initial: dict | None = None
        self._started_wall = time.time()
        self._wall_offset = 0.0  # wall seconds of the run before a resume
        self._policy = checkpoint.CheckpointPolicy(options.checkpoint_every)

    # -- the run's start ----------------------------------------------------------------------------------------
    def start_run(self, fl_ctx: FLContext) -> bool:
        """At the job's START_RUN: the initial model loaded, the schedule built, ``events.jsonl`` opened, and the
        checkpoint restored when resuming; False when a component is missing (the host has panicked)."""
        o = self.options
        mark(fl_ctx, o.run)
        self._engine = fl_ctx.get_engine()
        persistor = self._engine.get_component(o.persistor_id)
        if not isinstance(persistor, LearnablePersistor):
            self.host.system_panic(f"component {o.persistor_id!r} must be a LearnablePersistor", fl_ctx)
            return False
        self.global_model = self._engine.get_component(o.global_model_id)
        model = persistor.load(fl_ctx)
        if not isinstance(model, ModelLearnable):
            self.host.system_panic(f"the persistor returned {type(model)}, not a ModelLearnable", fl_ctx)
            return False
        self._initial = dict(model["weights"])
        self.host.fire_event(AppEventType.INITIAL_MODEL_LOADED, fl_ctx)
        self.schedule = ExactSchedule(
            DevicePool(o.seed),
            DeviceDelays(
                DelayConfig.from_dict(o.delays),
                o.seed,
                device_work(o.work["data"], o.work["training"], o.seed, o.work.get("offsets")) if o.work else None,
            ),
            o.selection_size,
            o.updates_per_version,
            o.min_hole_to_fill,
            o.device_reuse,
            o.max_model_version,
            o.max_sim_time,
            make_policy(o.selection, o.selection_args),
            o.one_update_per_version,
        )
        self.out = output_dir(o.results_dir, fl_ctx)
        self.events = JsonlWriter(os.path.join(self.out, EVENTS))
        self._started_wall = time.time()
        return True

    def resume(self, fl_ctx: FLContext) -> None:
        """Continue from the results folder's checkpoint (``--resume``)."""
        mark(fl_ctx, self.options.run)
        self._restore(checkpoint.read(self.out), fl_ctx)

    def start(self, fl_ctx: FLContext) -> None:
        """The first selection, the initial version, and the applier thread started (in a pack, a run waiting for a
        place starts when it joins: its wall time counts from here)."""
        mark(fl_ctx, self.options.run)
        self._started_wall = time.time()
        selected = self.schedule.start()
        self.global_model.start(self._initial, self.schedule.version, fl_ctx)
        self.on_selected([d.device for d in selected])
        settle_process()  # what the run keeps is built: the per-update garbage and buffers cost less from here
        self.make_applier(fl_ctx).start()

    def make_applier(self, fl_ctx: FLContext) -> UpdateApplier:
        o = self.options
        self.applier = UpdateApplier(
            self.schedule,
            self.global_model,
            self.events,
            (lambda: mark(self._engine.new_context(), o.run)) if o.run is not None else self._engine.new_context,
            1.0 if o.real_devices else o.time_scale,
            on_version=lambda: self._on_version(fl_ctx),
            log_error=lambda msg: self.host.log_error(fl_ctx, msg),
            on_selected=self.on_selected,
            on_stalled=self.on_stalled,
            device_timeout=o.device_timeout if o.real_devices else math.inf,
            max_consecutive_failures=o.max_consecutive_failures,
        )
        return self.applier

    # -- the run's end ------------------------------------------------------------------------------------------
    def finish(self, status: str, reason: str, fl_ctx: FLContext) -> None:
        """Record the run's outcome, log it and fire ``RUN_OUTCOME``."""
        mark(fl_ctx, self.options.run)
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
        log = self.host.log_info if status in ("completed", "pruned") else self.host.log_error
        log(fl_ctx, f"run {status}: {reason}")
        self.host.fire_event_with_data(RUN_OUTCOME, fl_ctx, RUN_OUTCOME, self.outcome)

    def check_end(self, fl_ctx: FLContext) -> None:
        """Finish the run if its applier failed or its schedule is done (called under the applier's lock)."""
        mark(fl_ctx, self.options.run)
        s, o = self.schedule, self.options
        if self.applier.error:
            self.finish("stopped", self.applier.error, fl_ctx)
        elif self.applier.finished:
            if s.version >= o.max_model_version:
                self.finish("completed", f"version {s.version} (--max-model-version)", fl_ctx)
            elif o.max_sim_time is not None and s.next_due() is not None:
                self.finish("completed", f"simulated time {s.now:.6g} (--max-sim-time {o.max_sim_time:g})", fl_ctx)
            else:
                self.finish(
                    "stopped",
                    f"no device left to select at version {s.version} (the pool is "
                    "exhausted: --no-device-reuse, or every leaf lost)",
                    fl_ctx,
                )

    def lose_leaves(self, lost: set[str]) -> None:
        """Go on without the ``lost`` leaves (``--on-leaf-loss continue``; called under the applier's lock when the
        run has begun): their devices leave the pool, so they are never selected again, and each of them still in
        flight fails (an update of no weight, in its turn), as a device that never reports; the leaves' leases of
        versions end with them. A run still waiting for a place only drops their devices from its pool."""
        run = self.options.run or 0
        for leaf in sorted(lost):
            if self.applier is None:
                self.schedule.pool.remove_leaf(leaf)
                continue
            self.applier.forget_leaf(leaf)
            self.global_model.held_by(leaf, set())
            for device in self.schedule.pool.remove_leaf(leaf):
                if device in self.applier.received:  # it reported before the leaf went silent
                    continue
                flight = self.schedule.in_flight[device]
                self.applier.receive(DeviceUpdate(device, flight.selection_id, flight.base_version, None, 0, run=run))

    def stop(self) -> None:
        """At the job's END_RUN: the applier stopped (the outcome is the host's to record first)."""
        if self.applier is not None:
            self.applier.stop()

    def close(self) -> None:
        """``events.jsonl`` closed (after the outcome)."""
        if self.events is not None:
            self.events.close()
            self.events = None

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def state(self) -> dict:
        """The run's whole state (called on the applier thread, between two updates)."""
        wall = self._wall_offset + time.time() - self._started_wall
        return checkpoint.server_state(self.applier, self.schedule, wall) | {
            GLOBAL_MODEL_ALIAS: self.global_model.state_dict()
        }

    def _restore(self, state: dict, fl_ctx: FLContext) -> None:
        meta = state["meta"]
        self.schedule.load_state_dict(state["schedule"])
        # a run that ended at its last version, resumed with a larger one: the devices its last arrival left
        # unselected are selected now, as that arrival would have without the cap
        self.on_selected([d.device for d in self.schedule.refill()])
        self.global_model.load_state_dict(state[GLOBAL_MODEL_ALIAS], fl_ctx)
        applier = self.make_applier(fl_ctx)
        checkpoint.restore_received(applier, state)
        self.events.truncate(meta["applied"])
        self._wall_offset = meta["wall_seconds"]
        self.host.log_info(fl_ctx, f"resumed at version {meta['version']}, simulated time {meta['sim_seconds']:.6g}")
        self.host.fire_event_with_data(RUN_RESUMED, fl_ctx, RUN_RESUMED, meta)
        applier.start()

    def _on_version(self, fl_ctx: FLContext) -> None:
        if self.options.run is not None:  # on this run's applier thread: a context of its own, not the shared one
            fl_ctx = mark(self._engine.new_context(), self.options.run)
        version = self.schedule.version
        if not self._policy.due(version):
            return
        timeout = self.options.leaf_timeout
        # every released device's update in the checkpoint: a resumed run then releases what this one does
        if not self.applier.wait_released(timeout):
            self.host.log_warning(
                fl_ctx,
                f"checkpoint at version {version}: released devices still unreported after {timeout:g} s; "
                "a run resumed from it may train them in other groups (the same versions, other float rounding)",
            )
        # the evaluator records what it still owes up to this version (a resume starts after it)
        self.host.fire_event_with_data(CHECKPOINT_DUE, fl_ctx, CHECKPOINT_DUE, version)
        try:
            self.events.flush()  # the trace up to the checkpoint is on disk: a resume truncates it there
            with Heartbeat(self.out, "checkpoint", version):  # a large model's takes seconds: not a hang
                seconds = checkpoint.write(self.out, self.state())
        except OSError as ex:
            self.host.log_error(fl_ctx, f"checkpoint at version {version} not written ({ex}); the previous one is kept")
            return
        self._policy.written(seconds)
        self.host.log_info(fl_ctx, f"checkpoint at version {version} written in {seconds:.2f} s")

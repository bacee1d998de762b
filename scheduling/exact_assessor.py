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

Here: the component NVFlare's job config names, its arguments and the job's start (the first selection once every
leaf registered). Beside it, by responsibility: the run's own server (``scheduling.run_server``: its schedule,
applier, global model, events, checkpoints and outcome; a pack holds one per run), the children's reports in and
the replies out (``scheduling.child_intake``), when the run is over and why (``scheduling.run_outcome``), the
applier thread (``scheduling.applier``), the leaves' liveness (``scheduling.leaf_watch``), the wake messages
(``scheduling.waker``) and the checkpoint's files (``scheduling.checkpoint``).
"""

from __future__ import annotations

import threading
import time

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.assessor import Assessor
from nvflare.edge.mud import BaseState

from common import startup_gc
from common.bulk_parent import BulkLinks
from common.device_timeout import device_timeout_words
from common.nvflare_private import install_nvflare_fixes
from scheduling.applier import UpdateApplier
from scheduling.child_intake import ChildIntake
from scheduling.child_news import ChildNews
from scheduling.leaf_watch import LeafWatch
from scheduling.nvflare_private import quick_engine_checks
from scheduling.run_outcome import RunOutcome
from scheduling.run_server import RunOptions, RunServer
from scheduling.schedule import ExactSchedule

# the server's last word on its traffic (a log line): benchmarks/perf/bench_transport_floor.py reads it
PROTOCOL_SUMMARY = (
    "protocol: {reports} reports from children, {wakes} wake messages, {applied} updates applied, {models} models sent"
)


class ExactTimeAssessor(ChildIntake, RunOutcome, Assessor):
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
        self.leaves = LeafWatch(leaf_timeout)
        self.news = ChildNews(self.leaves, lambda device: self.schedule.pool.leaf_of(device))
        self.run_server = RunServer(
            RunOptions(
                persistor_id,
                global_model_id,
                selection_size,
                updates_per_version,
                min_hole_to_fill,
                device_reuse,
                max_model_version,
                self.delays,
                seed,
                time_scale,
                max_sim_time,
                checkpoint_every,
                resume,
                results_dir,
                real_devices,
                device_timeout,
                selection,
                self.selection_args,
                work,
                one_update_per_version,
                max_consecutive_failures,
                leaf_timeout,
            ),
            self,
            self.news.note,
            self.news.wake_for,
        )
        self._engine = None
        self.reports = 0  # reports (syncs) received from children
        self.models_sent = 0  # model versions carried by the replies to them
        self._waiting_since = time.time()
        self._lock = threading.Lock()
        self.register_event_handler(EventType.START_RUN, self._start_run)
        self.register_event_handler(EventType.END_RUN, self._end_run)

    # -- the run's state: its own server (``scheduling.run_server``) ------------------------------------------------
    @property
    def schedule(self) -> ExactSchedule | None:
        return self.run_server.schedule

    @property
    def applier(self) -> UpdateApplier | None:
        return self.run_server.applier

    @property
    def global_model(self):
        return self.run_server.global_model

    @property
    def outcome(self) -> dict | None:
        return self.run_server.outcome

    # -- run lifecycle ------------------------------------------------------------------------------------------
    def _start_run(self, _event: str, fl_ctx: FLContext) -> None:
        startup_gc.resume()  # the server is built (paused for its start-up in SimEnv: common.early_start)
        self._engine = fl_ctx.get_engine()
        quick_engine_checks(self._engine)  # the simulator's server ends soon after END_RUN (nvflare_private, 9)
        if not self.run_server.start_run(fl_ctx):
            return
        self._waiting_since = time.time()
        self.leaves.set_hierarchy(fl_ctx.get_prop(FLContextKey.CLIENT_HIERARCHY))
        self.news.start(self._engine, lambda msg: self.log_warning(fl_ctx, msg))
        if self.resume:
            self.run_server.resume(fl_ctx)

    def _end_run(self, _event: str, fl_ctx: FLContext) -> None:
        if self.applier is not None:
            self.run_server.stop()
            wakes = self.news.wakes_sent
            self.log_info(
                fl_ctx,
                PROTOCOL_SUMMARY.format(
                    reports=self.reports, wakes=wakes, applied=self.applier.applied, models=self.models_sent
                ),
            )
        self.news.stop()
        if self.outcome is None:  # ended by NVFlare (an abort) before the schedule was done
            self._finish("stopped", "the run was aborted before its last version", fl_ctx)
        self.run_server.close()

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
        self.run_server.start(fl_ctx)

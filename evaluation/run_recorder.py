"""The one writer of ``metrics.json``: the run's configuration, every evaluated version and the run's summary.

At START_RUN it writes ``run_info`` (config, environment, plan, profile, and with ``--partition natural`` the
``partition``: users, samples per user as min, median, max and Gini, devices per user;
``processors.data.users.partition_stats``: whatever the driver knew). For each
VERSION_EVALUATED it completes the record with the system figures of the version's stretch (from the
``SystemMonitorComponent`` named by ``monitor_id``) and the throughput since the previously recorded version,
rewrites the file atomically (so a run that dies keeps what it measured) and fires VERSION_RECORDED. The system
summary (SYSTEM_SUMMARY_READY), how the run ended (``outcome``, from the assessor's RUN_OUTCOME: completed, or
stopped and why) and, at END_RUN, the run summary are added the same way. A run ended by a signal is recorded
``interrupted`` by its driver (``record_interruption``), one its sweep stopped ``pruned`` (``record_pruned``).

A record (see ``version_record``)::

    {"version", "accuracy", "wall_seconds", "eval_seconds", "epoch", ["sim_seconds"], ["fleet"],
     "seconds_per_version", "devices_per_second", "system": {GPU %, VRAM, CPU %, RAM of the stretch}}

``fleet`` (exact-time runs): devices online as the version was made, of all ``devices``, and the ``updates``
applied and ``failed`` so far; the summary's ``failure_rate`` is failed over applied. With compression or a
bandwidth (``common.compression``) it also holds ``bytes_up`` and ``bytes_down``, the bytes moved so far
(``scheduling.schedule.ExactSchedule.traffic``), and the summary repeats the last ones. ``privacy`` (differential
privacy): the accountant's inputs and the ``epsilon`` spent after the version (``docs/privacy.md``); the summary
repeats the last ``epsilon`` and ``delta``.

``groups`` (from the leaves' report lines, ``evaluation.leaf_log_writer``): the devices trained, and the mean size
of the groups they were trained in (devices per training call), over the run and after the first selection (an
asynchronous run's first selection is one large release; what follows shows whether its devices keep training
together). With the vectorised engine each record also gets ``mean_group_size`` since the record before, and
``groups_low`` when that is far below what the leaves planned (the progress line then says so).

``bulk`` (from the assessor, ``common.bulk_parent``): for each of the server's children, how its diffs and
versions travel: ``shm`` (shared memory) or ``wire: <why>`` (NVFlare's wire).

``saved_version`` (from the model saver's MODEL_SAVED): the version ``global_model.pt`` holds; the run's last one
from its outcome on, evaluated or not. The summary's ``versions_unevaluated`` lists the versions scheduled for
evaluation (1, every ``--eval-frequency``-th, the last one made) that have no record and were not skipped on
purpose (``--eval-backlog skip``): empty for a run that ended normally. A run whose server died while it evaluated
gets its summary from the driver (``record_summary``), and ``python -m jobs.finish`` evaluates the saved version
afterwards (``record_finished``).
"""

from __future__ import annotations

import json
import os
import threading

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext

from common.jsonio import write_json_atomic
from common.output import output_dir
from common.protocol import LEAF_INFO, RUN_OUTCOME, RUN_RESUMED
from common.result_files import ACCURACY_PLOT, EVENTS, METRICS
from common.run_scope import scoped
from evaluation.events import (
    MODEL_SAVED,
    SAVED_VERSION,
    SYSTEM_SAMPLES,
    SYSTEM_SUMMARY,
    SYSTEM_SUMMARY_READY,
    VERSION_EVALUATED,
    VERSION_RECORD,
    VERSION_RECORDED,
    SystemStretch,
)
from evaluation.fleet import failure_rate
from evaluation.plots import plot_accuracy, warm_up
from evaluation.schedule import schedule_of, unevaluated_versions
from evaluation.utilisation import aggregate, system_fields

LOW_GROUP_SIZE = 8  # a stretch whose groups average fewer devices (and under half the plan's) is flagged


class GroupSizes:
    """Devices and training calls from report lines (each line: one device, ``group`` the size of its call)."""

    def __init__(self) -> None:
        self.devices = 0
        self.calls = 0.0  # a group of g devices is g lines of 1/g each

    def add(self, group: int) -> None:
        self.devices += 1
        self.calls += 1.0 / max(1, group)

    @property
    def mean(self) -> float | None:
        return round(self.devices / self.calls, 2) if self.calls else None


def version_record(evaluated: dict, previous: dict | None, updates_per_version: int, stretch: dict | None) -> dict:
    """The ``metrics.json`` record of one evaluated version.

    ``previous`` is the record of the version recorded before (``None`` for the first): ``seconds_per_version`` and
    ``devices_per_second`` (``updates_per_version`` per version over those seconds) cover the versions since then
    and are ``None`` for the first. ``stretch`` is ``evaluation.utilisation.aggregate`` of the samples since the
    previous record; its figures go under ``system`` (GPU fields ``None`` without GPU data).
    """
    seconds = devices = None
    version, wall = evaluated["version"], evaluated["wall_seconds"]
    if previous is not None and version > previous["version"]:
        steps = version - previous["version"]
        span = wall - previous["wall_seconds"]
        seconds = round(span / steps, 3)
        if updates_per_version and span > 0:
            devices = round(updates_per_version * steps / span, 3)
    return evaluated | {"seconds_per_version": seconds, "devices_per_second": devices, "system": system_fields(stretch)}


def versions_made(results_dir: str, updates_per_version: int) -> int | None:
    """The last version a run made, from its ``events.jsonl`` (None without one): every version after the initial
    one is made from exactly ``updates_per_version`` counted updates (failed ones count nothing)."""
    path = os.path.join(results_dir, EVENTS)
    if not os.path.exists(path) or updates_per_version < 1:
        return None
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return 1 + sum(1 for r in records if not r.get("failed")) // updates_per_version


def run_summary(
    records: list[dict], updates_per_version: int, last_version: int | None = None, config: dict | None = None
) -> dict:
    """Versions trained (up to ``last_version``, the last one the run made, when known; else the last evaluated),
    versions evaluated and not (``versions_unevaluated``, by the schedule in the run's ``config``), final and best
    accuracy, seconds per version and devices per second over the run."""
    last_evaluated = max((r["version"] for r in records), default=None)
    last = max(v for v in (last_version, last_evaluated, 1) if v is not None)
    summary = {
        "versions_trained": last - 1,
        "last_version": last,
        "versions_evaluated": len(records),
        "versions_unevaluated": unevaluated_versions(records, last, *schedule_of(config or {})),
        "last_evaluated_version": last_evaluated,
        "final_accuracy": records[-1]["accuracy"] if records else None,
        "best_accuracy": max((r["accuracy"] for r in records), default=None),
    }
    timed = [r for r in records if not r.get("finished")]  # one evaluated after the run has no wall time of its own
    if len(timed) >= 2 and timed[-1]["version"] > 1:
        span = timed[-1]["wall_seconds"] - timed[0]["wall_seconds"]
        steps = timed[-1]["version"] - timed[0]["version"]
        summary["seconds_per_version"] = round(span / steps, 3)
        summary["devices_per_second"] = round(updates_per_version * steps / span, 3) if span > 0 else None
    if records and records[-1].get("sim_seconds") is not None:
        summary["simulated_seconds"] = records[-1]["sim_seconds"]
    rate = failure_rate(records)
    if rate is not None:
        summary["failure_rate"] = rate
    fleet = next((r["fleet"] for r in reversed(records) if r.get("fleet")), None) or {}
    if "bytes_up" in fleet:  # compression or a bandwidth: the bytes moved by the last recorded version
        summary["bytes_up"], summary["bytes_down"] = fleet["bytes_up"], fleet["bytes_down"]
    privacy = records[-1].get("privacy") if records else None
    if privacy:  # differential privacy: what the run spent, at its last recorded version
        summary["epsilon"], summary["delta"] = privacy["epsilon"], privacy["delta"]
    return summary


def record_interruption(results_dir: str, run_info: dict, signal_name: str) -> dict:
    """A run stopped by a signal before its server could say how it ended: add ``outcome`` ``interrupted`` (the
    signal, the last version made) and the ``summary`` to its ``metrics.json`` (written from ``run_info`` when the
    server wrote none). The driver calls it once every process of the job has stopped, so nothing else writes the
    file any more. Returns the metrics written."""
    path = os.path.join(results_dir, METRICS)
    try:
        with open(path) as f:
            metrics = json.load(f)
    except (OSError, ValueError):
        metrics = dict(run_info, versions=[])
    records = metrics.get("versions", [])
    updates = ((metrics.get("config") or {}).get("federation") or {}).get("num_updates_for_model", 0)
    made = versions_made(results_dir, updates)
    summary = run_summary(records, updates, made, metrics.get("config"))
    if metrics.get("outcome") is None:
        metrics["outcome"] = {
            "status": "interrupted",
            "reason": f"{signal_name} before the run's end",
            "signal": signal_name,
            "version": summary["last_version"],
        }
    metrics["summary"] = summary
    write_json_atomic(path, metrics)
    return metrics


def summary_of(results_dir: str, metrics: dict) -> dict:
    """The run summary of what ``metrics`` records: up to the outcome's version, else the last one ``events.jsonl``
    says was made."""
    records, config = metrics.get("versions", []), metrics.get("config") or {}
    updates = (config.get("federation") or {}).get("num_updates_for_model", 0)
    made = (metrics.get("outcome") or {}).get("version") or versions_made(results_dir, updates)
    return run_summary(records, updates, made, config)


def record_summary(results_dir: str) -> dict:
    """A run whose server ended before it recorded its summary (killed while it evaluated): add the ``summary``
    (with ``versions_unevaluated``) to its ``metrics.json``. The driver calls it once every process of the job has
    stopped, so nothing else writes the file any more. Returns the metrics written ({} when there is no file)."""
    path = os.path.join(results_dir, METRICS)
    try:
        with open(path) as f:
            metrics = json.load(f)
    except (OSError, ValueError):
        return {}
    metrics["summary"] = summary_of(results_dir, metrics)
    write_json_atomic(path, metrics)
    return metrics


def record_finished(results_dir: str, record: dict) -> dict:
    """``python -m jobs.finish``: add the ``record`` of a version evaluated after the run (``"finished": true``)
    among the records, in version order, and recompute the summary (``versions_unevaluated`` shrinks). Run after
    the job has ended: nothing else writes the file any more. Returns the metrics written."""
    path = os.path.join(results_dir, METRICS)
    with open(path) as f:
        metrics = json.load(f)
    records = [r for r in metrics.get("versions", []) if r["version"] != record["version"]] + [record]
    metrics["versions"] = sorted(records, key=lambda r: r["version"])
    metrics["summary"] = summary_of(results_dir, metrics)
    write_json_atomic(path, metrics)
    return metrics


def record_pruned(results_dir: str, reason: str) -> dict:
    """A run its sweep stopped on purpose (``jobs.sweep``: its curve fell behind): the ``interrupted`` outcome its
    driver recorded on the sweep's SIGTERM becomes ``pruned``, with the reason and the last version made. Called once
    every process of the job has ended, so nothing else writes the file any more. Returns the metrics written ({}
    when the run wrote none)."""
    path = os.path.join(results_dir, METRICS)
    try:
        with open(path) as f:
            metrics = json.load(f)
    except (OSError, ValueError):
        return {}
    outcome = metrics.get("outcome") or {}
    last = (metrics.get("versions") or [{}])[-1].get("version")
    metrics["outcome"] = {"status": "pruned", "reason": reason, "version": outcome.get("version", last)}
    write_json_atomic(path, metrics)
    return metrics


class RunRecorder(FLComponent):
    """Args:
    results_dir: where ``metrics.json`` goes ("": the server app's run folder).
    run_info: what the driver knew before the run (config, environment, plan, profile).
    updates_per_version: device updates in one global version (for devices per second).
    monitor_id: component id of the run's ``SystemMonitorComponent`` ("": no system figures).
    plot: draw ``accuracy.png`` at END_RUN; False when the driver draws it (a SimEnv run: ``jobs.run.results``'s
        ``PlotAhead`` draws it while NVFlare shuts down, instead of before).
    run: in a pack, the run it records (``common.run_scope``); None: the job's one run.
    """

    def __init__(
        self,
        results_dir: str = "",
        run_info: dict | None = None,
        updates_per_version: int = 0,
        monitor_id: str = "",
        plot: bool = True,
        run: int | None = None,
    ):
        super().__init__()
        self.run = run
        self.results_dir = results_dir
        self.plot = plot
        self.run_info = run_info or {}
        self.updates_per_version = updates_per_version
        self.monitor_id = monitor_id
        self._monitor = None
        self._out = ""
        self._records: list[dict] = []
        self._system: dict | None = None
        self._summary: dict | None = None
        self._outcome: dict | None = None
        self._saved_version: int | None = None
        self._leaf_plans: dict[str, dict] = {}
        self._bulk: dict[str, str] = {}  # child -> how its bulk arrays travel ("shm", or "wire: why")
        self._groups = {"run": GroupSizes(), "after_first": GroupSizes(), "stretch": GroupSizes()}
        self._lock = threading.Lock()
        self.register_event_handler(EventType.START_RUN, self._start)
        self.register_event_handler(VERSION_EVALUATED, scoped(run, self._record_version))
        self.register_event_handler(SYSTEM_SUMMARY_READY, self._record_system)
        self.register_event_handler(RUN_OUTCOME, scoped(run, self._record_outcome))
        self.register_event_handler(RUN_RESUMED, scoped(run, self._resume))
        self.register_event_handler(LEAF_INFO, scoped(run, self._record_leaf_info))
        self.register_event_handler(MODEL_SAVED, scoped(run, self._record_saved))
        self.register_event_handler(EventType.END_RUN, self._end)

    @property
    def metrics_path(self) -> str:
        return os.path.join(self._out, METRICS)

    def _start(self, _event: str, fl_ctx: FLContext) -> None:
        self._out = output_dir(self.results_dir, fl_ctx)
        if self.monitor_id:
            self._monitor = fl_ctx.get_engine().get_component(self.monitor_id)
        self._write()

    def _record_version(self, _event: str, fl_ctx: FLContext) -> None:
        evaluated = fl_ctx.get_prop(VERSION_RECORD)
        samples = self._monitor.take_stretch() if self._monitor is not None else []
        with self._lock:
            previous = self._records[-1] if self._records else None
            stretch = aggregate(samples)
            record = version_record(evaluated, previous, self.updates_per_version, stretch)
            record |= self._group_fields()
            self._records.append(record)
            self._write()
        start = self._monitor.start_walltime if self._monitor is not None else None
        fl_ctx.set_prop(SYSTEM_SAMPLES, SystemStretch(samples, start, stretch), private=True, sticky=False)
        self.fire_event_with_data(VERSION_RECORDED, fl_ctx, VERSION_RECORD, record)

    def _record_system(self, _event: str, fl_ctx: FLContext) -> None:
        with self._lock:
            self._system = fl_ctx.get_prop(SYSTEM_SUMMARY)
            self._write()

    def _resume(self, _event: str, fl_ctx: FLContext) -> None:
        """A resumed run: keep the records up to the checkpoint's version, drop the rest (they are made again)."""
        version = fl_ctx.get_prop(RUN_RESUMED)["version"]
        path = os.path.join(output_dir(self.results_dir, fl_ctx), METRICS)
        if os.path.exists(path):
            with open(path) as f:
                self._records = [r for r in json.load(f).get("versions", []) if r["version"] <= version]

    def _record_leaf_info(self, _event: str, fl_ctx: FLContext) -> None:
        info = fl_ctx.get_prop(LEAF_INFO)
        plans, reports = info.get("plans"), info.get("reports") or {}
        with self._lock:
            for lines in reports.values():
                for line in lines:
                    group = int(line.get("group") or 1)
                    for name in ("run", "stretch"):
                        self._groups[name].add(group)
                    if (line.get("selection") or 0) > 1:
                        self._groups["after_first"].add(group)
            if plans:
                self._leaf_plans.update(plans)
            if info.get("bulk"):
                self._bulk.update(info["bulk"])
            if plans or info.get("bulk"):
                self._write()

    def _group_fields(self) -> dict:
        """A version record's group figures since the record before (under the lock): only when the leaves train
        with the vectorised engine, where a group's size decides how well the machine is used."""
        stretch, self._groups["stretch"] = self._groups["stretch"], GroupSizes()
        planned = [p.get("group_size", 1) for p in self._leaf_plans.values() if p.get("engine") == "vectorized"]
        if not planned or stretch.mean is None:
            return {}
        fields = {"mean_group_size": stretch.mean}
        if stretch.mean < min(LOW_GROUP_SIZE, max(planned) / 2):
            fields["groups_low"] = True
        return fields

    def _record_saved(self, _event: str, fl_ctx: FLContext) -> None:
        with self._lock:
            self._saved_version = fl_ctx.get_prop(SAVED_VERSION)
            self._write()

    def _record_outcome(self, _event: str, fl_ctx: FLContext) -> None:
        with self._lock:
            first = self._outcome is None
            self._outcome = fl_ctx.get_prop(RUN_OUTCOME)
            self._write()
        if first and self.plot:  # the plot drawn at END_RUN then finds matplotlib imported (evaluation.plots)
            warm_up()

    def _end(self, _event: str, fl_ctx: FLContext) -> None:
        with self._lock:
            made = self._outcome.get("version") if self._outcome else None
            self._summary = run_summary(self._records, self.updates_per_version, made, self.run_info.get("config"))
            self._write()
            if self._records and self.plot:  # here too, so a job run by ``nvflare simulator`` has it
                title = (self.run_info.get("config") or {}).get("run", {}).get("job_name", "")
                plot_accuracy(self._records, os.path.join(self._out, ACCURACY_PLOT), title)

    def _write(self) -> None:
        payload = dict(self.run_info)
        payload["versions"] = self._records
        if self._leaf_plans:
            payload["leaf_plans"] = dict(sorted(self._leaf_plans.items()))
        if self._bulk:
            payload["bulk"] = dict(sorted(self._bulk.items()))
        if self._groups["run"].devices:
            payload["groups"] = {
                "devices": self._groups["run"].devices,
                "mean_group_size": self._groups["run"].mean,
                "mean_group_size_after_first_selection": self._groups["after_first"].mean,
            }
        if self._saved_version is not None:
            payload["saved_version"] = self._saved_version
        if self._system is not None:
            payload["system"] = self._system
        if self._summary is not None:
            payload["summary"] = self._summary
        if self._outcome is not None:
            payload["outcome"] = self._outcome
        write_json_atomic(self.metrics_path, payload)

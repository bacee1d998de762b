"""Runs one job: plan (and check) -> results folder -> recipe -> environment -> guarded run -> outcome.

The exit code says how it ended: 0 when the run completed (its last version, or its simulated-time budget) with
that version evaluated and saved, 1 when it stopped early (a lost leaf, a dead server, devices that never
registered, an error: the message says which, and how to resume when a checkpoint exists), 2 for a configuration
refused before anything started, 3 (``INCOMPLETE``) when it completed but its last version was not evaluated (the
server died or was stopped while it evaluated) or nothing was saved: the last line says what is missing and how to
finish it (``python -m jobs.finish``), 130 / 143 for Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import sys
import time

from common.choices import ConfigError
from common.device_timeout import device_timeout_words
from common.heartbeat import clear_heartbeat
from common.profiles import get_profile
from common.result_files import DRY_RUN_FILES, GLOBAL_MODEL, METRICS
from evaluation.run_recorder import record_interruption, record_summary
from jobs.admin_kit import check_leaf_count, check_server_answers
from jobs.config import JobConfig
from jobs.nvflare_guard import nvflare_problem
from jobs.privacy import privacy_notes
from jobs.run.environments import make_env
from jobs.run.outputs import nvflare_workspace, prepare_output_dir
from jobs.run.plan import RunPlan, prepare
from jobs.run.process_guard import Interrupts, no_orphans
from jobs.run.recipe import EdgeSimRecipe
from jobs.run.remote import ProdFollower, follow_poc
from jobs.run.results import PlotAhead, finalize, format_summary, read_metrics, result_files_of
from jobs.run.schedule_plan import planned_timeline
from jobs.run.watchdog import Watchdog
from jobs.tracking.run_tracking import RunTracking
from processors.data.sources import DatasetError
from scheduling.checkpoint import state_path
from scheduling.timeline import format_timeline, write_timeline

INCOMPLETE = 3  # the run completed, but its last version was not evaluated or nothing was saved
# a test-only hook (tests/e2e/test_slow_evaluation.py): the watchdog's grace in seconds instead of the derived one, so
# that a test's evaluation can outlast it within seconds; no flag, since a run's own grace never needs setting
GRACE_ENV = "EDGESIM_TEST_WATCHDOG_GRACE"


def watchdog_grace(update_timeout: float) -> float:
    """Seconds without progress after the outcome before the watchdog stops a job: 60 s plus a leaf's update
    timeout (a report under way), or ``GRACE_ENV``'s value."""
    return float(os.environ.get(GRACE_ENV) or 60 + update_timeout)


def missing_results(results_dir: str, metrics: dict) -> str:
    """What a run that made versions lacks at its end ("": nothing): its last version unevaluated, or no
    ``global_model.pt``; with the command that finishes it when its last version is saved."""
    summary, outcome = metrics.get("summary") or {}, metrics.get("outcome") or {}
    last = outcome.get("version") or summary.get("last_version")
    if not last:
        return ""
    if not os.path.exists(os.path.join(results_dir, GLOBAL_MODEL)):
        return f"nothing was saved (no {GLOBAL_MODEL}): the run's version {last} is lost"
    if last not in summary.get("versions_unevaluated", ()):
        return ""
    others = [v for v in summary["versions_unevaluated"] if v != last]
    also = f" (nor were versions {', '.join(map(str, others))}, whose weights were not kept)" if others else ""
    if metrics.get("saved_version") == last:
        return (
            f"version {last} was made and saved ({GLOBAL_MODEL}) but not evaluated{also}; evaluate it with: "
            f"python -m jobs.finish {results_dir}"
        )
    return f"version {last} was made but neither evaluated nor saved{also}"


def simulator_failure(ex: Exception) -> str:
    """What a failed SimEnv run means. NVFlare's simulator exits with its server process's exit code, so a server
    killed by signal N (a crash, an out-of-memory kill, ``kill -9``) gives 256 - N."""
    found = re.search(r"return code (-?\d+)", str(ex))
    code = int(found.group(1)) if found else 0
    if code >= 128 or code < 0:
        signum = 256 - code if code > 0 else -code
        name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
        return f"the NVFlare server process died ({name})"
    return f"NVFlare's run failed: {ex}"


def stock_outcome(metrics: dict, max_version: int) -> dict | None:
    """NVFlare's own assessor (``--simulator stock``) decides no outcome: its run completed if its last evaluated
    version is the last one asked for."""
    versions = metrics.get("versions", [])
    if versions and versions[-1]["version"] >= max_version:
        return {"status": "completed", "reason": f"version {versions[-1]['version']} (NVFlare's own assessor)"}
    return None


def report_end(
    results_dir: str,
    started: float,
    files: tuple[str, ...],
    cause: str = "",
    stock_max_version: int | None = None,
    drawn: int | None = None,
) -> int:
    """Print the summary (naming which of the run's result ``files`` exist) and how the run ended; the exit code.
    ``stock_max_version``: the run's server is NVFlare's (no outcome of its own), whose last version this is.
    ``drawn``: the versions in the plot the driver drew (``PlotAhead``), if it did. Called once every process of
    the job has ended: a server that ended before its summary (killed while it evaluated) gets it written here."""
    metrics = read_metrics(results_dir)
    if metrics and "summary" not in metrics:  # versions_unevaluated, in metrics.json too
        record_summary(results_dir)
    if os.path.exists(os.path.join(results_dir, METRICS)):
        summary = finalize(results_dir, time.time() - started, drawn)
        print(format_summary(summary, results_dir, files))
    metrics = read_metrics(results_dir)
    outcome = metrics.get("outcome")
    if outcome is None and stock_max_version is not None:
        outcome = stock_outcome(metrics, stock_max_version)
    missing = missing_results(results_dir, metrics) if outcome is not None else ""
    if outcome is not None:  # the server decided how the run ended; a hang after that is only worth a warning
        if cause:
            print(f"[edgesim] warning: {cause}", file=sys.stderr)
        if outcome["status"] == "completed":
            if missing:
                print(f"[edgesim] the run is incomplete: {missing}", file=sys.stderr)
                return INCOMPLETE
            return 0
    reason = outcome["reason"] if outcome else (cause or "the job ended before the server decided an outcome")
    print(f"[edgesim] the run stopped early: {reason}", file=sys.stderr)
    if missing:
        print(f"[edgesim] its results are incomplete: {missing}", file=sys.stderr)
    if os.path.exists(state_path(results_dir)):
        print(f"[edgesim] continue it from its last checkpoint with: --resume {results_dir}", file=sys.stderr)
    return 1


def check_nvflare() -> None:
    """Refuse (``ConfigError``) an NVFlare whose code our fixes copy or rely on changed; warn on another version
    whose code is unchanged (``jobs.nvflare_guard``)."""
    line, stop = nvflare_problem()
    if stop:
        raise ConfigError(line)
    if line:
        print(line, file=sys.stderr)


def run(cfg: JobConfig, verbose: bool = False) -> int:
    """Run (or export) the job a resolved config describes (``jobs.build``: validated, every derived value
    computed; nothing is derived again here); returns a process exit code (2: refused before anything started,
    the reason printed)."""
    if not cfg.resolved:
        raise TypeError(
            "the driver runs a resolved config only: build it with jobs.build.build_config (or jobs.api.make_config), "
            "or resolve one made otherwise with jobs.build.resolve"
        )
    try:
        if not cfg.run.dry_run:  # a dry run starts no NVFlare
            check_nvflare()
        plan: RunPlan = prepare(cfg)
        plan = dataclasses.replace(plan, notes=plan.notes + privacy_notes(cfg))  # and the run's privacy
        if cfg.run.env == "prod":
            check_leaf_count(cfg.run.startup_kit, cfg.federation.num_leaf_nodes)
        if cfg.run.env == "prod" and not (cfg.run.dry_run or cfg.run.export_only):
            # before the --output folder exists: a server that does not answer leaves nothing behind
            check_server_answers(cfg.run.startup_kit)
        tracking = RunTracking.for_config(cfg)
        tracking.connect()  # here too: a tracker store that cannot be opened leaves an earlier run's folder alone
        results_dir = (
            ""
            if cfg.run.export_only
            else prepare_output_dir(cfg.output_dir, bool(cfg.run.resume), cfg.method_spec.result_files)
        )
    except (ConfigError, DatasetError, ValueError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    run_cfg, leaves = cfg.run, cfg.federation.num_leaf_nodes
    print(
        f"[edgesim] {cfg.method} on {plan.device}, env {run_cfg.env}, simulator {cfg.engine.simulator}, "
        f"seed {run_cfg.seed}, model {cfg.training.model}"
    )
    if run_cfg.dry_run:
        return dry_run(cfg, results_dir)
    print(plan.describe())
    print(get_profile(cfg.engine.profile).describe())
    if cfg.engine.devices == "real":
        print(describe_real_devices(cfg))

    if run_cfg.export_only:
        # an exported job writes its results inside the app's run folder, unless --output names a place
        output = os.path.abspath(run_cfg.output) if run_cfg.output else ""
        EdgeSimRecipe(cfg, plan, results_dir=output).export(job_dir=run_cfg.export_only)
        job_dir = os.path.join(run_cfg.export_only, run_cfg.job_name)
        print(
            f"[edgesim] exported to {job_dir}; run it with: nvflare simulator {job_dir} -w WORKSPACE -n {leaves} -t {leaves}"
        )
        return 0

    print(f"[edgesim] results go to {results_dir}" + (" (resuming)" if run_cfg.resume else ""))
    try:  # before NVFlare starts: a tracker that cannot start its run stops the job here
        for line in tracking.start(results_dir, cfg.to_dict(), cfg.method_spec.flag_prefix):
            print(f"[edgesim] tracking: {line}")
    except ConfigError as ex:
        print(f"error: {ex}", file=sys.stderr)
        with contextlib.suppress(OSError):  # a new run's folder, still empty: nothing is left behind
            os.rmdir(results_dir)
        return 2
    sim = run_cfg.env == "sim"
    # sim: the server writes straight into the results folder; on a deployment it writes into its own job
    # workspace, and the results come home when the job ends (jobs.run.remote), tracked then by this driver
    recipe = EdgeSimRecipe(cfg, plan, results_dir=results_dir if sim else "")
    env = make_env(cfg, nvflare_workspace(results_dir) if sim else "", verbose)
    try:
        if sim:
            return run_sim(recipe, env, results_dir, plan, tracking)
        return run_remote(recipe, env, cfg, results_dir)
    finally:  # once metrics.json holds the run's last word (its outcome and summary)
        for line in tracking.finish():
            print(f"[edgesim] tracked: {line}")


def describe_real_devices(cfg: JobConfig) -> str:
    """What a ``--devices real`` run waits for, and when a device counts as failed."""
    f = cfg.federation
    timeout = device_timeout_words(cfg.engine.device_timeout)
    return (
        f"[edgesim] real devices: the leaves run no simulator; devices ask for job {cfg.run.job_name!r} through "
        f"NVFlare's routing proxy (python -m jobs.deploy up --proxy; docs/real-devices.md). The run starts once "
        f"{f.device_selection_size} devices have registered (--device-wait-timeout {f.device_wait_timeout:g} s) "
        f"and applies updates as they arrive; a selected device that does not report within {timeout} counts "
        "as failed and its slot is refilled"
    )


def dry_run(cfg: JobConfig, results_dir: str) -> int:
    """The run's event trace without training or NVFlare (``scheduling.timeline``), with the run's leaf names: the
    one the build planned (a target epsilon's compositions), else planned here."""
    started = time.time()
    timeline = cfg.planned_timeline
    if timeline is None:
        timeline = planned_timeline(cfg)
    summary = write_timeline(timeline, results_dir)
    print(format_timeline(summary))
    for note in privacy_notes(cfg):  # the noise and the compositions the run would spend
        print(f"[edgesim] {note}")
    print(f"[edgesim] computed in {time.time() - started:.1f} s; {' and '.join(DRY_RUN_FILES)} in {results_dir}")
    return 0


def interrupted(results_dir: str, started: float, code: int, what: str, run_info: dict, files: tuple[str, ...]) -> int:
    """A run ended by Ctrl-C / SIGTERM: record it as ``interrupted`` in ``metrics.json`` (once every process of the
    job has stopped), say what was kept (which of the run's result ``files`` exist), return the exit code (128 + the
    signal)."""
    name = signal.Signals(code - 128).name if code - 128 in signal.valid_signals() else str(code)
    print(f"[edgesim] interrupted ({name}); {what}", file=sys.stderr)
    record_interruption(results_dir, run_info, name)
    print(format_summary(finalize(results_dir, time.time() - started), results_dir, files))
    print(f"[edgesim] partial results (what was made before the interrupt) kept in {results_dir}")
    if os.path.exists(state_path(results_dir)):
        print(f"[edgesim] continue it from its last checkpoint with: --resume {results_dir}", file=sys.stderr)
    return code


def run_sim(recipe: EdgeSimRecipe, env, results_dir: str, plan: RunPlan, tracking: RunTracking) -> int:
    """SimEnv: the job's processes are ours, guarded (no orphans on Ctrl-C) and watched (a dead server); the
    trackers follow the results as they are written."""
    started = time.time()
    cause = ""
    interrupts = Interrupts()
    files = result_files_of(recipe.cfg.method_spec)
    plotter = PlotAhead(results_dir)  # accuracy.png, drawn while NVFlare shuts down (jobs.run.results)
    try:
        with (
            no_orphans() as interrupts,
            Watchdog(results_dir, shutdown_grace=watchdog_grace(plan.timeouts.update_timeout)) as dog,
            plotter,
            tracking,
        ):
            try:
                recipe.run(env)
            except RuntimeError as ex:  # the simulator ended with an error (a killed process, an abort)
                cause = simulator_failure(ex)
            cause = f"{dog.reason}; every process of the job was stopped" if dog.reason else cause
    except BaseException:
        if interrupts.signum is None:
            raise
    finally:
        clear_heartbeat(results_dir)  # every process of the job has ended
    if interrupts.signum is not None:
        # NVFlare may turn the KeyboardInterrupt into its own error, so the signal, not the exception, decides
        what = "every process of the job was stopped"
        plotter.finish()  # a drawing under way ends before the interrupted run's plot is drawn
        return interrupted(results_dir, started, interrupts.exit_code, what, plan.run_info, files)
    cfg = recipe.cfg
    stock_max = cfg.federation.max_model_version if cfg.engine.simulator == "stock" else None
    return report_end(results_dir, started, files, cause, stock_max_version=stock_max, drawn=plotter.finish())


def run_remote(recipe: EdgeSimRecipe, env, cfg: JobConfig, results_dir: str) -> int:
    """PocEnv / ProdEnv: submit, follow, bring the results home (``jobs.run.remote``); Ctrl-C aborts the job."""
    started = time.time()
    files = result_files_of(cfg.method_spec)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # NVFlare's "Connecting to FLARE ..." / "Submitted job ..."
            job_id = recipe.run(env).get_job_id()
    except BaseException:
        with contextlib.suppress(OSError):  # nothing was submitted: no empty results folder is left behind
            os.rmdir(results_dir)
        raise
    print(f"[edgesim] submitted job {job_id} ({cfg.run.env}); following it")
    try:
        if cfg.run.env == "prod":
            follower = ProdFollower(os.path.expanduser(cfg.run.startup_kit), cfg.run.username, files)
            status = follower.follow(job_id, results_dir)
        else:
            status = follow_poc(env, job_id, results_dir, files)
    except KeyboardInterrupt:
        return interrupted(
            results_dir, started, 130, f"job {job_id} was aborted on the deployment", recipe.plan.run_info, files
        )
    print(f"[edgesim] job {job_id} ended: {status}; results in {results_dir}")
    cause = "" if status == "FINISHED:COMPLETED" else f"the job ended with NVFlare status {status}"
    return report_end(results_dir, started, files, cause)

"""Runs a pack on SimEnv: several resolved configs as one NVFlare job (``docs/packs.md``). A user runs one through
a job script's ``--seeds 0,1,2`` or ``jobs.api.run(..., seeds=[0, 1, 2])`` (``jobs.seeds``: one run per seed,
results in ``OUTPUT/seed-N``), and a sweep runs a candidate's seeds so (``jobs.sweep.pack``).

Runs that cannot share a job are refused in one line before NVFlare starts (exit code 2,
``jobs.pack_check.pack_refusal``). Each run gets its own results folder (its ``--output``); NVFlare's workspace is
run 0's. The job is guarded and watched as a standalone run is (``jobs.run.process_guard``, ``jobs.run.watchdog``
over every run's folder): Ctrl-C or SIGTERM records every run not yet ended as ``interrupted`` and exits 130 / 143,
and a dead server or a job that makes no progress after every run's outcome is stopped, naming why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from common.choices import ConfigError
from common.heartbeat import clear_heartbeat
from evaluation.run_recorder import record_interruption
from jobs.config import JobConfig
from jobs.pack_check import check_pack
from jobs.run.driver import watchdog_grace
from jobs.run.environments import make_env
from jobs.run.outputs import nvflare_workspace, prepare_output_dir
from jobs.run.pack_folder import KIND_RUNS, check_at_once, write_manifest
from jobs.run.plan import prepare
from jobs.run.process_guard import Interrupts, no_orphans
from jobs.run.recipe import EdgeSimPackRecipe
from jobs.run.results import finalize
from jobs.run.watchdog import Watchdog
from jobs.tracking.run_tracking import RunTracking
from processors.data.sources import DatasetError


def run_pack(
    cfgs: list[JobConfig],
    verbose: bool = False,
    kind: str = KIND_RUNS,
    labels: list[str] | None = None,
    at_once: int = 0,
) -> int:
    """Run resolved configs (``jobs.build``) as one job; returns a process exit code (2: refused, the reason
    printed, nothing started; 1: the job ended with an error; 130 / 143: interrupted). ``kind`` and ``labels`` (each
    run's seed or name; default its folder's name) go into the pack folder's manifest, which ``--resume`` of that
    folder reads (``jobs.run.pack_folder``). ``at_once``: runs going at a time, in order, each later one joining
    the running job when one ends (``scheduling.pack_assessor``; 0: all from the start)."""
    try:
        if not all(c.resolved for c in cfgs):
            raise ConfigError("a pack runs resolved configs only: build each with jobs.build.build_config")
        check_at_once(at_once, len(cfgs))
        check_pack(cfgs)
        if len({c.output_dir for c in cfgs}) != len(cfgs) or not all(c.output_dir for c in cfgs):
            raise ConfigError("each run of a pack needs a results folder of its own: give each a distinct --output")
        plans = [prepare(c) for c in cfgs]
        trackings = [RunTracking.for_config(c) for c in cfgs]  # each run's tracker runs, as if it ran alone
        for tracking in trackings:
            tracking.connect()
    except (ConfigError, DatasetError, ValueError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    results_dirs = [prepare_output_dir(c.output_dir, bool(c.run.resume), c.method_spec.result_files) for c in cfgs]
    write_manifest(kind, labels or [os.path.basename(d) for d in results_dirs], results_dirs, at_once)
    resuming = any(c.run.resume for c in cfgs)  # a resumed pack's run without a checkpoint starts anew
    folders = [
        d + (" (resuming)" if c.run.resume else " (anew: it wrote no checkpoint)" if resuming else "")
        for c, d in zip(cfgs, results_dirs, strict=True)
    ]
    print(f"[edgesim] a pack of {len(cfgs)} runs in one job: " + ", ".join(folders))
    if 0 < at_once < len(cfgs):
        print(f"[edgesim] {at_once} runs at a time, in order: each later run joins the job when one ends")
    try:  # before NVFlare starts: a tracker that cannot start its run stops the pack here
        for cfg, tracking, results_dir in zip(cfgs, trackings, results_dirs, strict=True):
            for line in tracking.start(results_dir, cfg.to_dict(), cfg.method_spec.flag_prefix):
                print(f"[edgesim] tracking {os.path.basename(results_dir)}: {line}")
    except ConfigError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    recipe = EdgeSimPackRecipe(cfgs, plans, results_dirs, at_once)
    env = make_env(cfgs[0], nvflare_workspace(results_dirs[0]), verbose)
    started = time.time()
    cause = ""
    interrupts = Interrupts()
    grace = watchdog_grace(max(p.timeouts.update_timeout for p in plans))
    try:
        with contextlib.ExitStack() as followed:
            interrupts = followed.enter_context(no_orphans())
            dog = followed.enter_context(Watchdog(results_dirs, shutdown_grace=grace))
            for tracking in trackings:  # each follows its run's metrics.json while the job runs
                followed.enter_context(tracking)
            try:
                recipe.run(env)
            except RuntimeError as ex:  # the simulator ended with an error
                cause = str(ex)
            cause = f"{dog.reason}; every process of the job was stopped" if dog.reason else cause
    except BaseException:
        if interrupts.signum is None:
            raise
    finally:
        for results_dir in results_dirs:
            clear_heartbeat(results_dir)
    if interrupts.signum is not None:  # the signal decides: NVFlare may report it as a failed job
        name = signal.Signals(interrupts.signum).name
        print(f"[edgesim] interrupted ({name}); every process of the pack's job was stopped", file=sys.stderr)
        for results_dir, plan in zip(results_dirs, plans, strict=True):
            record_interruption(results_dir, plan.run_info, name)
    elif cause:
        print(f"error: the pack's job failed: {cause}", file=sys.stderr)
    for tracking, results_dir in zip(trackings, results_dirs, strict=True):
        finalize(results_dir, time.time() - started)
        for line in tracking.finish():  # once metrics.json holds the run's last word
            print(f"[edgesim] tracked {os.path.basename(results_dir)}: {line}")
    return interrupts.exit_code if interrupts.signum is not None else int(bool(cause))

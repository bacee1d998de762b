"""Runs a pack on SimEnv: several resolved configs as one NVFlare job (``docs/packs.md``). A user runs one through
a job script's ``--seeds 0,1,2`` or ``jobs.api.run(..., seeds=[0, 1, 2])`` (``jobs.seeds``: one run per seed,
results in ``OUTPUT/seed-N``), and a sweep runs a candidate's seeds so (``jobs.sweep.pack``).

Runs that cannot share a job are refused in one line before NVFlare starts (exit code 2,
``jobs.pack_check.pack_refusal``). Each run gets its own results folder (its ``--output``); NVFlare's workspace is
run 0's. The job's processes are guarded as a standalone run's are (``jobs.run.process_guard``).
"""

from __future__ import annotations

import sys
import time

from common.choices import ConfigError
from common.heartbeat import clear_heartbeat
from jobs.config import JobConfig
from jobs.pack_check import check_pack
from jobs.run.environments import make_env
from jobs.run.outputs import nvflare_workspace, prepare_output_dir
from jobs.run.plan import prepare
from jobs.run.process_guard import no_orphans
from jobs.run.recipe import EdgeSimPackRecipe
from jobs.run.results import finalize
from processors.data.sources import DatasetError


def run_pack(cfgs: list[JobConfig], verbose: bool = False) -> int:
    """Run resolved configs (``jobs.build``) as one job; returns a process exit code (2: refused, the reason
    printed, nothing started; 1: the job ended with an error)."""
    try:
        if not all(c.resolved for c in cfgs):
            raise ConfigError("a pack runs resolved configs only: build each with jobs.build.build_config")
        check_pack(cfgs)
        if len({c.output_dir for c in cfgs}) != len(cfgs) or not all(c.output_dir for c in cfgs):
            raise ConfigError("each run of a pack needs a results folder of its own: give each a distinct --output")
        plans = [prepare(c) for c in cfgs]
    except (ConfigError, DatasetError, ValueError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    results_dirs = [prepare_output_dir(c.output_dir, bool(c.run.resume), c.method_spec.result_files) for c in cfgs]
    print(f"[edgesim] a pack of {len(cfgs)} runs in one job: " + ", ".join(results_dirs))
    recipe = EdgeSimPackRecipe(cfgs, plans, results_dirs)
    env = make_env(cfgs[0], nvflare_workspace(results_dirs[0]), verbose)
    started = time.time()
    code = 0
    try:
        with no_orphans():
            recipe.run(env)
    except RuntimeError as ex:  # the simulator ended with an error
        print(f"error: the pack's job failed: {ex}", file=sys.stderr)
        code = 1
    finally:
        for results_dir in results_dirs:
            clear_heartbeat(results_dir)
    for results_dir in results_dirs:
        finalize(results_dir, time.time() - started)
    return code

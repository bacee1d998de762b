"""One trial as a process: the job's own command line (``python jobs/pt_job_fedrevive.py FLAGS --output DIR``) in a
session of its own, pinned to its share of the cores, watched through the ``metrics.json`` it rewrites after
every evaluation, and stopped cleanly when pruned.

Nothing outlives the sweep: each trial asks the kernel for SIGTERM when the sweep dies (``PR_SET_PDEATHSIG``,
Linux), even by SIGKILL, and its driver's guard (``jobs.run.process_guard``) then stops every process of its job
and records it as interrupted. A stopped trial gets SIGTERM (its driver records the outcome and stops its job's
processes); whatever is still running after the grace period is killed, the whole tree, listed before.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from common.config_flags import flag_args
from common.result_files import METRICS
from jobs.run.process_guard import stop_processes
from jobs.sweep.spec import SCRIPT

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PR_SET_PDEATHSIG = 1


def command(flags: dict) -> list[str]:
    """The words that run a trial's job alone (what the sweep prints as the best configuration's command)."""
    return ["python", SCRIPT, *flag_args(flags)]


def thread_env(cores: int) -> dict:
    """Every OpenMP / BLAS pool of the trial sized to its share of the cores, so trials never oversubscribe."""
    n = str(max(1, cores))
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}


def _child_setup(cores: list[int] | None, parent: int):
    # loaded here, in the sweep: between fork and exec the child only makes system calls (no import, no allocation)
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def setup() -> None:
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the sweep died before the request was made
                os._exit(143)
        if cores:
            os.sched_setaffinity(0, cores)

    return setup


def read_metrics(folder: str) -> dict:
    """The trial's ``metrics.json`` as last rewritten (atomically, so never half-written); {} before the first."""
    try:
        with open(os.path.join(folder, METRICS)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


class TrialProcess:
    """A running trial: ``poll`` its exit code, ``records`` its evaluated versions, ``stop`` it."""

    def __init__(
        self, flags: dict, folder: str, cores: list[int] | None, python: str = sys.executable, live_log: bool = False
    ):
        self.folder = folder
        self.live_log = live_log  # a deployment's job: its curve is in its log until metrics.json comes home
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        env = dict(os.environ, **thread_env(len(cores) if cores else os.cpu_count() or 1))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
        self.started = time.time()
        # beside the folder: the job refuses an output folder that holds anything but its own earlier run
        self._log = open(f"{folder}.log", "w")  # noqa: SIM115 (closed in poll)
        self.proc = subprocess.Popen(
            [python, os.path.join(REPO, SCRIPT), *flag_args(flags), "--output", folder],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the sweep's Ctrl-C is the sweep's to pass on, once, as SIGTERM
            preexec_fn=_child_setup(cores, os.getpid()),
        )
        self.ended: float | None = None

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.time()
            self._log.close()
        return code

    def records(self) -> list[dict]:
        found = read_metrics(self.folder).get("versions", [])
        if found or not self.live_log:
            return found
        from jobs.sweep.deployment import records_from_log

        return records_from_log(f"{self.folder}.log")

    def stop(self, grace_seconds: float = 30.0) -> int:
        """SIGTERM the trial's driver (it stops its job's processes and records the outcome), wait, then kill
        whatever of the tree is left. Returns the exit code."""
        try:
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                pass
        stop_processes([p for p in tree if p.is_running()], grace_seconds=5.0)
        self.proc.wait()
        return self.poll()

    @property
    def wall_seconds(self) -> float:
        return (self.ended or time.time()) - self.started

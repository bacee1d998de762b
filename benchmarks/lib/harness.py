"""Runs one job as a subprocess and measures it from outside: the one job runner every benchmark uses.

While the job runs, a sampler thread reads the job's process tree every ``sample_s`` seconds with psutil: the peak
resident memory of the whole tree, and each process's CPU seconds by role. In SimEnv the driver (``jobs/...``)
starts NVFlare's simulator, whose processes run the server and start one ``simulator_worker`` process per leaf,
so the roles are ``driver``, ``server`` and ``leaves``. Each time ``metrics.json`` gains an evaluated version the
sampler records the CPU seconds of every role at that moment, so a benchmark can take the CPU spent between two
versions (steady state, without start-up) and divide it by the devices trained in between.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

from common.result_files import METRICS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = ("driver", "server", "leaves")


@dataclass
class JobResult:
    metrics: dict
    output: str  # the job's stdout and stderr
    process_seconds: float
    peak_rss_bytes: int
    cpu_at_version: dict[int, dict[str, float]] = field(default_factory=dict)  # version -> role -> CPU seconds
    started: float = 0.0  # epoch seconds: just before the job's process started
    ended: float = 0.0  # epoch seconds: once it had exited

    @property
    def versions(self) -> list[dict]:
        return self.metrics.get("versions", [])

    def steady_state(self, first: int | None = None) -> dict:
        """Wall seconds, devices trained and CPU seconds by role between the evaluation of version ``first``
        (default: the second evaluated version, i.e. after start-up and the first round) and the last one."""
        records = {r["version"]: r for r in self.versions if r["version"] in self.cpu_at_version}
        if len(records) < 2:
            raise RuntimeError("fewer than two versions were evaluated while the job was sampled")
        ordered = sorted(records)
        start = first if first in records else ordered[min(1, len(ordered) - 2)]
        end = ordered[-1]
        config = self.metrics["config"]
        per_version = config.get("federation", config)["num_updates_for_model"]
        devices = per_version * (end - start)
        cpu = {role: self.cpu_at_version[end][role] - self.cpu_at_version[start][role] for role in ROLES}
        wall = records[end]["wall_seconds"] - records[start]["wall_seconds"]
        return {"from_version": start, "to_version": end, "wall_seconds": wall, "devices": devices, "cpu": cpu}


def role_of(proc: psutil.Process, root: psutil.Process) -> str:
    """driver (the job script), leaves (NVFlare's ``simulator_worker`` processes, one per leaf) or server (the
    simulator's own processes, which run the server)."""
    if proc.pid == root.pid:
        return "driver"
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return "server"
    return "leaves" if "simulator_worker" in cmdline else "server"


def job_command(script: str, flags: list[str], out: str, repo: str = REPO) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``python <script> <flags> --output <out>`` from the checkout
    ``repo``: its code goes first on ``PYTHONPATH``, so every process of the job (NVFlare's simulator and its
    workers too) imports that checkout's modules, whatever is installed. Run it with ``cwd=repo``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    return [sys.executable, os.path.join(repo, script), *flags, "--output", out], env


def start_job(script: str, flags: list[str], out: str, repo: str = REPO) -> subprocess.Popen:
    """Start the job of ``job_command`` (stdout and stderr together, as text, on ``stdout``)."""
    argv, env = job_command(script, flags, out, repo)
    return subprocess.Popen(argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_job(
    script: str, flags: list[str], out: str, sample_s: float = 0.2, timeout: float | None = None, repo: str = REPO
) -> JobResult:
    """Run ``python <script> <flags> --output <out>`` from the root of ``repo`` (another checkout: its code goes
    first on ``PYTHONPATH``, for every process of the job) and measure it; exit with the job's output if it
    fails."""
    started = time.time()
    popen = start_job(script, flags, out, repo)
    root = psutil.Process(popen.pid)
    cpu_by_pid: dict[int, tuple[str, float]] = {}
    cpu_at_version: dict[int, dict[str, float]] = {}
    peak = 0
    stop = threading.Event()
    metrics_path = os.path.join(out, METRICS)

    def totals() -> dict[str, float]:
        sums = dict.fromkeys(ROLES, 0.0)
        for role, seconds in cpu_by_pid.values():
            sums[role] += seconds
        return sums

    def sample() -> None:
        nonlocal peak
        seen_versions: set[int] = set()
        while not stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                procs = []
            rss = 0
            for p in procs:
                try:
                    with p.oneshot():
                        rss += p.memory_info().rss
                        times = p.cpu_times()
                        # a process's role as first seen: an exiting leaf's command line can no longer be read
                        role = cpu_by_pid[p.pid][0] if p.pid in cpu_by_pid else role_of(p, root)
                        cpu_by_pid[p.pid] = (role, times.user + times.system)
                except psutil.Error:
                    pass
            peak = max(peak, rss)
            try:
                with open(metrics_path) as f:
                    versions = [r["version"] for r in json.load(f).get("versions", [])]
            except (OSError, ValueError):
                versions = []
            for v in versions:
                if v not in seen_versions:
                    seen_versions.add(v)
                    cpu_at_version[v] = totals()
            stop.wait(sample_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output = popen.communicate(timeout=timeout)[0]
        ended = time.time()
    finally:
        stop.set()
        sampler.join()
        if popen.poll() is None:
            popen.kill()
    if popen.returncode:
        sys.exit(f"job failed ({script} {' '.join(flags)}):\n{output[-3000:]}")
    with open(metrics_path) as f:
        metrics = json.load(f)
    return JobResult(metrics, output, time.time() - started, peak, cpu_at_version, started, ended)


def fleet_flags(devices_per_leaf: int, selection: int, versions: int, leaves: int = 2) -> list[str]:
    """The job flags of a bench's fleet: ``leaves`` leaves of ``devices_per_leaf`` devices, ``selection`` of them
    selected at once, ``versions`` versions."""
    return [
        *("--num-leaf-nodes", str(leaves), "--devices-per-leaf", str(devices_per_leaf)),
        *("--device-selection-size", str(selection), "--max-model-version", str(versions)),
    ]


@contextlib.contextmanager
def worktree(rev: str, work: str):
    """A temporary checkout of ``rev`` (its own code first on ``PYTHONPATH``), removed afterwards."""
    path = os.path.join(work, f"rev-{rev}")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", path, rev], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", path], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)

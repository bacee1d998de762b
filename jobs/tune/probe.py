"""The tuner's job probe: a tiny real SimEnv job in a child process, timed from start to each leaf's first
device report (what ``--job-timeout`` must cover)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from common.result_files import LEAF_LOGS


# -- job start probe -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobProbe:
    first_task_seconds: float | None  # start -> first device report of the slowest leaf
    first_report_per_site: dict
    total_seconds: float
    returncode: int | None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


_PROBE_CHILD = """
import sys, time
from jobs.cli import build_from_args, build_parser
from jobs.run.driver import run
args = build_parser("probe").parse_args(sys.argv[2:])
cfg = build_from_args(args, "fedavg")
open(sys.argv[1], "w").write(repr(time.time()))
sys.exit(run(cfg))
"""


def probe_args(argv: Sequence[str], workdir: str, leaves: int, devices_per_leaf: int) -> list[str]:
    """The job's own flags followed by the probe's overrides (argparse keeps the last value of a flag)."""
    per_leaf = min(devices_per_leaf, 2)
    return [*argv] + [
        "--env",
        "sim",
        "--max-model-version",
        "2",
        "--local-iters",
        "2",
        "--devices-per-leaf",
        str(per_leaf),
        "--device-selection-size",
        str(per_leaf * leaves),
        "--num-updates-for-model",
        str(per_leaf * leaves),
        "--min-hole-to-fill",
        str(per_leaf * leaves),
        "--job-timeout",
        "600",  # measure the wait, never fail on it
        "--eval-frequency",
        "1",
        "--job-name",
        "edgesim_tune_probe",
        "--output",
        os.path.join(workdir, "out"),
        "--workspace",
        os.path.join(workdir, "ws"),
    ]


def first_reports(results_dir: str) -> dict[str, float]:
    """Wall time of each leaf's first device report, from its ``leaf_<site>.jsonl``."""
    firsts = {}
    prefix, suffix = LEAF_LOGS.split("*")
    for path in sorted(glob.glob(os.path.join(results_dir, LEAF_LOGS))):
        site = os.path.basename(path)[len(prefix) : -len(suffix)]
        with open(path) as f:
            walls = [json.loads(line)["wall"] for line in f if line.strip()]
        if walls:
            firsts[site] = min(walls)
    return firsts


def probe_job_start(argv: Sequence[str], cfg, timeout: float = 600.0) -> JobProbe:
    """Run a tiny real SimEnv job in a child process and measure start -> first device report.

    The start is taken in the child right before ``jobs.run.driver.run`` (after imports), the end is the slowest
    leaf's first report, so the number includes data loading, NVFlare start-up, job deployment, the first
    selection and one 2-iteration device task: an upper bound of the wait ``--job-timeout`` guards (which begins
    when a leaf's simulator starts). A child process keeps NVFlare's logging, threads and signal handlers out of
    the tuner, and a failed probe cannot take the tuner down."""
    with tempfile.TemporaryDirectory(prefix="edgesim_tune_") as workdir:
        start_file = os.path.join(workdir, "start")
        args = probe_args(argv, workdir, cfg.federation.num_leaf_nodes, cfg.federation.devices_per_leaf)
        began = time.time()
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PROBE_CHILD, start_file, *args],
                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            rc, tail = None, f"the probe job did not finish within --probe-timeout {timeout:g}s"
        total = time.time() - began
        firsts = first_reports(os.path.join(workdir, "out"))
        start = float(open(start_file).read()) if os.path.exists(start_file) else None
        if start is None or not firsts:
            return JobProbe(None, {}, round(total, 2), rc, f"no device report measured; job output: {tail}")
        per_site = {site: round(wall - start, 3) for site, wall in firsts.items()}
        detail = "" if len(firsts) == cfg.federation.num_leaf_nodes else f"only {len(firsts)} leaves reported"
        return JobProbe(round(max(per_site.values()), 3), per_site, round(total, 2), rc, detail)

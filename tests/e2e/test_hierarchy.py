"""A provisioned NVFlare edge hierarchy on this machine (2 relays, 4 leaf clients), stood up with
``python -m jobs.deploy up`` and torn down with ``down`` even when a test fails: a FedAvg job through
``--env prod`` brings home the same files a SimEnv run writes, every leaf records the plan it made for itself, and
a FedBuff job's applied-update trace is the exact reference schedule's, as in SimEnv."""

from __future__ import annotations

import json
import os
import subprocess

import psutil
import pytest

from common.delays import DELAY_PRESETS
from jobs.hierarchy import Deployment
from simulation.event_reference import make_schedule, reference_trace
from tests.conftest import PYTHON, REPO

LEAVES = ["C11", "C12", "C21", "C22"]
SMALL = (
    "--devices-per-leaf 4 --device-selection-size 8 --synthetic-size 1500 --subset-size 40 --local-iters 2 "
    "--local-batch-size 16 --local-lr 1e-3 --seed 4"
).split()
SIM_FILES = {
    "metrics.json",
    "events.jsonl",
    "global_model.pt",
    "accuracy.png",
    "tensorboard",
    "nvflare",
    *(f"leaf_{leaf}.jsonl" for leaf in LEAVES),
}


def processes_of(folder, sessions: dict[str, int]) -> list[psutil.Process]:
    """The sites' sessions, and any process whose command line names the deployment's folder (NVFlare's job
    processes run in sessions of their own)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if os.getsid(p.pid) in sessions.values() or any(str(folder) in a for a in p.info["cmdline"] or ()):
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return found


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hierarchy") / "h"
    up = subprocess.run(
        [PYTHON, "-m", "jobs.deploy", "up", "--relays", "2", "--leaves", "4", str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "--env prod" in up.stdout
        dep = Deployment.load(str(folder))
        assert dep.leaves == LEAVES and len(dep.sessions) == 7  # server, 2 relays, 4 leaves
        yield dep
    finally:
        sessions = (
            json.loads((folder / "deployment.json").read_text())["sessions"]
            if (folder / "deployment.json").exists()
            else {}
        )
        down = subprocess.run(
            [PYTHON, "-m", "jobs.deploy", "down", str(folder)], cwd=REPO, capture_output=True, text=True, timeout=180
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert not processes_of(folder, sessions), "processes of the hierarchy were left running"


def run_prod(deployment: Deployment, out, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "jobs/pt_job_fedrevive.py", *deployment.job_flags, *SMALL, *flags, "--output", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_a_prod_fedavg_run_brings_home_what_a_sim_run_writes_and_each_leaf_plans_for_itself(deployment, tmp_path):
    proc = run_prod(deployment, tmp_path / "out", "--method", "fedavg", "--max-model-version", "4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    assert SIM_FILES <= {p.name for p in out.iterdir()}, sorted(p.name for p in out.iterdir())
    assert "FINISHED:COMPLETED" in proc.stdout and "[edgesim] version 4/4" in proc.stdout  # status and progress
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["outcome"]["status"] == "completed" and [r["version"] for r in metrics["versions"]] == [1, 2, 3, 4]
    assert metrics["planner"] is None  # the submitting machine planned nothing
    plans = metrics["leaf_plans"]
    assert sorted(plans) == LEAVES
    for plan in plans.values():  # each leaf counted the 4 leaf processes of this job on this machine
        assert plan["leaves_on_host"] == 4 and plan["num_workers"] >= 1 and plan["hardware"]["cpu_cores"] >= 1
    lines = [json.loads(line) for leaf in LEAVES for line in (out / f"leaf_{leaf}.jsonl").read_text().splitlines()]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert len(events) == 8 * 3  # 8 devices a version, versions 2..4
    reported = {(line["device"], line["version"]) for line in lines if line["ok"]}
    assert {(e["device"], e["base_version"]) for e in events} <= reported  # each leaf's lines came home
    assert (out / "nvflare" / "server" / "log.txt").exists()


def test_a_prod_fedbuff_run_applies_the_exact_reference_schedule(deployment, tmp_path):
    out = tmp_path / "out"
    proc = run_prod(deployment, out, "--method", "fedbuff", "--delays", "paper", "--max-model-version", "10")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trace = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    schedule = make_schedule(
        DELAY_PRESETS["paper"],
        4,
        dict.fromkeys(LEAVES, 4),
        selection_size=8,
        updates_per_version=2,
        min_hole_to_fill=1,
        max_model_version=10,
    )
    assert trace == reference_trace(schedule)

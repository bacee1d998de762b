"""Exact simulated time in real NVFlare runs: the applied-update trace (``events.jsonl``) equals the pure reference
schedule's, repeats bit for bit across worker counts and sync intervals, and the same seed gives the same
accuracies, for FedAvg, FedBuff (B = 2) and FedRevive (B = 1) with two leaves and the paper's delays."""

from __future__ import annotations

import collections
import json
import subprocess

import pytest

from common.delays import DELAY_PRESETS
from simulation.event_reference import make_schedule, reference_trace
from tests.conftest import PYTHON, REPO

COMMON = (
    "--num-leaf-nodes 2 --devices-per-leaf 12 --device-selection-size 8 --delays paper --synthetic-size 1500 "
    "--subset-size 40 --local-iters 2 --local-batch-size 16 --local-lr 1e-3 --seed 11 --eval-backlog wait"
).split()
FEDREVIVE_SMALL = (
    "--fr-distill-from-version 3 --fr-kd-train-from-version 4 --fr-s-max 2 --fr-teacher-buffer-size 2 "
    "--fr-synth-per-teacher 2 --fr-kd-iters 1 --fr-gen-width 8 --fr-synth-every-versions 1 --fr-synth-batch-size 8 "
    "--fr-pool-size 32 --fr-probe-samples 8"
).split()
METHODS = {  # B, min hole, versions
    "fedavg": (8, 8, 4),
    "fedbuff": (2, 1, 12),
    "fedrevive": (1, 1, 12),
}


def start(tmp_path, method: str, *extra: str) -> subprocess.Popen:
    """Start the job (two runs of a test go at once: their results must not depend on it)."""
    b, hole, versions = METHODS[method]
    flags = [
        *COMMON,
        "--method",
        method,
        "--max-model-version",
        str(versions),
        "--output",
        str(tmp_path / "out"),
        "--workspace",
        str(tmp_path / "ws"),
        *(FEDREVIVE_SMALL if method == "fedrevive" else ()),
        *extra,
    ]
    return subprocess.Popen(
        [PYTHON, "jobs/pt_job_fedrevive.py", *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def results(tmp_path, proc: subprocess.Popen) -> tuple[list[dict], list[float]]:
    """The trace and accuracies of a started job, once it has ended."""
    try:
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    out_dir = tmp_path / "out"
    trace = [json.loads(line) for line in (out_dir / "events.jsonl").read_text().splitlines()]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    return trace, [r["accuracy"] for r in metrics["versions"]]


def run(tmp_path, method: str, *extra: str) -> tuple[list[dict], list[float]]:
    return results(tmp_path, start(tmp_path, method, *extra))


def reference(method: str) -> list[dict]:
    b, hole, versions = METHODS[method]
    schedule = make_schedule(
        DELAY_PRESETS["paper"],
        11,
        {"site-1": 12, "site-2": 12},
        selection_size=8,
        updates_per_version=b,
        min_hole_to_fill=hole,
        max_model_version=versions,
    )
    return reference_trace(schedule)


@pytest.mark.parametrize("method", ["fedbuff", "fedrevive", "fedavg"])
def test_trace_equals_the_reference_and_repeats_across_workers_and_sync_intervals(tmp_path, method):
    one = start(tmp_path / "a", method, "--num-workers", "1", "--update-interval", "0.1")
    two = start(tmp_path / "b", method, "--num-workers", "2", "--update-interval", "0.4")
    first, accuracy = results(tmp_path / "a", one)
    second, accuracy_again = results(tmp_path / "b", two)
    assert first == reference(method)
    b = METHODS[method][0]
    assert set(collections.Counter(r["version"] for r in first).values()) == {b}  # exactly B updates a version
    assert second == first
    assert accuracy_again == accuracy


def test_measured_speeds_from_a_fedscale_trace_keep_the_trace_exact(tmp_path):
    """``--capacity-file``: every device's times from its trace client (a small FedScale-format pickle); the real
    run applies its updates exactly as the reference schedule with the same delay model does."""
    import pickle

    from jobs.api import make_config

    trace = tmp_path / "capacity.pkl"
    trace.write_bytes(
        pickle.dumps({i: {"computation": 2.0 + 7 * i, "communication": 800.0 + 900 * i} for i in range(6)})
    )
    trace_run = results(tmp_path, start(tmp_path, "fedbuff", "--delays", "none", "--capacity-file", str(trace)))[0]
    cfg = make_config("fedbuff", capacity_file=str(trace), local_iters=2, local_batch_size=16, subset_size=40)
    schedule = make_schedule(
        cfg.delays, 11, {"site-1": 12, "site-2": 12}, 8, 2, 1, max_model_version=METHODS["fedbuff"][2]
    )
    assert trace_run == reference_trace(schedule)
    assert trace_run != reference("fedbuff")  # the trace's speeds, not the paper's delays


def test_diurnal_availability_drops_devices_exactly_as_the_reference_for_async_and_synchronous_methods(tmp_path):
    """``--availability diurnal``: only online devices are selected, and a device whose session ends before its
    update arrives fails then. Real FedBuff and FedAvg runs apply (and fail) exactly the reference's updates; a
    FedAvg round averages the devices that reported."""
    from jobs.api import make_config

    flags = ("--availability", "diurnal", "--availability-period", "6", "--availability-online", "0.4")
    procs = {m: start(tmp_path / m, m, *flags) for m in ("fedbuff", "fedavg")}
    for method, proc in procs.items():
        trace = results(tmp_path / method, proc)[0]
        b, hole, versions = METHODS[method]
        cfg = make_config(
            method, delays="paper", availability="diurnal", availability_period=6, availability_online=0.4
        )
        schedule = make_schedule(cfg.delays, 11, {"site-1": 12, "site-2": 12}, 8, b, hole, max_model_version=versions)
        assert trace == reference_trace(schedule)
        assert any(r.get("failed") for r in trace) and trace[-1]["version"] == versions
        counted = collections.Counter(r["version"] for r in trace if not r.get("failed"))
        assert set(counted) == set(range(2, versions + 1))
        if method == "fedavg":
            assert min(counted.values()) < 8  # a round without its dropped devices
        # the results show the fleet: devices online at each version, the failure rate over the run
        metrics = json.loads((tmp_path / method / "out" / "metrics.json").read_text())
        last = metrics["versions"][-1]
        assert last["version"] == versions and last["fleet"]["updates"] == len(trace)
        failed = sum(1 for r in trace if r.get("failed"))
        assert metrics["summary"]["failure_rate"] == round(failed / len(trace), 4)
        online = [r["fleet"]["online"] for r in metrics["versions"] if "fleet" in r]
        assert all(0 < n <= 24 for n in online) and min(online) < 24

"""Exact simulated time in real NVFlare runs: the applied-update trace (``events.jsonl``) equals the pure reference
schedule's, repeats bit for bit across worker counts and sync intervals, and the same seed gives the same
accuracies, for FedAvg, FedBuff (B = 2) and FedRevive (B = 1) with two leaves and the paper's delays. FedBuff's
devices of different versions train together (mean group size above 1 after the first selection), and two runs
on the same worker count, syncing at different intervals, end with the same model, bit for bit. FedAvg's pair of runs
is ``tests/e2e/test_example_methods.py``'s plain FedAvg, which FedProx is compared with there (one pair of jobs
serves both)."""

from __future__ import annotations

import collections
import json
import subprocess

import pytest

from benchmarks.lib.fedrevive_small import FEDREVIVE_SMALL
from common.delays import DELAY_PRESETS
from scheduling.event_reference import make_schedule, reference_trace
from tests.conftest import PYTHON, REPO, SMALL_JOB, digest

COMMON = [*SMALL_JOB, "--seed", "11"]
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
    """The trace and accuracies of a started job, once it has ended (its ``metrics.json`` and model are kept)."""
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


@pytest.mark.parametrize("method", ["fedbuff", "fedrevive"])
def test_trace_equals_the_reference_and_repeats_across_workers_and_sync_intervals(tmp_path, method):
    # FedBuff: the same workers (the groups, hence the bits, are then the same); the others across worker counts
    workers = "1" if method == "fedbuff" else "2"
    one = start(tmp_path / "a", method, "--num-workers", "1", "--update-interval", "0.1")
    two = start(tmp_path / "b", method, "--num-workers", workers, "--update-interval", "0.4")
    first, accuracy = results(tmp_path / "a", one)
    second, accuracy_again = results(tmp_path / "b", two)
    assert first == reference(method)
    b = METHODS[method][0]
    assert set(collections.Counter(r["version"] for r in first).values()) == {b}  # exactly B updates a version
    assert second == first
    assert accuracy_again == accuracy
    if method == "fedbuff":
        for run in ("a", "b"):  # devices selected one by one, of different versions, trained together
            groups = json.loads((tmp_path / run / "out" / "metrics.json").read_text())["groups"]
            assert groups["mean_group_size_after_first_selection"] > 1, groups
        assert digest(tmp_path / "b" / "out" / "global_model.pt") == digest(tmp_path / "a" / "out" / "global_model.pt")

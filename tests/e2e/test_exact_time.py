"""Exact simulated time in real NVFlare runs: the applied-update trace (``events.jsonl``) equals the pure reference
schedule's, repeats bit for bit across worker counts and sync intervals, and the same seed gives the same
accuracies, for FedAvg, FedBuff (B = 2) and FedRevive (B = 1) with two leaves and the paper's delays. FedBuff's
devices of different versions train together (mean group size above 1 after the first selection), and two runs
on the same worker count, syncing at different intervals, end with the same model, bit for bit. FedRevive's first
run distils and revives stale updates, and logs them as ``events.jsonl`` numbers them. FedAvg's pair of runs
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
    "fedrevive": (1, 1, 8),
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


def console(tmp_path, proc: subprocess.Popen) -> str:
    """What a started job printed, once it has ended with 0 (its results are in ``tmp_path / "out"``)."""
    try:
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    return out


def outcome(tmp_path) -> tuple[list[dict], list[float]]:
    """An ended job's trace and accuracies (its ``events.jsonl`` and ``metrics.json``)."""
    out_dir = tmp_path / "out"
    trace = [json.loads(line) for line in (out_dir / "events.jsonl").read_text().splitlines()]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    return trace, [r["accuracy"] for r in metrics["versions"]]


def results(tmp_path, proc: subprocess.Popen) -> tuple[list[dict], list[float]]:
    """The trace and accuracies of a started job, once it has ended (its ``metrics.json`` and model are kept)."""
    console(tmp_path, proc)
    return outcome(tmp_path)


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
    printed = console(tmp_path / "a", one)
    first, accuracy = outcome(tmp_path / "a")
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
    if method == "fedrevive":
        distils_stale_updates(tmp_path / "a" / "out", printed, METHODS[method][2])


def distils_stale_updates(out, printed: str, versions: int) -> None:
    """FedRevive's log of a finished run: distillation ran (its phases start at versions 2 and 3,
    ``FEDREVIVE_SMALL``) and revived stale updates, the log numbers versions as ``events.jsonl`` does, a method's
    flag reached its config, and the progress lines say how much was revived."""
    log = [json.loads(line) for line in open(out / "fedrevive_log.jsonl")]
    distilled = [e for e in log if e["phase"] == "distill"]
    assert distilled, {e["phase"] for e in log}
    assert all(e["kd_seconds"] > 0 and 0 < e["beta"] <= 1 and e["tau"] >= 1 for e in distilled)
    # between the warm-ups a stale update is blended with a zero distilled one, as both references do
    warm = [e for e in log if e["phase"] == "generator-warm-up" and e["tau"] > 0]
    assert warm and all(e["beta"] > 0 for e in warm), warm
    events = [json.loads(line) for line in open(out / "events.jsonl")]
    assert [(e["version"], e["base_version"]) for e in log] == [(e["version"], e["base_version"]) for e in events]
    metrics = json.loads((out / "metrics.json").read_text())
    kd_iters = FEDREVIVE_SMALL[FEDREVIVE_SMALL.index("--fr-kd-iters") + 1]
    assert metrics["config"]["method_settings"]["kd_iters"] == int(kd_iters)
    assert metrics["versions"][-1]["version"] == versions and metrics["versions"][-1]["sim_seconds"] > 0
    revived = sum(e["phase"] == "distill" and e["beta"] > 0 for e in log if e["version"] <= versions)
    assert f"FedRevive revival, {revived} update(s) revived" in printed

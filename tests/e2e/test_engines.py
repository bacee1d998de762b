"""The per-device training engine in a real SimEnv run (the vectorised one, the default for models without
BatchNorm, is checked on ``tests/e2e/test_fedavg.py``'s run)."""

import glob
import json
import subprocess

from tests.conftest import PYTHON, REPO, job_args


def test_the_per_device_engine_trains_every_selected_device_and_learns(tmp_path):
    engine, group = "per-device", 1
    extra = ["--engine", engine, "--max-model-version", "3"]
    proc = subprocess.run(
        [PYTHON, "jobs/pt_job_fedavg.py", *job_args(tmp_path, *extra)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"engine: {engine}, groups of {group} device(s)" in proc.stdout
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert (metrics["planner"]["engine"], metrics["planner"]["group_size"]) == (engine, group)
    assert max(r["accuracy"] for r in metrics["versions"][1:]) > 0.2, metrics["versions"]
    reports = [json.loads(line) for f in glob.glob(str(tmp_path / "out" / "leaf_*.jsonl")) for line in open(f)]
    assert all(r["ok"] for r in reports) and max(r["group"] for r in reports) == group

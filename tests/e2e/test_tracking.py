"""A real job tracked in MLflow and W&B (``--tracking mlflow,wandb``), read back with their own clients. One small
FedAvg run checks several things at once: W&B fails mid-run (an error injected into its logging in the driver),
which is said once while the run goes on; the run is stopped with SIGTERM after a checkpoint, with ``metrics.json``
complete (every version made, the outcome, the summary); ``--resume`` then continues the same MLflow run and the
same W&B run to the end: one MLflow run holding every version once, with the run's parameters, its accuracy equal to
``metrics.json``'s and its files as artefacts; the W&B run's two attempts holding every version once."""

from __future__ import annotations

import json
import signal
import subprocess

from tests.conftest import PYTHON, REPO, SMALL_JOB, checkpoint_version, wait_for
from tests.e2e.job_runs import resume
from tests.tracker_readers import mlflow_artifacts, mlflow_runs, mlflow_series, wandb_runs

# the job's own entry point, with W&B's logging in the driver failing on its second call
INJECTED = """
import sys
from jobs.tracking.wandb_run import WandbRun
real, calls = WandbRun.log_versions, []
def fails_the_second_time(self, records):
    calls.append(records[-1]["version"])
    if len(calls) == 2:
        raise ConnectionError("W&B went away (injected)")
    return real(self, records)
WandbRun.log_versions = fails_the_second_time
from jobs.pt_job_fedrevive import main
from jobs.run.process_guard import exit_now
exit_now(main(sys.argv[1:]))
"""


def test_a_tracked_run_survives_a_tracker_failure_and_resumes_into_the_same_tracker_runs(tracker_env, mlflow_store):
    out, ws = tracker_env / "out", tracker_env / "ws"
    flags = [*SMALL_JOB, "--method", "fedavg", "--seed", "5", "--max-model-version", "14", "--checkpoint-every", "1"]
    flags += ["--tracking", "mlflow,wandb", "--tracking-uri", mlflow_store, "--workspace", str(ws)]
    first = subprocess.Popen(
        [PYTHON, "-c", INJECTED, *flags, "--output", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: checkpoint_version(out) >= 2, first, 300, "a checkpoint at version 2")
        first.send_signal(signal.SIGTERM)
        said, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, said[-3000:]
    assert said.count("wandb tracking failed") == 1 and "W&B went away (injected)" in said, said[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    made = metrics["outcome"]["version"]
    assert metrics["outcome"]["status"] == "interrupted" and metrics["summary"]["last_version"] == made
    assert [r["version"] for r in metrics["versions"]] == list(range(1, metrics["versions"][-1]["version"] + 1))
    (run,) = mlflow_runs(mlflow_store)
    assert run.info.status == "KILLED" and run.data.tags["outcome"] == "interrupted"

    resumed = resume(out)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "tracking failed" not in resumed.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["outcome"]["status"] == "completed" and [r["version"] for r in metrics["versions"]] == list(
        range(1, 15)
    )

    (run,) = mlflow_runs(mlflow_store)  # one MLflow run, continued
    assert run.info.status == "FINISHED" and run.data.tags["resumes"] == "1" and run.data.tags["outcome"] == "completed"
    assert run.data.params["method"] == "fedavg" and run.data.params["max-model-version"] == "14"
    assert run.data.params["seed"] == "5" and run.data.params["device-selection-size"] == "8"
    accuracy = mlflow_series(mlflow_store, run.info.run_id, "accuracy")
    assert accuracy == [(r["version"], r["accuracy"]) for r in metrics["versions"]]
    assert [s for s, _ in mlflow_series(mlflow_store, run.info.run_id, "staleness/mean")] == list(range(2, 15))
    assert len(mlflow_series(mlflow_store, run.info.run_id, "accuracy_vs_sim_ms")) == 14
    assert mlflow_artifacts(mlflow_store, run.info.run_id) == [
        "accuracy.png",
        "events.jsonl",
        "global_model.pt",
        "metrics.json",
    ]

    (wandb_run,) = wandb_runs(str(ws / "wandb")).values()  # one W&B run: the failed attempt's rows, then the rest
    assert len(wandb_run["folders"]) == 2 and wandb_run["summary"]["outcome"] == "completed"
    assert [r["version"] for r in wandb_run["history"] if "accuracy" in r] == list(range(1, 15))

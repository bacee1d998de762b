"""The driver's trackers (``jobs.tracking``), read back with their own clients: a run is one MLflow run with its
whole config as flag-named parameters, its curves by version and by simulated time, its staleness, outcome,
summary and files, in a SQLite store MLflow opens; the same run is one offline W&B run; a resumed run continues
both, each version once; a tracker failing mid-run is said once and the rest goes on; a tracker that cannot be
opened stops the job in one line before anything starts."""

from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest
import torch

from common.choices import ConfigError
from common.jsonio import write_json_atomic
from jobs.config import JobConfig
from jobs.run_config import RunConfig
from jobs.tracking import choice
from jobs.tracking.mlflow_run import MlflowRun
from jobs.tracking.run_tracking import RunTracking, read_state
from tests.tracker_readers import mlflow_artifacts, mlflow_runs, mlflow_series, wandb_runs

TAUS = {2: [0, 1], 3: [1, 2], 4: [0, 3], 5: [2, 2]}  # the staleness of the two updates that made each version


def config(folder, tracking: str, uri: str | None = None) -> JobConfig:
    run = RunConfig(tracking=tracking, tracking_uri=uri, output=str(folder), seed=4, workspace=str(folder.parent))
    return JobConfig(run=run)


def write_results(folder, cfg: JobConfig, versions: range, outcome: str | None = None) -> None:
    """A results folder as the server writes it: ``metrics.json`` up to the last of ``versions`` (with the outcome
    and summary once ``outcome`` is given), ``events.jsonl`` up to it, and the plot and the model at the end."""
    records = [
        {
            "version": v,
            "accuracy": round(0.1 * v, 3),
            "loss": round(2.5 - 0.2 * v, 3),
            "sim_seconds": 0.5 * v,
            "wall_seconds": float(v),
            "epoch": 1.8e9 + v,
            "seconds_per_version": 1.0 if v > 1 else None,
            "devices_per_second": 2.0 if v > 1 else None,
            "system": {"cpu_percent": 50.0 + v, "gpu_util_percent": None, "num_samples": 3},
            "fleet": {"online": 8, "updates": 2 * (v - 1), "failed": 0},
        }
        for v in versions
    ]
    metrics = {"config": cfg.to_dict(), "versions": records}
    if outcome:
        metrics["outcome"] = {"status": outcome, "reason": "test", "version": versions[-1]}
        metrics["summary"] = {"final_accuracy": records[-1]["accuracy"], "versions_trained": versions[-1] - 1}
    with open(folder / "events.jsonl", "w") as f:
        for v in range(2, versions[-1] + 1):
            for tau in TAUS[v]:
                f.write(json.dumps({"version": v, "device": "d", "base_version": v - tau, "arrival": v, "tau": tau}))
                f.write("\n")
    write_json_atomic(str(folder / "metrics.json"), metrics)
    if outcome:
        (folder / "accuracy.png").write_bytes(b"\x89PNG plot")
        torch.save({"w": torch.zeros(2)}, folder / "global_model.pt")


def started(cfg: JobConfig, folder, saved: dict | None = None) -> RunTracking:
    tracking = (
        RunTracking.for_config(cfg) if saved is None else RunTracking(RunTracking.for_config(cfg).trackers, saved)
    )
    tracking.connect()
    folder.mkdir(exist_ok=True)
    tracking.start(str(folder), cfg.to_dict(), cfg.method_spec.flag_prefix)
    tracking.interval = 0.05
    return tracking


def wait_logged(tracking: RunTracking, version: int) -> None:
    deadline = time.time() + 30
    while any(s["logged_version"] < version for s in tracking.state.values()) and time.time() < deadline:
        time.sleep(0.05)
    assert all(s["logged_version"] >= version for s in tracking.state.values()), tracking.state


def test_a_run_is_one_mlflow_run_with_its_config_curves_outcome_and_files(tracker_env, mlflow_store):
    folder, uri = tracker_env / "run", mlflow_store
    cfg = config(folder, "tensorboard,mlflow", uri)
    tracking = started(cfg, folder)
    with tracking:  # the driver's thread follows the files as the server rewrites them
        write_results(folder, cfg, range(1, 3))
        wait_logged(tracking, 2)
        write_results(folder, cfg, range(1, 5), outcome="completed")
    tracking.finish()

    (run,) = mlflow_runs(uri)
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["local-lr"] == str(cfg.training.local_lr) and params["seed"] == "4"
    assert params["device-reuse"] == "True" and params["tracking"] == "tensorboard,mlflow"
    assert params["method"] == "fedavg" and params["output"] == str(folder)
    assert len(params) == sum(len(part) for k, part in cfg.to_dict().items() if isinstance(part, dict)) + 1
    assert mlflow_series(uri, run.info.run_id, "accuracy") == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert mlflow_series(uri, run.info.run_id, "loss") == [(v, pytest.approx(2.5 - 0.2 * v)) for v in range(1, 5)]
    assert mlflow_series(uri, run.info.run_id, "accuracy_vs_sim_ms") == [
        (500, 0.1),
        (1000, 0.2),
        (1500, 0.3),
        (2000, 0.4),
    ]
    assert mlflow_series(uri, run.info.run_id, "devices_per_second") == [(2, 2.0), (3, 2.0), (4, 2.0)]
    assert mlflow_series(uri, run.info.run_id, "staleness/mean") == [(2, 0.5), (3, 1.5), (4, 1.5)]
    assert mlflow_series(uri, run.info.run_id, "staleness/max") == [(2, 1.0), (3, 2.0), (4, 3.0)]
    assert mlflow_series(uri, run.info.run_id, "system/cpu_percent")[-1] == (4, 54.0)
    assert "system/num_samples" not in run.data.metrics and "system/gpu_util_percent" not in run.data.metrics
    tags = run.data.tags
    assert (
        tags["outcome"] == "completed" and tags["outcome.reason"] == "test" and tags["summary.final_accuracy"] == "0.4"
    )
    assert tags["edgesim.results"] == str(folder)
    assert mlflow_artifacts(uri, run.info.run_id) == ["accuracy.png", "events.jsonl", "global_model.pt", "metrics.json"]
    # a real SQLite database, its artefacts beside it: what mlflow ui --backend-store-uri sqlite:///... opens
    with sqlite3.connect(tracker_env / "store" / "mlflow.db") as db:
        assert db.execute("select count(*) from runs").fetchone() == (1,)
    assert (tracker_env / "store" / "mlartifacts").is_dir()
    assert read_state(str(folder))["mlflow"] | {"logged_version": 4} == read_state(str(folder))["mlflow"]


def test_a_resumed_run_continues_its_mlflow_and_wandb_runs_each_version_once(tracker_env, mlflow_store):
    folder, uri = tracker_env / "run", mlflow_store
    cfg = config(folder, "mlflow,wandb", uri)
    first = started(cfg, folder)
    write_results(folder, cfg, range(1, 4), outcome="interrupted")  # made versions 1-3, checkpointed at 2
    first.finish()
    assert read_state(str(folder))["mlflow"]["logged_version"] == 3

    # the resumed attempt: the server keeps the records up to its checkpoint and makes versions 3-5 again
    resumed = config(folder, "mlflow,wandb", uri)
    second = started(resumed, folder, saved=read_state(str(folder)))
    write_results(folder, cfg, range(1, 3))
    second.log_new()
    write_results(folder, cfg, range(1, 6), outcome="completed")
    second.finish()

    (run,) = mlflow_runs(uri)  # one tracker run, not two
    assert run.info.status == "FINISHED" and run.data.tags["resumes"] == "1" and run.data.tags["outcome"] == "completed"
    assert [s for s, _ in mlflow_series(uri, run.info.run_id, "accuracy")] == [1, 2, 3, 4, 5]
    assert [s for s, _ in mlflow_series(uri, run.info.run_id, "staleness/mean")] == [2, 3, 4, 5]

    (wandb_run,) = wandb_runs(str(tracker_env / "wandb")).values()  # W&B: one run id, a folder per attempt
    assert len(wandb_run["folders"]) == 2 and wandb_run["name"] == "run"
    assert [r["version"] for r in wandb_run["history"] if "accuracy" in r] == [1, 2, 3, 4, 5]
    assert [r["version"] for r in wandb_run["history"] if "staleness/mean" in r] == [2, 3, 4, 5]
    assert wandb_run["config"]["local-lr"] == str(cfg.training.local_lr)
    assert wandb_run["summary"]["outcome"] == "completed" and wandb_run["exit_codes"] == [1, 0]
    (files,) = wandb_run["artifacts"].values()
    assert files == ["accuracy.png", "events.jsonl", "global_model.pt", "metrics.json"]


def test_a_tracker_failing_mid_run_is_said_once_and_the_run_and_other_trackers_go_on(
    tracker_env, mlflow_store, monkeypatch, capsys
):
    folder, uri = tracker_env / "run", mlflow_store
    cfg = config(folder, "mlflow,wandb", uri)
    real, calls = MlflowRun.log_versions, []

    def fails_the_second_time(self, records):
        calls.append(records[-1]["version"])
        if len(calls) == 2:
            raise OSError("disk I/O error (injected)")
        return real(self, records)

    monkeypatch.setattr(MlflowRun, "log_versions", fails_the_second_time)
    tracking = started(cfg, folder)
    for last in (2, 3, 4):
        write_results(folder, cfg, range(1, last + 1))
        tracking.log_new()
    write_results(folder, cfg, range(1, 6), outcome="completed")
    written = (folder / "metrics.json").read_bytes()
    tracking.finish()

    err = capsys.readouterr().err
    assert err.count("mlflow tracking failed") == 1 and "disk I/O error (injected)" in err, err
    assert calls == [2, 3] and tracking.failed == {"mlflow"}
    assert (folder / "metrics.json").read_bytes() == written  # the run's own file: never the tracker's
    (run,) = mlflow_runs(uri)
    assert [s for s, _ in mlflow_series(uri, run.info.run_id, "accuracy")] == [1, 2]
    assert read_state(str(folder))["mlflow"]["logged_version"] == 2  # where --resume continues it
    (wandb_run,) = wandb_runs(str(tracker_env / "wandb")).values()
    assert [r["version"] for r in wandb_run["history"] if "accuracy" in r] == [1, 2, 3, 4, 5]


def test_tracking_flags_are_checked_in_one_line_naming_the_fix(monkeypatch):
    assert choice.trackers_of("wandb, MLflow,tensorboard") == ("tensorboard", "mlflow", "wandb")
    assert choice.trackers_of("none") == () == choice.trackers_of("")
    for bad, words in (
        (dict(tracking="tensorboard,neptune"), "use any of tensorboard, mlflow, wandb"),
        (dict(tracking_uri="sqlite:///x.db"), "add mlflow to --tracking"),
        (dict(tracking_parent="abc"), "add mlflow to --tracking"),
        (dict(tracking="mlflow", export_only="/tmp/x"), "an exported job runs without this driver"),
        (dict(tracking="wandb", dry_run=True), "a dry run trains nothing to track"),
    ):
        with pytest.raises(ConfigError, match=words):
            RunConfig(**bad)
    monkeypatch.setattr(choice.importlib.util, "find_spec", lambda name: None if name == "wandb" else object())
    with pytest.raises(ConfigError, match=r"pip install 'edgesim-flare\[wandb\]'"):
        RunConfig(tracking="mlflow,wandb").validate()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert choice.default_mlflow_uri("~/ws") == "http://tracking.example:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert choice.default_mlflow_uri("/w") == "sqlite:////w/mlflow.db"


def test_a_store_that_cannot_be_opened_stops_the_job_before_anything_starts(tracker_env, capsys):
    from jobs.build import resolve
    from jobs.run.driver import run

    out = tracker_env / "out"
    cfg = JobConfig(
        run=RunConfig(tracking="mlflow", tracking_uri="sqlite:////proc/no-such/mlflow.db", output=str(out)),
    )
    assert run(resolve(cfg)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --tracking mlflow: cannot open sqlite:////proc/no-such/mlflow.db") and "\n" not in err
    assert not out.exists()  # refused before the results folder, and before NVFlare
    assert os.listdir(tracker_env) == ["wandb-home"] or not os.listdir(tracker_env)


def test_a_tracker_that_cannot_start_its_run_ends_the_others_and_stops_the_job(tracker_env, mlflow_store, monkeypatch):
    import wandb

    def refuses(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuses)
    folder = tracker_env / "run"
    cfg = config(folder, "mlflow,wandb", mlflow_store)
    tracking = RunTracking.for_config(cfg)
    tracking.connect()
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"--tracking wandb: W&B did not start a run \(api_key not configured"):
        tracking.start(str(folder), cfg.to_dict())
    (run,) = mlflow_runs(mlflow_store)
    assert run.info.status == "FAILED" and "a tracker did not start (wandb:" in run.data.tags["outcome.reason"]

"""A sweep in MLflow and W&B, with trial processes that run no job but track as the job's driver does
(``jobs.tracking.RunTracking`` from their own flags): the study is one MLflow parent run (its study name recorded)
with one nested run per trial, a pruned trial is marked pruned in both trackers, a store that cannot be opened is
refused before any trial, and ``python -m jobs.sweep show`` prints the tracking URI."""

from __future__ import annotations

import optuna
import pytest

from common.config_flags import flag_args
from common.jsonio import write_json_atomic
from evaluation.run_recorder import record_interruption
from jobs.cli import build_parser, config_from_args
from jobs.sweep.cli import main
from jobs.sweep.runner import Sweep, SweepOptions
from jobs.sweep.spec import parse_spec
from jobs.tracking.run_tracking import RunTracking
from tests.fakes.sweep import BASE, FakeTrial, refused_before_any_trial, reset
from tests.tracker_readers import mlflow_runs, mlflow_series, wandb_runs


class TrackedFake(FakeTrial):
    """A fake trial whose "driver" tracks it: its config from its flags, its trackers opened in its folder, its
    records logged as they come, its end (completed, or interrupted when stopped) logged last."""

    def __init__(self, flags: dict, folder: str, cores):
        super().__init__(flags, folder, cores)
        args = build_parser("", method_choice=True).parse_args([*flag_args(flags), "--output", folder])
        self.cfg = config_from_args(args, args.method, presets=True)
        self.tracking = RunTracking.for_config(self.cfg)
        self.tracking.connect()
        import os

        os.makedirs(folder)
        self.tracking.start(folder, self.cfg.to_dict(), self.cfg.method_spec.flag_prefix)
        self.tracking.interval = 0.0
        self._write()

    def _write(self, outcome: str | None = None) -> None:
        records = [r | {"wall_seconds": float(r["version"])} for r in self.records()]
        metrics = {"config": self.cfg.to_dict(), "versions": records}
        if outcome:
            metrics["outcome"] = {"status": outcome, "reason": "test", "version": len(metrics["versions"])}
        write_json_atomic(f"{self.folder}/metrics.json", metrics)

    def poll(self):
        was, code = self.code, super().poll()
        if was is None and code is not None:
            self._write("completed")
            self.tracking.finish()
        elif code is None:
            self._write()
            self.tracking.log_new()
        return code

    def stop(self):
        code = super().stop()
        record_interruption(self.folder, {}, "SIGTERM")  # as the trial's driver does on the sweep's SIGTERM
        self.tracking.finish()
        return code


SPEC = BASE + "  tracking: mlflow,wandb\n  tracking-uri: {uri}\n  workspace: {ws}\ngrid: {{seed: [1, 2, 3]}}\n"


def test_a_sweep_is_a_parent_run_with_a_nested_run_per_trial_and_its_pruned_trial_marked(
    tracker_env, mlflow_store, monkeypatch, capsys
):
    uri = mlflow_store
    spec = parse_spec(SPEC.format(uri=uri, ws=tracker_env / "ws"), "seeds")
    real = optuna.trial.Trial.should_prune
    monkeypatch.setattr(optuna.trial.Trial, "should_prune", lambda t: t.number == 1 or real(t))
    reset()
    opts = SweepOptions(output=str(tracker_env / "sweep"), parallel=1, poll_seconds=0.0, bar=False)
    sweep = Sweep(spec, opts, launch=TrackedFake)
    sweep.prepare()
    assert sweep.run() == 0
    sweep.tracking.finish(sweep.study, [], interrupted=False)
    sweep.lock.close()

    runs = mlflow_runs(uri)
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.run_name == spec.study_name and parent.data.tags["optuna.study_name"] == spec.study_name
    assert parent.info.status == "FINISHED" and parent.data.tags["trials.pruned"] == "1"
    assert sweep.study.user_attrs["mlflow_parent_run_id"] == parent.info.run_id
    trials = sorted((r for r in runs if r is not parent), key=lambda r: int(r.data.tags["optuna.trial_number"]))
    assert [r.data.tags["mlflow.parentRunId"] for r in trials] == [parent.info.run_id] * 3
    assert [r.info.run_name for r in trials] == ["0000", "0001", "0002"]
    assert [r.data.params["seed"] for r in trials] == ["1", "2", "3"]
    assert [r.data.tags["optuna.trial_state"] for r in trials] == ["complete", "pruned", "complete"]
    assert [r.info.status for r in trials] == ["FINISHED", "KILLED", "FINISHED"]
    assert trials[1].data.tags["outcome"] == "pruned" and "pruned by the sweep" in trials[1].data.tags["outcome.reason"]
    assert [s for s, _ in mlflow_series(uri, trials[0].info.run_id, "accuracy")] == [1, 2, 3]
    assert trials[0].data.metrics["objective"] == sweep.study.trials[0].value

    wandb = wandb_runs(str(tracker_env / "ws" / "wandb"))
    assert sorted(r["name"] for r in wandb.values()) == ["0000", "0001", "0002"]
    assert {r["group"] for r in wandb.values()} == {spec.study_name}  # W&B's own grouping of the study's runs
    pruned = next(r for r in wandb.values() if r["name"] == "0001")
    assert pruned["summary"]["outcome"] == "pruned" and pruned["summary"]["optuna.trial_state"] == "pruned"
    assert len(pruned["folders"]) == 2  # the trial's own attempt, and the sweep's mark on the same run

    capsys.readouterr()
    assert main(["show", str(tracker_env / "sweep")]) == 0
    shown = capsys.readouterr().out
    assert f"[sweep] tracking URI: {uri} (MLflow parent run {parent.info.run_id}" in shown
    assert f"mlflow ui --backend-store-uri {uri}" in shown and f"group {spec.study_name}" in shown


def test_a_sweep_whose_store_cannot_be_opened_or_that_names_a_parent_is_refused_before_any_trial(tracker_env, capsys):
    text = BASE + "  tracking: mlflow\n  tracking-uri: sqlite:////proc/no-such/m.db\ngrid: {seed: [1]}\n"
    err = refused_before_any_trial(tracker_env, capsys, text)
    assert "--tracking mlflow: cannot open sqlite:////proc/no-such/m.db" in err
    text = BASE + "  tracking: mlflow\n  tracking-parent: abc\ngrid: {seed: [1]}\n"
    assert "tracking-parent: the sweep sets these itself" in refused_before_any_trial(tracker_env, capsys, text)


@pytest.fixture(autouse=True)
def _no_group_left(monkeypatch):
    """The sweep sets W&B's group for its trials in its own environment: undone after each test."""
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)

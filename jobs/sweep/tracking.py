"""A sweep in the trackers its trials use (the spec's ``tracking`` flag): one MLflow parent run for the study, each
trial's run nested under it and marked with its trial number and state; in W&B, the trials grouped by the study.

* The parent run (MLflow) is named after the study and tagged with Optuna's study name and the sweep's folder; its
  id is kept in the study (``mlflow_parent_run_id``), so running the same command again continues it. Each
  trial's driver gets ``--tracking-parent ID`` (not part of the trial's printed command) and creates its run under
  it, named after the trial's folder (``0003``, ``0003-seed1``).
* W&B has no nesting: the trials' runs share the group ``WANDB_RUN_GROUP`` = the study's name (set for the trial
  processes unless the environment sets it).
* When a trial ends the sweep tags its runs ``optuna.trial_number``, ``optuna.trial_state`` (complete, pruned,
  fail) and ``optuna.study_name``, logs its objective, and marks a pruned run's outcome ``pruned`` (its run is
  continued by id and ended again with the ``metrics.json`` the sweep rewrote: W&B's resume, offline a second
  folder of the same run). A tracker that fails here is said once; the sweep goes on.
"""

from __future__ import annotations

import os
import sys

from common.result_files import METRICS
from jobs.run.results import read_metrics
from jobs.sweep.spec import SpecError, SweepSpec
from jobs.tracking.choice import default_mlflow_uri, error_line, trackers_of
from jobs.tracking.mlflow_run import MlflowRun
from jobs.tracking.params import value_text
from jobs.tracking.run_tracking import read_state
from jobs.tracking.wandb_run import WandbRun, wandb_dir

PARENT_ATTR, URI_ATTR = "mlflow_parent_run_id", "mlflow_uri"


def spec_tracking(spec: SweepSpec) -> tuple[tuple[str, ...], str | None]:
    """The trackers and MLflow store a sweep's trials use: its first run's flags (the spec's base, as a rule)."""
    cells, repeats = spec.slots() or [{}], spec.repeats() or [{}]
    flags = spec.trial_flags(cells[0], repeats[0])
    return trackers_of(flags.get("tracking", "tensorboard")), flags.get("tracking-uri")


def mlflow_uri(spec: SweepSpec) -> str:
    return spec_tracking(spec)[1] or default_mlflow_uri(spec.workspace())


class SweepTracking:
    """Args:
    spec: the sweep's spec.
    folder: the sweep's folder.
    """

    def __init__(self, spec: SweepSpec, folder: str):
        self.spec, self.folder = spec, folder
        chosen, _ = spec_tracking(spec)
        self.mlflow = MlflowRun(mlflow_uri(spec)) if "mlflow" in chosen else None
        self.wandb = "wandb" in chosen
        self.failed = False

    @classmethod
    def opened(cls, spec: SweepSpec, folder: str, study) -> SweepTracking:
        tracking = cls(spec, folder)
        tracking.open(study)
        return tracking

    def open(self, study) -> None:
        """Open the parent run (a new one, or the study's own); ``SpecError`` (exit 2, before any trial) when the
        store cannot be opened."""
        if self.wandb:
            os.environ.setdefault("WANDB_RUN_GROUP", study.study_name)
        if self.mlflow is None:
            return
        try:
            self.mlflow.connect()
        except ValueError as ex:
            raise SpecError(str(ex)) from ex
        attrs = study.user_attrs
        saved = {"run_id": attrs.get(PARENT_ATTR), "uri": attrs.get(URI_ATTR)}
        tags = {"optuna.study_name": study.study_name, "sweep.folder": self.folder}
        params = {k: value_text(v) for k, v in self.spec.base.items()}
        params |= {f"objective.{k}": value_text(v) for k, v in vars(self.spec.objective).items() if v is not None}
        state = self.mlflow.start(saved, study.study_name, params, tags)
        study.set_user_attr(PARENT_ATTR, state["run_id"])
        study.set_user_attr(URI_ATTR, self.mlflow.uri)
        spec_file = os.path.join(self.folder, "spec.yaml")
        if os.path.exists(spec_file):
            self.mlflow.client.log_artifact(state["run_id"], spec_file)
        print(f"[sweep] tracking: {self.mlflow.describe()}; each trial's run nested under it")

    def trial_flags(self) -> dict:
        """What each trial's command line gets on top of its own flags: the parent run."""
        return {"tracking-parent": self.mlflow.run_id} if self.mlflow is not None and self.mlflow.run_id else {}

    def mark(self, trial_number: int, study_name: str, state: str, value: float | None, folders: list[str]) -> None:
        """Tag an ended trial's runs (one per process ``folders``) with the trial, its state and objective; a
        pruned one's outcome becomes ``pruned``."""
        if self.mlflow is None and not self.wandb:
            return
        tags = {"optuna.trial_number": str(trial_number), "optuna.trial_state": state, "optuna.study_name": study_name}
        if value is not None:
            tags["optuna.objective"] = str(value)
        for folder in folders:  # a run never started has no state: nothing to mark
            saved = read_state(folder)
            metrics = read_metrics(folder)
            if self.mlflow is not None and (saved.get("mlflow") or {}).get("run_id"):
                self._safe(self._mark_mlflow, saved["mlflow"], tags, metrics, folder, state)
            if self.wandb and state == "pruned" and (saved.get("wandb") or {}).get("run_id"):
                self._safe(self._mark_wandb, saved["wandb"], tags, metrics, folder)

    def _mark_mlflow(self, saved: dict, tags: dict, metrics: dict, folder: str, state: str) -> None:
        trial = MlflowRun(saved["uri"], experiment=self.mlflow.experiment)
        trial.client, trial.run_id = self.mlflow.client, saved["run_id"]
        trial.tag(tags)
        if tags.get("optuna.objective") is not None:
            trial.client.log_metric(trial.run_id, "objective", float(tags["optuna.objective"]))
        if state == "pruned":
            trial.finish(metrics, [os.path.join(folder, METRICS)])  # the outcome the sweep rewrote

    def _mark_wandb(self, saved: dict, tags: dict, metrics: dict, folder: str) -> None:
        run = WandbRun(wandb_dir(self.spec.workspace()))
        run.start(saved, os.path.basename(folder), {}, {})
        run.tag(tags)
        run.finish(metrics, [])

    def finish(self, study, files: list[str], interrupted: bool) -> None:
        """End the parent run: the best trial and the counts as tags, ``files`` (the plots) as artefacts."""
        if self.mlflow is None or self.mlflow.run_id is None or self.failed:
            return
        from jobs.sweep.study import best_trial, counts

        best = best_trial(study)
        tags = {f"trials.{k}": str(v) for k, v in counts(study).items() if v}
        if best is not None:
            tags |= {"best.trial_number": str(best.number), "best.objective": str(best.value)}
            tags |= {f"best.{k}": value_text(v) for k, v in best.params.items()}
        outcome = {"outcome": {"status": "interrupted" if interrupted else "completed"}}
        self._safe(self._finish_parent, tags, files, outcome)

    def _finish_parent(self, tags: dict, files: list[str], outcome: dict) -> None:
        self.mlflow.tag(tags)
        self.mlflow.finish(outcome, files)

    def describe(self) -> str:
        return self.mlflow.describe() if self.mlflow is not None else ""

    def _safe(self, call, *args) -> None:
        if self.failed:
            return
        try:
            call(*args)
        except Exception as ex:  # a tracker's error never stops the sweep
            self.failed = True
            print(f"[sweep] warning: tracking failed ({error_line(ex)}); the sweep goes on", file=sys.stderr)


def tracking_lines(study, spec: SweepSpec) -> list[str]:
    """Where a sweep's runs are tracked (``python -m jobs.sweep show``): the MLflow store and parent run, the W&B
    group."""
    chosen, _ = spec_tracking(spec)
    lines = []
    uri, parent = study.user_attrs.get(URI_ATTR), study.user_attrs.get(PARENT_ATTR)
    if uri and parent:
        how = f"mlflow ui --backend-store-uri {uri}" if uri.startswith("sqlite:///") else f"open {uri}"
        lines.append(
            f"[sweep] tracking URI: {uri} (MLflow parent run {parent}, one nested run per trial); see it with: {how}"
        )
    if "wandb" in chosen:
        where = os.path.join(wandb_dir(spec.workspace()), "wandb")
        lines.append(f"[sweep] W&B: the trials' runs are in the group {study.study_name} (offline files in {where})")
    return lines

"""One job as one MLflow run, written with MLflow's own client (``mlflow.tracking.MlflowClient``).

The store is ``--tracking-uri`` (default: ``MLFLOW_TRACKING_URI``, else SQLite in the workspace,
``jobs.tracking.choice.default_mlflow_uri``), the experiment ``MLFLOW_EXPERIMENT_NAME`` (default
``edgesim-flare``), or the parent's with ``--tracking-parent``. A local SQLite store keeps its artefacts in
``mlartifacts/`` beside the database, so ``mlflow ui --backend-store-uri sqlite:///PATH`` shows everything.

The run is named after the results folder. Its parameters are the whole configuration (``jobs.tracking.params``);
each evaluated version's figures are metrics at step = version, and ``accuracy_vs_sim_ms`` at step = simulated
milliseconds (``jobs.tracking.series``), each point timestamped with the version's evaluation; at the end, the
outcome and summary are tags, the result files artefacts, and the run's status FINISHED (completed), FAILED
(stopped early) or KILLED (interrupted, pruned). ``start`` with the state of an earlier attempt (``--resume``)
continues that run: parameters it already has keep their first value (a harmless flag given anew, such as a larger
``--max-model-version``, is the tag ``resumed_with.<flag>``).
"""

from __future__ import annotations

import logging
import os
import pathlib
import time

from common.choices import ConfigError
from jobs.tracking.choice import error_line
from jobs.tracking.series import (
    BYTES_METRIC,
    SIM_METRIC,
    bytes_step,
    end_status,
    end_tags,
    sim_step,
    version_metrics,
)

EXPERIMENT = "edgesim-flare"
ARTIFACT_DIR = "mlartifacts"  # beside a local SQLite store
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag: the UI nests the run under its parent
BATCH = 1000  # MLflow takes at most 1000 metrics, 100 parameters and 100 tags per batch


def quiet_mlflow() -> None:
    """MLflow's and Alembic's INFO lines (its database set-up) stay off the run's console."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # a store that does not answer fails in seconds, not after MLflow's default of 7 retries (the user's own
    # settings win)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


def sqlite_path(uri: str) -> str | None:
    """The database file of a ``sqlite:///PATH`` URI (None for any other store)."""
    return uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else None


def _chunks(items: list, size: int = BATCH):
    for i in range(0, len(items), size):
        yield items[i : i + size]


class MlflowRun:
    """Args:
    uri: the tracking store.
    parent: the run id this run is nested under (its experiment is the parent's).
    experiment: the experiment's name (default: ``MLFLOW_EXPERIMENT_NAME``, else ``edgesim-flare``).
    """

    name = "mlflow"

    def __init__(self, uri: str, parent: str | None = None, experiment: str | None = None):
        self.uri = uri
        self.parent = parent
        self.experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        self.client = None
        self.experiment_id: str | None = None
        self.run_id: str | None = None

    def connect(self) -> None:
        """Open the store and the experiment (created when new); ``ConfigError`` in one line when it cannot."""
        try:
            from mlflow.tracking import MlflowClient

            quiet_mlflow()  # after the import: MLflow sets its logger's level as it loads
            path = sqlite_path(self.uri)
            if path:
                os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
            self.client = MlflowClient(tracking_uri=self.uri)
            if self.parent:
                self.experiment_id = self.client.get_run(self.parent).info.experiment_id
                self.experiment = self.client.get_experiment(self.experiment_id).name
            else:
                self.experiment_id = self._experiment(path)
        except Exception as ex:  # MLflow's and SQLAlchemy's errors share no base we could name
            raise ConfigError(
                f"--tracking mlflow: cannot open {self.uri}"
                + (f" (parent run {self.parent})" if self.parent else "")
                + f": {error_line(ex)}; give --tracking-uri a store MLflow can open (sqlite:///PATH, http://HOST:PORT)"
            ) from ex

    def _experiment(self, path: str | None) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        location = pathlib.Path(os.path.dirname(os.path.abspath(path)), ARTIFACT_DIR).as_uri() if path else None
        try:
            return self.client.create_experiment(self.experiment, artifact_location=location)
        except Exception:  # another run created it a moment ago
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def start(self, saved: dict | None, name: str, params: dict[str, str], tags: dict[str, str]) -> dict:
        """Create the run, or continue ``saved``'s (an earlier attempt's state) when it is in this store; its
        state (what ``--resume`` needs to continue it)."""
        from mlflow.entities import Param, RunTag

        run = None
        if saved and saved.get("uri") == self.uri and saved.get("run_id"):
            try:
                run = self.client.get_run(saved["run_id"])
            except Exception:  # deleted since: a new run then
                run = None
        if run is None:
            tags = tags | ({PARENT_TAG: self.parent} if self.parent else {})
            run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
            self.run_id = run.info.run_id
            new, changed = params, {}
        else:
            self.run_id = run.info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            have = run.data.params
            new = {k: v for k, v in params.items() if k not in have}
            changed = {f"resumed_with.{k}": v for k, v in params.items() if k in have and have[k] != v}
            resumes = int(run.data.tags.get("resumes", "0")) + 1
            changed |= {"resumes": str(resumes)}
        for chunk in _chunks(list(new.items()), 100):
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in chunk])
        for chunk in _chunks(list(changed.items()), 100):
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in chunk])
        return {"run_id": self.run_id, "uri": self.uri, "experiment_id": self.experiment_id}

    def log_versions(self, records: list[dict]) -> None:
        from mlflow.entities import Metric

        points = []
        for r in records:
            stamp = int(1000 * (r.get("epoch") or time.time()))
            points += [Metric(k, v, stamp, int(r["version"])) for k, v in version_metrics(r).items()]
            step = sim_step(r)
            if step is not None and r.get("accuracy") is not None:
                points.append(Metric(SIM_METRIC, float(r["accuracy"]), stamp, step))
            step = bytes_step(r)
            if step is not None and r.get("accuracy") is not None:
                points.append(Metric(BYTES_METRIC, float(r["accuracy"]), stamp, step))
        for chunk in _chunks(points):
            self.client.log_batch(self.run_id, metrics=chunk)

    def log_staleness(self, rows: dict[int, dict[str, float]]) -> None:
        from mlflow.entities import Metric

        stamp = int(1000 * time.time())
        points = [Metric(k, v, stamp, version) for version, row in rows.items() for k, v in row.items()]
        for chunk in _chunks(points):
            self.client.log_batch(self.run_id, metrics=chunk)

    def tag(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        for chunk in _chunks(list(tags.items()), 100):
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in chunk])

    def finish(self, metrics: dict, files: list[str]) -> None:
        """The outcome and summary as tags, ``files`` as artefacts, and the run's end status."""
        self.tag(end_tags(metrics))
        for path in files:
            self.client.log_artifact(self.run_id, path)
        self.client.set_terminated(self.run_id, status=end_status(metrics))

    def abandon(self) -> None:
        """After a failure: nothing is held back (every call wrote at once); the run stays as the store has it."""

    def describe(self) -> str:
        path = sqlite_path(self.uri)
        how = f"mlflow ui --backend-store-uri {self.uri}" if path else f"open {self.uri}"
        return f"MLflow run {self.run_id} (experiment {self.experiment!r}) in {self.uri}; see it with: {how}"

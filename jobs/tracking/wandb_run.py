"""One job as one W&B run, written with W&B's own client (``wandb``), offline unless the environment says otherwise.

Without ``WANDB_MODE`` in the environment the run is offline: nothing leaves the machine, and its files go to
``WANDB_DIR`` (default: the workspace), ``wandb/offline-run-*``, for ``wandb sync`` later. W&B's other variables
(``WANDB_MODE=online`` with a login, ``WANDB_PROJECT`` (default ``edgesim-flare``), ``WANDB_ENTITY``,
``WANDB_RUN_GROUP``: a sweep's trials share its study's name) apply as W&B documents them.

The run is named after the results folder; its config is the whole configuration (``jobs.tracking.params``).
Each evaluated version is one logged row with ``version`` as the x-axis of every metric (``sim_seconds`` is in the
same row, to plot against instead); the staleness rows follow as versions complete. At the end: the outcome and
summary in the run's summary, the outcome as its tag, the result files as one ``results`` artefact, and the exit
code (0 when completed). ``start`` with an earlier attempt's state continues that run (W&B's ``resume="allow"``
with the same id: offline, a second folder of the same run, which ``wandb sync`` adds to it).
"""

from __future__ import annotations

import os

from common.choices import ConfigError
from jobs.tracking.choice import error_line
from jobs.tracking.series import end_tags, version_metrics

PROJECT = "edgesim-flare"


def wandb_dir(workspace: str) -> str:
    """Where W&B's files go: ``WANDB_DIR``, else the workspace (W&B adds ``wandb/``)."""
    return os.environ.get("WANDB_DIR") or os.path.abspath(os.path.expanduser(workspace))


class WandbRun:
    """Args:
    folder: the folder W&B writes its ``wandb/`` into.
    """

    name = "wandb"

    def __init__(self, folder: str):
        self.folder = folder
        self.run = None
        self.mode = os.environ.get("WANDB_MODE") or "offline"

    def connect(self) -> None:
        try:
            import wandb  # noqa: F401
        except Exception as ex:  # an install that cannot import (a missing binary) is as bad as none
            raise ConfigError(
                f"--tracking wandb: its client does not import ({error_line(ex)}); pip install 'edgesim-flare[wandb]'"
            ) from ex

    def start(self, saved: dict | None, name: str, params: dict[str, str], tags: dict[str, str]) -> dict:
        import wandb

        os.makedirs(self.folder, exist_ok=True)
        kwargs = {
            "dir": self.folder,
            "name": name,
            "config": params,
            "notes": tags.get("edgesim.command"),
            # our own figures carry the machine's load; W&B's console capture would copy the run's output
            "settings": wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False),
        }
        if "WANDB_MODE" not in os.environ:
            kwargs["mode"] = "offline"
        if "WANDB_PROJECT" not in os.environ:
            kwargs["project"] = PROJECT
        if os.environ.get("WANDB_RUN_GROUP"):  # read now: W&B reads its environment once per process
            kwargs["group"] = os.environ["WANDB_RUN_GROUP"]
        if saved and saved.get("run_id"):
            kwargs |= {"id": saved["run_id"], "resume": "allow"}
        try:
            self.run = wandb.init(**kwargs)
        except Exception as ex:
            raise ConfigError(
                f"--tracking wandb: W&B did not start a run ({error_line(ex)}); "
                "offline needs nothing, online a login (wandb login) or WANDB_MODE=offline"
            ) from ex
        if saved:
            self.run.config.update(params, allow_val_change=True)
        self.run.define_metric("version")
        self.run.define_metric("*", step_metric="version")
        return {"run_id": self.run.id, "dir": self.run.dir, "mode": self.mode}

    def log_versions(self, records: list[dict]) -> None:
        for r in records:
            self.run.log({"version": int(r["version"])} | version_metrics(r))

    def log_staleness(self, rows: dict[int, dict[str, float]]) -> None:
        for version, row in rows.items():
            self.run.log({"version": version} | row)

    def tag(self, tags: dict[str, str]) -> None:
        self.run.summary.update(tags)

    def finish(self, metrics: dict, files: list[str]) -> None:
        import wandb

        tags = end_tags(metrics)
        self.run.summary.update(tags)
        if tags.get("outcome"):
            self.run.tags = (*self.run.tags, tags["outcome"])
        if files:
            artefact = wandb.Artifact(f"results-{self.run.id}", type="results")
            for path in files:
                artefact.add_file(path)
            self.run.log_artifact(artefact)
        completed = (metrics.get("outcome") or {}).get("status") == "completed"
        self.run.finish(exit_code=0 if completed else 1)

    def abandon(self) -> None:
        """After a failure: end the run as W&B has it (its service writes what it holds), exit code 1."""
        if self.run is not None:
            self.run.finish(exit_code=1)

    def describe(self) -> str:
        where = os.path.dirname(self.run.dir) if self.run is not None else self.folder
        how = f"upload it with: wandb sync {where}" if self.mode == "offline" else "in W&B"
        return f"W&B run {self.run.id if self.run else '?'} ({self.mode}) in {where}; {how}"

"""The run/output part of a job's configuration (``RunConfig``: evaluation, seed, environment, results, checkpoints,
tracking), one of ``jobs.config.JobConfig``'s parts; its fields are the run's flags."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Literal

from common.choices import ConfigError, EvalBacklog, check_choice, check_positive
from jobs.admin_kit import check_user
from jobs.tracking.choice import check_clients, check_tracking

EnvName = Literal["sim", "poc", "prod"]


@dataclass(frozen=True)
class RunConfig:
    """Attributes:
    eval_frequency: evaluate every N global model versions (and always the last).
    eval_backlog: when evaluation falls behind the versions made: ``wait`` evaluates every scheduled
        version, so a seed's curve never depends on the machine's load; ``skip`` (opt-in, speed over a complete
        curve) evaluates the newest scheduled version and skips the older ones still waiting (never the last).
    seed: fixes the initial model, data, partition, device delays, local sampling and device selection (>= 0).
    env: ``sim`` (NVFlare's SimEnv), ``poc`` (PocEnv) or ``prod`` (ProdEnv on a provisioned hierarchy).
    startup_kit: the admin's startup kit folder (``--env prod``).
    username: the admin user name (``--env prod``).
    workspace: the default results root.
    output: the results folder, two runs never sharing one; NVFlare's own workspace and logs go into its
        ``nvflare/`` subfolder (default: a new ``WORKSPACE/results/JOB_NAME-DATE-TIME-PID``).
    export_only: write the NVFlare job to this folder and exit (run it with ``nvflare simulator DIR/JOB -n L -t
        L``).
    dry_run: compute the run's event trace only, in seconds (no training, no NVFlare; ``scheduling.timeline``):
        ``events.jsonl`` (the one a real run writes) and ``timeline.json`` (versions per time unit, staleness,
        failure rate, fleet use) in the results folder, then exit.
    job_name: NVFlare job name (default: ``edgesim_<method>``).
    checkpoint_every: versions between checkpoints of the server's state; 0: automatic (at most 5% of the run's
        wall time); -1: none.
    resume: continue the run whose results (``--output``) folder this is, from its last checkpoint, with its saved
        configuration (flags that would change its result are refused).
    tracking: where the run's curves go, comma-separated: ``tensorboard`` (its ``tensorboard/`` folder), ``mlflow``
        (one MLflow run), ``wandb`` (one W&B run, offline unless ``WANDB_MODE`` says otherwise), or ``none``
        (docs/tracking.md).
    tracking_uri: MLflow's tracking store, any URI MLflow takes (``sqlite:///PATH``, ``http://HOST:5000``) (default:
        ``MLFLOW_TRACKING_URI``, else ``sqlite:///WORKSPACE/mlflow.db``).
    tracking_parent: the id of the MLflow run this run is nested under (a sweep gives its trials its own).
    """

    seed: int = 0
    eval_frequency: int = 1
    eval_backlog: EvalBacklog = "wait"
    env: EnvName = "sim"
    startup_kit: str | None = None
    username: str | None = None
    workspace: str = "~/.cache/edgesim-flare/workspace"
    output: str | None = None
    export_only: str | None = None
    dry_run: bool = False
    job_name: str = ""
    checkpoint_every: int = 0
    resume: str | None = None
    tracking: str = "tensorboard"
    tracking_uri: str | None = None
    tracking_parent: str | None = None

    def __post_init__(self) -> None:
        check_positive({"--eval-frequency": self.eval_frequency})
        check_tracking(self)
        if self.seed < 0:  # numpy's generators take non-negative seeds only: refused here, not in a leaf process
            raise ConfigError(f"--seed {self.seed}: use a non-negative integer")
        check_choice("--eval-backlog", self.eval_backlog, EvalBacklog)
        if self.dry_run and (self.resume or self.export_only):
            raise ConfigError("--dry-run computes a new run's trace: leave out --resume and --export-only")
        if self.checkpoint_every < -1:
            raise ConfigError(f"--checkpoint-every {self.checkpoint_every}: versions, 0 (automatic) or -1 (never)")
        check_choice("--env", self.env, EnvName)
        if self.env == "prod" and not (self.startup_kit and self.username):
            raise ConfigError("--env prod needs --startup-kit DIR (the admin's startup kit) and --username NAME")
        if self.resume and self.env != "sim":
            raise ConfigError(
                f"--resume with --env {self.env}: resuming continues SimEnv runs only (a deployment's "
                "server keeps its checkpoint in its own job workspace); run it again, or leave out --env"
            )

    def validate(self) -> None:
        """The startup kit must be a folder (``prod``), an admin kit whose user is ``--username``; in SimEnv the
        ``--output`` folder (NVFlare's workspace goes inside it) must hold no whitespace."""
        if self.env == "sim" and not self.export_only and self.output and any(c.isspace() for c in self.output):
            # NVFlare's simulator builds its commands as strings and splits them on spaces: it exits 2 with
            # "unrecognized arguments" after our processes started
            raise ConfigError(
                f"--output {self.output!r} holds whitespace, which NVFlare's simulator cannot take (it splits its "
                "commands on spaces); choose a folder without spaces"
            )
        if self.env == "prod" and not os.path.isdir(os.path.expanduser(self.startup_kit)):
            raise ConfigError(f"--startup-kit {self.startup_kit}: no such directory")
        if self.env == "prod":
            # the kit names its user: a wrong --username or a folder that is no admin kit is refused here, in one
            # line, not after NVFlare's login fails (a traceback, and an --output folder made for nothing)
            try:
                check_user(self.startup_kit, self.username)
            except ValueError as ex:
                raise ConfigError(str(ex)) from ex
        check_clients(self.tracking)

    def to_dict(self) -> dict:
        return asdict(self)

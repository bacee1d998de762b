"""``--tracking``: which trackers a run logs to, read and checked before anything starts (``RunConfig``)."""

from __future__ import annotations

import importlib.util
import os

from common.choices import ConfigError

TRACKERS = ("tensorboard", "mlflow", "wandb")
NONE = "none"
DRIVER_TRACKERS = ("mlflow", "wandb")  # the ones the driver logs to (TensorBoard is the server's own writer)
CLIENTS = {"mlflow": "mlflow", "wandb": "wandb"}  # the module each one imports
EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}  # the pyproject extra that installs it


def trackers_of(text: str) -> tuple[str, ...]:
    """The trackers a ``--tracking`` value names, in ``TRACKERS`` order (``none`` or empty: none);
    ``ConfigError`` for a name it does not know."""
    names = {n.strip().lower() for n in str(text or "").split(",") if n.strip()}
    unknown = sorted(names - set(TRACKERS) - {NONE})
    if unknown or (NONE in names and len(names) > 1):
        raise ConfigError(
            f"--tracking {text}: use any of {', '.join(TRACKERS)}, comma-separated (e.g. tensorboard,mlflow), or {NONE}"
        )
    return tuple(t for t in TRACKERS if t in names)


def check_tracking(run) -> None:
    """What ``RunConfig`` can check of its tracking fields without importing anything (one line naming the fix)."""
    chosen = trackers_of(run.tracking)
    driver = [t for t in chosen if t in DRIVER_TRACKERS]
    if run.tracking_uri and "mlflow" not in chosen:
        raise ConfigError("--tracking-uri is MLflow's store: add mlflow to --tracking, or leave it out")
    if run.tracking_parent and "mlflow" not in chosen:
        raise ConfigError("--tracking-parent is an MLflow run's id: add mlflow to --tracking, or leave it out")
    if driver and (run.dry_run or run.export_only):
        what = "a dry run trains nothing to track" if run.dry_run else "an exported job runs without this driver"
        raise ConfigError(
            f"--tracking {','.join(driver)}: the driver logs a run as it goes, and {what}; leave out "
            f"{', '.join(driver)} (TensorBoard's files are the server's own)"
        )


def check_clients(tracking: str) -> None:
    """Each chosen tracker's client must import: ``ConfigError`` naming the install otherwise."""
    for name in trackers_of(tracking):
        module = CLIENTS.get(name)
        if module and importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"--tracking {name}: its client ({module}) is not installed; pip install 'edgesim-flare[{EXTRAS[name]}]' "
                f"(or {module}), or leave {name} out of --tracking"
            )


def error_line(ex: BaseException) -> str:
    """A client's error as one short line (its first), for a message of ours."""
    text = str(ex).strip()
    return text.splitlines()[0][:300] if text else type(ex).__name__


def default_mlflow_uri(workspace: str) -> str:
    """MLflow's store when ``--tracking-uri`` is not given: ``MLFLOW_TRACKING_URI`` if the environment sets it, else
    a SQLite database in the workspace, which every run of that workspace shares."""
    given = os.environ.get("MLFLOW_TRACKING_URI")
    if given:
        return given
    return "sqlite:///" + os.path.join(os.path.abspath(os.path.expanduser(workspace)), "mlflow.db")

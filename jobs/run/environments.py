"""Where a job runs: NVFlare's ``SimEnv``, ``PocEnv`` or ``ProdEnv``, set up for this project.

In SimEnv NVFlare's workspace (the job's apps and every process's log) goes into the run's own results folder
(``jobs.run.outputs.nvflare_workspace``), and NVFlare's INFO logging goes to files there only: the console shows the
project's progress lines and NVFlare's warnings and errors (``verbose`` brings NVFlare's console logging back).
Unless the run is ``--simulator stock``, that log config also names ``common.early_start.start_early``, which
each NVFlare simulator process calls as it reads the config, at its very start (our fixes to NVFlare's waits); the
project's root goes on the simulator's ``PYTHONPATH`` so that those processes import it before any app is deployed.
"""

from __future__ import annotations

import json
import os

import nvflare

from jobs.config import JobConfig

QUIET_FILE_HANDLERS = ("logFileHandler", "errorFileHandler")  # log.txt (everything) and error_log.txt
EARLY_START = "common.early_start.start_early"  # a filter factory: what a simulator process starts at once
EARLY_SYNC_NOTICE = "common.nvflare_private.EarlySyncNotice"  # fix 18: a leaf's early sync, off the console
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quiet_log_config(folder: str, early_start: bool = True) -> str:
    """NVFlare's default logging config with the console at WARNING and two log files; returns its path.
    ``early_start``: name ``EARLY_START`` in it, and filter fix 18's line from the console (not for ``--simulator
    stock``, NVFlare's own path unchanged)."""
    with open(os.path.join(os.path.dirname(nvflare.__file__), "fuel", "utils", "log_config.json")) as f:
        config = json.load(f)
    config["handlers"] = {k: v for k, v in config["handlers"].items() if k in ("consoleHandler", *QUIET_FILE_HANDLERS)}
    config["handlers"]["consoleHandler"]["level"] = "WARNING"
    config["loggers"]["root"]["handlers"] = ["consoleHandler", *QUIET_FILE_HANDLERS]
    if early_start:  # dictConfig builds every filter it declares, attached or not
        config.setdefault("filters", {})["edgesimEarlyStart"] = {"()": EARLY_START}
        # fix 12 (early leaves) makes NVFlare log an ERROR per early sync: kept in the files, not on the console
        config["filters"]["edgesimEarlySync"] = {"()": EARLY_SYNC_NOTICE}
        console = config["handlers"]["consoleHandler"]
        console["filters"] = [*console.get("filters", []), "edgesimEarlySync"]
    path = os.path.join(folder, "log_config.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return path


def project_on_pythonpath() -> None:
    """Put the project's root first on ``PYTHONPATH`` unless it is there: NVFlare's simulator processes inherit
    this process's environment, and they import ``EARLY_START`` before any of the job's files are on their path."""
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if PROJECT_ROOT not in (os.path.abspath(p) for p in entries):
        os.environ["PYTHONPATH"] = os.pathsep.join([PROJECT_ROOT, *entries])


def make_env(cfg: JobConfig, workspace: str = "", verbose: bool = False):
    """The NVFlare environment of ``cfg.run.env``; ``workspace``: SimEnv's workspace root (a fresh folder)."""
    run, leaves = cfg.run, cfg.federation.num_leaf_nodes
    if run.env == "sim":
        from nvflare.recipe.sim_env import SimEnv

        early_start = cfg.engine.simulator != "stock"
        if early_start and not verbose:
            project_on_pythonpath()

        return SimEnv(
            num_clients=leaves,
            num_threads=leaves,  # fewer threads than clients leaves some leaves never running
            workspace_root=workspace,
            log_config=None if verbose else quiet_log_config(workspace, early_start),
        )
    if run.env == "poc":
        from nvflare.recipe.poc_env import PocEnv

        return PocEnv(num_clients=leaves)
    from nvflare.recipe.prod_env import ProdEnv

    return ProdEnv(startup_kit_location=os.path.expanduser(run.startup_kit), username=run.username)

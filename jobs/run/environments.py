"""Where a job runs: NVFlare's ``SimEnv``, ``PocEnv`` or ``ProdEnv``, set up for this project.

In SimEnv NVFlare's workspace (the job's apps and every process's log) goes into the run's own results folder
(``jobs.run.outputs.nvflare_workspace``), and NVFlare's INFO logging goes to files there only: the console shows the
project's progress lines and NVFlare's warnings and errors (``verbose`` brings NVFlare's console logging back).
"""

from __future__ import annotations

import json
import os

import nvflare

from jobs.config import JobConfig

QUIET_FILE_HANDLERS = ("logFileHandler", "errorFileHandler")  # log.txt (everything) and error_log.txt


def quiet_log_config(folder: str) -> str:
    """NVFlare's default logging config with the console at WARNING and two log files; returns its path."""
    with open(os.path.join(os.path.dirname(nvflare.__file__), "fuel", "utils", "log_config.json")) as f:
        config = json.load(f)
    config["handlers"] = {k: v for k, v in config["handlers"].items() if k in ("consoleHandler", *QUIET_FILE_HANDLERS)}
    config["handlers"]["consoleHandler"]["level"] = "WARNING"
    config["loggers"]["root"]["handlers"] = ["consoleHandler", *QUIET_FILE_HANDLERS]
    path = os.path.join(folder, "log_config.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=1)
    return path


def make_env(cfg: JobConfig, workspace: str = "", verbose: bool = False):
    """The NVFlare environment of ``cfg.run.env``; ``workspace``: SimEnv's workspace root (a fresh folder)."""
    run, leaves = cfg.run, cfg.federation.num_leaf_nodes
    if run.env == "sim":
        from nvflare.recipe.sim_env import SimEnv

        return SimEnv(
            num_clients=leaves,
            num_threads=leaves,  # fewer threads than clients leaves some leaves never running
            workspace_root=workspace,
            log_config=None if verbose else quiet_log_config(workspace),
        )
    if run.env == "poc":
        from nvflare.recipe.poc_env import PocEnv

        return PocEnv(num_clients=leaves)
    from nvflare.recipe.prod_env import ProdEnv

    return ProdEnv(startup_kit_location=os.path.expanduser(run.startup_kit), username=run.username)

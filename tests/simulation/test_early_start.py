"""common/early_start.py: the run's log config makes each NVFlare simulator process install our fixes as it
reads that config (before its cell starts); the stock baseline's config does not."""

import gc
import json
import logging.config
import os
import threading

from common import early_start, nvflare_private
from jobs.run import environments


def _filter_from(config: dict, name: str):
    """What ``logging.config.dictConfig`` builds for the filter ``name``, without reconfiguring this process."""
    return logging.config.DictConfigurator(config).configure_filter(dict(config["filters"][name]))


def test_the_runs_log_config_installs_our_fixes_once_as_a_process_reads_it(tmp_path, monkeypatch):
    """...and pauses the garbage collector for the imports that follow (the server's and the leaves' components:
    common.startup_gc)."""
    installed = []
    monkeypatch.setattr(early_start, "_started", threading.Event())
    monkeypatch.setattr(nvflare_private, "install_nvflare_fixes", lambda: installed.append(True))
    with open(environments.quiet_log_config(str(tmp_path))) as f:
        config = json.load(f)
    try:
        assert isinstance(_filter_from(config, "edgesimEarlyStart"), logging.Filter)
        assert not gc.isenabled()
        gc.enable()  # what our assessor or leaf runner does once the process is built
        assert isinstance(_filter_from(config, "edgesimEarlyStart"), logging.Filter)  # NVFlare may apply it again
        assert gc.isenabled()  # once per process
    finally:
        gc.enable()
    assert installed == [True]
    stock = tmp_path / "stock"
    stock.mkdir()
    with open(environments.quiet_log_config(str(stock), early_start=False)) as f:
        assert "edgesimEarlyStart" not in json.load(f)["filters"]


def test_the_project_goes_first_on_the_simulators_pythonpath_once(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    environments.project_on_pythonpath()
    environments.project_on_pythonpath()
    entries = os.environ["PYTHONPATH"].split(os.pathsep)
    assert entries == [environments.PROJECT_ROOT, "/elsewhere"]
    assert os.path.isfile(os.path.join(environments.PROJECT_ROOT, *environments.EARLY_START.split(".")[:-1]) + ".py")

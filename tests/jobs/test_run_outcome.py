"""How the driver reads a run's end: the server's outcome decides; a ``--simulator stock`` run, whose server is
NVFlare's own and decides none, completed when its last evaluated version is the last one asked for."""

import json

from common.result_files import METRICS, RUN_FILES
from jobs.run.driver import report_end


def write_metrics(folder, versions, outcome=None):
    payload = {"versions": [{"version": v, "accuracy": 0.1, "wall_seconds": float(v)} for v in versions]}
    if outcome is not None:
        payload["outcome"] = outcome
    (folder / METRICS).write_text(json.dumps(payload))


def test_a_stock_run_that_reached_its_last_version_completed(tmp_path, capsys):
    write_metrics(tmp_path, [1, 2, 3])
    assert report_end(str(tmp_path), 0.0, RUN_FILES, stock_max_version=3) == 0
    assert "stopped early" not in capsys.readouterr().err


def test_a_stock_run_that_ended_before_its_last_version_stopped_early(tmp_path, capsys):
    write_metrics(tmp_path, [1, 2])
    assert report_end(str(tmp_path), 0.0, RUN_FILES, stock_max_version=3) == 1
    assert "stopped early" in capsys.readouterr().err


def test_our_server_must_decide_the_outcome_itself(tmp_path):
    write_metrics(tmp_path, [1, 2, 3])
    assert report_end(str(tmp_path), 0.0, RUN_FILES) == 1  # no outcome recorded: not completed
    write_metrics(tmp_path, [1, 2, 3], {"status": "completed", "reason": "version 3", "version": 3})
    assert report_end(str(tmp_path), 0.0, RUN_FILES) == 0

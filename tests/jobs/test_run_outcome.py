"""How the driver reads a run's end: the server's outcome decides; a ``--simulator stock`` run, whose server is
NVFlare's own and decides none, completed when its last evaluated version is the last one asked for. A completed
run whose last version is unevaluated, or that saved nothing, exits 3 saying what is missing, and
``python -m jobs.finish`` evaluates the saved version and completes ``metrics.json`` and the plot."""

import json

import torch

from common.result_files import GLOBAL_MODEL, METRICS, RUN_FILES
from jobs.config import JobConfig
from jobs.finish import finish
from jobs.run.driver import INCOMPLETE, report_end
from processors.models import initial_model


def write_metrics(folder, versions, outcome=None):
    payload = {"versions": [{"version": v, "accuracy": 0.1, "wall_seconds": float(v)} for v in versions]}
    if outcome is not None:
        payload["outcome"] = outcome
    (folder / METRICS).write_text(json.dumps(payload))
    (folder / GLOBAL_MODEL).write_bytes(b"")  # saved (these tests only look whether it exists)


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


def killed_while_evaluating(folder, saved: int | None = 4) -> None:
    """A completed run of versions 1..4 (evaluated every version) whose server died while it evaluated version 4:
    versions 1 and 2 recorded, no summary; with ``saved``, ``global_model.pt`` holds that version."""
    config = JobConfig().to_dict()
    config["data"] |= {"synthetic_size": 300}
    config["training"] |= {"compute_device": "cpu", "model": "cifar10_convnet"}  # a run records its model resolved
    config["federation"] |= {"max_model_version": 4}
    records = [{"version": v, "accuracy": 0.1, "loss": 2.3, "wall_seconds": float(v)} for v in (1, 2)]
    payload = {"config": config, "versions": records, "outcome": {"status": "completed", "reason": "version 4"}}
    payload["outcome"] |= {"version": 4, "sim_seconds": 12.5}
    if saved is not None:
        payload["saved_version"] = saved
        torch.save(initial_model("cifar10_convnet", 0).state_dict(), folder / GLOBAL_MODEL)
    (folder / METRICS).write_text(json.dumps(payload))


def test_a_run_killed_while_evaluating_its_last_version_exits_3_and_finishes_afterwards(tmp_path, capsys):
    killed_while_evaluating(tmp_path)
    assert report_end(str(tmp_path), 0.0, RUN_FILES) == INCOMPLETE == 3
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "version 4 was made and saved (global_model.pt) but not evaluated" in last_line
    assert "versions 3" in last_line and f"python -m jobs.finish {tmp_path}" in last_line
    metrics = json.loads((tmp_path / METRICS).read_text())
    assert metrics["summary"]["versions_unevaluated"] == [3, 4]  # the driver wrote it: the server could not

    assert finish(str(tmp_path)) == 0
    metrics = json.loads((tmp_path / METRICS).read_text())
    assert [r["version"] for r in metrics["versions"]] == [1, 2, 4]
    record = metrics["versions"][-1]
    assert record["finished"] and record["sim_seconds"] == 12.5 and 0.0 <= record["accuracy"] <= 1.0
    assert metrics["summary"]["versions_unevaluated"] == [3]  # its weights were not kept
    assert metrics["summary"]["last_evaluated_version"] == 4
    assert (tmp_path / "accuracy.png").exists()
    printed = capsys.readouterr().out
    assert "versions 3 stay unevaluated" in printed
    assert report_end(str(tmp_path), 0.0, RUN_FILES) == 0  # finished: nothing of its last version is missing
    assert finish(str(tmp_path)) == 0 and "nothing to finish" in capsys.readouterr().out


def test_a_run_that_saved_nothing_exits_3_and_cannot_be_finished(tmp_path, capsys):
    killed_while_evaluating(tmp_path, saved=None)
    assert report_end(str(tmp_path), 0.0, RUN_FILES) == INCOMPLETE
    assert "nothing was saved" in capsys.readouterr().err.strip().splitlines()[-1]
    assert finish(str(tmp_path)) == INCOMPLETE
    assert "cannot be evaluated" in capsys.readouterr().err


def test_finish_refuses_a_folder_without_a_run(tmp_path, capsys):
    assert finish(str(tmp_path)) == 2 and "holds no run" in capsys.readouterr().err

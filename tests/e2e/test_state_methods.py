"""The training-rule examples run as users run them, ``--method module:Class``, on real NVFlare jobs: SCAFFOLD
(``examples/scaffold.py``: a per-step correction and ``c_i`` kept per device across tasks) on a diurnal fleet,
killed with SIGKILL after a checkpoint and resumed, ends exactly like its uninterrupted run (its devices' state
survives in the results folder's ``device_state/``, held only for devices that trained); FedNova
(``examples/fednova.py``: its devices report their steps and samples) runs beside them.

The jobs run at once (their results do not depend on it: exact time)."""

from __future__ import annotations

import json
import os

from tests.conftest import PYTHON, examples_env, run_one_killed_and_resumed
from tests.e2e.test_long_runs import DIURNAL, SMALL, results

SGD = ["--optimizer", "sgd", "--local-lr", "0.05", "--max-model-version", "8", "--checkpoint-every", "2"]
RUNS = {
    "whole": ["--method", "scaffold:Scaffold", *SGD, *DIURNAL],
    "killed": ["--method", "scaffold:Scaffold", *SGD, *DIURNAL],
    "fednova": ["--method", "fednova:FedNova", *SGD],
}


def command(name: str, tmp_path) -> list[str]:
    return [PYTHON, "jobs/pt_job_fedrevive.py", *SMALL, *RUNS[name], "--output", str(tmp_path / name)]


def test_scaffold_on_a_diurnal_fleet_resumes_exactly_and_fednova_runs(tmp_path):
    finished = run_one_killed_and_resumed(
        {name: command(name, tmp_path) for name in RUNS}, "killed", tmp_path / "killed", examples_env()
    )
    for name in ("whole", "fednova"):
        assert finished[name][0] == 0, finished[name][1][-3000:]
    events, accuracy, whole = results(tmp_path / "whole")
    events_again, accuracy_again, _ = results(tmp_path / "killed")
    assert events_again == events and accuracy_again == accuracy
    assert (tmp_path / "killed" / "global_model.pt").read_bytes() == (
        tmp_path / "whole" / "global_model.pt"
    ).read_bytes()
    trace = [json.loads(line) for line in events.splitlines()]
    assert any(r.get("failed") for r in trace)  # the diurnal fleet's devices dropped out
    # state for each device that trained (one folder each), none for the devices that never did
    trained = {r["device"].replace("#", "_") for r in trace if not r.get("failed")}
    kept = set(os.listdir(tmp_path / "whole" / "device_state"))
    assert trained <= kept and len(kept) < 24
    # the server's selection floor beside each checkpoint: the stores kept what a resume from it needs
    floor = json.loads((tmp_path / "killed" / "checkpoint" / "selection_floor.json").read_text())
    assert floor["selection_floor"] > 0 and floor["version"] >= 4
    nova = json.loads((tmp_path / "fednova" / "metrics.json").read_text())
    assert nova["config"]["method"] == "fednova:FedNova" and nova["outcome"]["status"] == "completed"
    assert whole["config"]["method"] == "scaffold:Scaffold"

"""The training-rule examples run as users run them, ``--method module:Class``, on real NVFlare jobs: SCAFFOLD
(``examples/scaffold.py``: a per-step correction and ``c_i`` kept per device across tasks) on a diurnal fleet,
killed with SIGKILL after a checkpoint and resumed, ends exactly like its uninterrupted run (its devices' state
survives in the results folder's ``device_state/``, held only for devices that trained); FedNova
(``examples/fednova.py``: its devices report their steps and samples) runs beside them.

The jobs run at once (their results do not depend on it: exact time)."""

from __future__ import annotations

import json
import os

from tests.conftest import DIURNAL, SMALL_JOB, assert_same_run, examples_env, job_commands
from tests.e2e.job_runs import run_one_killed_and_resumed

SMALL = [*SMALL_JOB, "--seed", "5", "--eval-frequency", "4"]
SGD = ["--optimizer", "sgd", "--local-lr", "0.05", "--max-model-version", "8", "--checkpoint-every", "2"]
RUNS = {
    "whole": ["--method", "scaffold:Scaffold", *SGD, *DIURNAL],
    "killed": ["--method", "scaffold:Scaffold", *SGD, *DIURNAL],
    "fednova": ["--method", "fednova:FedNova", *SGD],
}


def test_scaffold_on_a_diurnal_fleet_resumes_exactly_and_fednova_runs(tmp_path):
    out = {name: tmp_path / name / "out" for name in RUNS}
    finished = run_one_killed_and_resumed(job_commands(RUNS, tmp_path, *SMALL), "killed", out["killed"], examples_env())
    for name in ("whole", "fednova"):
        assert finished[name][0] == 0, finished[name][1][-3000:]
    assert_same_run(out["whole"], out["killed"])
    whole = json.loads((out["whole"] / "metrics.json").read_text())
    trace = [json.loads(line) for line in (out["whole"] / "events.jsonl").read_text().splitlines()]
    assert any(r.get("failed") for r in trace)  # the diurnal fleet's devices dropped out
    # state for each device that trained (one folder each), none for the devices that never did
    trained = {r["device"].replace("#", "_") for r in trace if not r.get("failed")}
    kept = set(os.listdir(out["whole"] / "device_state"))
    assert trained <= kept and len(kept) < 24
    # the server's selection floor beside each checkpoint: the stores kept what a resume from it needs
    floor = json.loads((out["killed"] / "checkpoint" / "selection_floor.json").read_text())
    assert floor["selection_floor"] > 0 and floor["version"] >= 4
    nova = json.loads((out["fednova"] / "metrics.json").read_text())
    assert nova["config"]["method"] == "fednova:FedNova" and nova["outcome"]["status"] == "completed"
    assert whole["config"]["method"] == "scaffold:Scaffold"

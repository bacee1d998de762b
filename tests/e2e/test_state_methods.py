"""The training-rule examples run as users run them, ``--method module:Class``, on real NVFlare jobs: SCAFFOLD
(``examples/scaffold.py``: a per-step correction and ``c_i`` kept per device across tasks) on a diurnal fleet,
killed with SIGKILL after a checkpoint and resumed, ends exactly like its uninterrupted run (its devices' state
survives in the results folder's ``device_state/``, held only for devices that trained); FedNova
(``examples/fednova.py``: its devices report their steps and samples) runs beside them.

The jobs run at once (their results do not depend on it: exact time)."""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import PYTHON, REPO
from tests.e2e.test_long_runs import DIURNAL, SMALL, checkpoint_version, kill_tree, results, wait_for
from tests.e2e.test_selection_methods import env

SGD = ["--optimizer", "sgd", "--local-lr", "0.05", "--max-model-version", "8", "--checkpoint-every", "2"]
RUNS = {
    "whole": ["--method", "scaffold:Scaffold", *SGD, *DIURNAL],
    "killed": ["--method", "scaffold:Scaffold", *SGD, *DIURNAL],
    "fednova": ["--method", "fednova:FedNova", *SGD],
}


def command(name: str, tmp_path) -> list[str]:
    return [PYTHON, "jobs/pt_job_fedrevive.py", *SMALL, *RUNS[name], "--output", str(tmp_path / name)]


def test_scaffold_on_a_diurnal_fleet_resumes_exactly_and_fednova_runs(tmp_path):
    procs, outputs = {}, {}
    try:
        for name in RUNS:
            procs[name] = subprocess.Popen(
                command(name, tmp_path),
                cwd=REPO,
                env=env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        killed = tmp_path / "killed"
        wait_for(lambda: checkpoint_version(killed) >= 4, procs["killed"], 300, "a checkpoint at version 4")
        kill_tree(procs["killed"].pid)
        outputs = {name: proc.communicate(timeout=400)[0] for name, proc in procs.items() if name != "killed"}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill_tree(proc.pid)
    for name in ("whole", "fednova"):
        assert procs[name].returncode == 0, outputs[name][-3000:]
    resumed = subprocess.run(  # the original command with --resume appended
        [*command("killed", tmp_path), "--resume", str(tmp_path / "killed")],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stdout[-3000:] + resumed.stderr[-3000:]
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

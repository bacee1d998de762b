"""A real sweep comparing methods at a simulated-time budget, as a new user writes it (the objective ``accuracy_at``
10 simulated s, the paper's delays, no version cap): FedBuff's trial, its version cap lifted by the sweep, runs to
the budget (before, the default cap of 10 ended it at 2.657 simulated s); FedAvg's, capped by the spec itself at 2
versions, ends before the budget and is marked in the table with why. Every trial reached the budget or is marked;
the curves' legend names method and trial beside the budget line. Two small jobs, run at once."""

from __future__ import annotations

import json
import subprocess

import optuna
import pytest
from optuna.trial import TrialState

from jobs.sweep.objective import ended_early
from jobs.sweep.spec import LIFTED_VERSION_CAP, Objective
from tests.conftest import PYTHON, REPO

pytestmark = pytest.mark.slow

SPEC = """
base:
  num-leaf-nodes: 1
  devices-per-leaf: 12
  device-selection-size: 6
  synthetic-size: 1000
  subset-size: 40
  local-iters: 2
  local-batch-size: 16
  delays: paper
  workspace: {ws}
grid:
  method: [fedbuff, fedavg]
when:
  method: {{fedavg: {{max-model-version: 2}}}}
objective: {{metric: accuracy_at, budget: 10}}
"""


def test_a_method_grid_at_a_budget_reaches_it_or_marks_the_trial_that_did_not(tmp_path):
    spec = tmp_path / "budget.yaml"
    spec.write_text(SPEC.format(ws=tmp_path / "ws"))
    folder = tmp_path / "sweep"
    cmd = [PYTHON, "-m", "jobs.sweep", str(spec), "--output", str(folder), "--parallel", "2", "--no-bar"]
    done = subprocess.run([*cmd, "--pruner", "none"], cwd=REPO, capture_output=True, text=True, timeout=400)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "[sweep] budget 10 simulated s: a trial whose flags set no max-model-version runs with" in out

    storage = f"sqlite:///{folder / 'study.db'}"
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    trials = {t.params["method"]: t for t in optuna.load_study(study_name=name, storage=storage).get_trials()}
    assert {t.state for t in trials.values()} == {TrialState.COMPLETE}
    objective = Objective("accuracy_at", budget=10.0)
    for method, trial in trials.items():
        metrics = json.loads((folder / trial.user_attrs["folder"] / "metrics.json").read_text())
        why = ended_early(objective, metrics)
        assert (why is None) == (trial.user_attrs["ended_early"] is None), method  # reached, or marked
        if why is not None:
            assert f"  trial {trial.number} (method={method}): {why}" in out, out[-3000:]
    fedbuff = json.loads((folder / trials["fedbuff"].user_attrs["folder"] / "metrics.json").read_text())
    assert fedbuff["config"]["federation"]["max_model_version"] == LIFTED_VERSION_CAP
    assert fedbuff["config"]["federation"]["max_sim_time"] == 10.0 and "--max-sim-time" in fedbuff["outcome"]["reason"]
    assert fedbuff["outcome"]["version"] > 10 and trials["fedbuff"].user_attrs["ended_early"] is None
    assert "--max-model-version 1000000 --max-sim-time 10.0" in trials["fedbuff"].user_attrs["command"]
    fedavg = trials["fedavg"].user_attrs["ended_early"]
    assert fedavg.startswith("ended at ") and fedavg.endswith("(completed: version 2 (--max-model-version))")
    status = {line.split()[0]: line.split()[1] for line in out.splitlines() if line[:1].isdigit()}
    assert status == {str(trials["fedbuff"].number): "complete", str(trials["fedavg"].number): "complete!"}
    assert (folder / "curves.png").stat().st_size > 0 and (folder / "bands.png").stat().st_size > 0

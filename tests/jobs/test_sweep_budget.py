"""A sweep's budget holds: when the objective is read at a simulated-time budget, or the spec gives max-sim-time,
the default version cap is lifted so that no trial ends before the budget; a budget no trial can reach is refused
in one line; a trial that ended before its budget anyway (a cap the spec gives, a stop) is marked with why in the
table and the best line; the plots carry a legend of method and trial and the budget line; the docs' example spec
is one the sweep accepts."""

from __future__ import annotations

import os
import re

import pytest
from optuna.trial import TrialState

from jobs.sweep.objective import ended_early, run_budget
from jobs.sweep.report import format_report, write_plots
from jobs.sweep.runner import Sweep, SweepOptions
from jobs.sweep.spec import LIFTED_VERSION_CAP, Objective, budget_note, check_flags, parse_spec
from tests.conftest import REPO
from tests.fakes.sweep import BudgetFake, refused_before_any_trial, reset

BASE = """
base:
  num-leaf-nodes: 2
  devices-per-leaf: 4
  device-selection-size: 4
  delays: paper
"""
METHODS = BASE + "grid: {method: [fedbuff, fedavg]}\n"
AT_10 = "objective: {metric: accuracy_at, budget: 10}\n"


def test_a_budget_lifts_the_default_version_cap_and_ends_each_trial_at_it():
    spec = parse_spec(METHODS + AT_10, "b")
    for cell in spec.cells():
        flags = spec.trial_flags(cell)
        assert flags["max-model-version"] == LIFTED_VERSION_CAP and flags["max-sim-time"] == 10.0
    check_flags(spec)  # every trial builds with them
    assert budget_note(spec) == (
        f"budget 10 simulated s: every trial runs with --max-model-version {LIFTED_VERSION_CAP} --max-sim-time 10, "
        "so the budget, not a version count, ends it"
    )
    # a max-sim-time of the spec's own (any objective) is the budget that ends the trial: only the cap is lifted
    for objective in (AT_10, "objective: final_accuracy\n", "objective: {metric: time_to_target, target: 0.5}\n"):
        spec = parse_spec(METHODS.replace("delays: paper", "delays: paper\n  max-sim-time: 12") + objective, "b")
        assert spec.trial_flags({"method": "fedbuff"})["max-model-version"] == LIFTED_VERSION_CAP
        assert spec.trial_flags({"method": "fedbuff"})["max-sim-time"] == 12
    # no budget: nothing is added, the job's own cap applies
    assert "max-model-version" not in parse_spec(METHODS + "objective: final_accuracy\n", "b").trial_flags({})
    assert budget_note(parse_spec(METHODS + "objective: final_accuracy\n", "b")) == ""
    # a cap the spec gives is kept (a trial it ends early is marked)
    kept = parse_spec(METHODS + "when: {method: {fedbuff: {max-model-version: 10}}}\n" + AT_10, "b")
    assert kept.trial_flags({"method": "fedbuff"})["max-model-version"] == 10
    assert "max-sim-time" not in kept.trial_flags({"method": "fedbuff"})
    assert budget_note(kept) == (
        f"budget 10 simulated s: a trial whose flags set no max-model-version runs with --max-model-version "
        f"{LIFTED_VERSION_CAP} --max-sim-time 10; the spec's own max-model-version is kept, and a trial it ends "
        "before the budget is marked !"
    )


@pytest.mark.parametrize(
    "text, fix",
    [
        (
            METHODS.replace("delays: paper", "delays: paper\n  max-sim-time: 5") + AT_10,
            "max-sim-time 5 ends every trial before the objective's budget of 10 simulated s",
        ),
        (
            BASE.replace("delays: paper", "delays: none") + "grid: {method: [fedavg]}\n" + AT_10,
            "every update arrives at simulated time 0 and no budget of simulated time is ever reached",
        ),
    ],
)
def test_a_budget_no_trial_can_reach_is_refused_in_one_line(tmp_path, capsys, text, fix):
    err = refused_before_any_trial(tmp_path, capsys, text)
    assert fix in err, err


def test_a_run_that_ended_before_its_budget_is_said_so_with_why():
    at = Objective("accuracy_at", budget=10.0)
    config = {"method": "fedbuff", "federation": {"max_model_version": 10, "max_sim_time": 10.0}}
    capped = {"status": "completed", "reason": "version 10 (--max-model-version)", "version": 10, "sim_seconds": 2.657}
    timed = {"status": "completed", "reason": "simulated time 9.652 (--max-sim-time 10)", "version": 3}
    versions = [
        {"version": 1, "accuracy": 0.1, "sim_seconds": 0.0},
        {"version": 3, "accuracy": 0.2, "sim_seconds": 6.7},
    ]
    # the FedBuff trial: its version cap ended it at 2.657 simulated s
    assert ended_early(at, {"config": config, "versions": versions, "outcome": capped}) == (
        "ended at 2.657 simulated s, before the budget 10 s (completed: version 10 (--max-model-version))"
    )
    # the FedAvg trial: its max-sim-time ended it, after its last version at 6.7 s: it used the budget
    assert ended_early(at, {"config": config, "versions": versions, "outcome": timed | {"sim_seconds": 9.652}}) is None
    # a cap reached after the budget, a run not ended yet, a run with no budget: nothing to say
    assert ended_early(at, {"config": config, "versions": versions, "outcome": capped | {"sim_seconds": 12.0}}) is None
    assert ended_early(at, {"config": config, "versions": versions}) is None
    plain = {"federation": {"max_model_version": 10, "max_sim_time": None}}
    assert run_budget(Objective("final_accuracy"), {"config": plain}) is None
    # another objective: the run's own max-sim-time is its budget; a stop before it is said so, from the records
    stopped = {"status": "stopped", "reason": "no device left to select at version 3", "version": 3}
    final = Objective("final_accuracy")
    assert run_budget(final, {"config": config}) == 10.0
    assert ended_early(final, {"config": config, "versions": versions, "outcome": stopped}) == (
        "ended at 6.7 simulated s, before the budget 10 s (stopped: no device left to select at version 3)"
    )


def test_the_report_and_plots_mark_early_trials_and_show_methods_and_the_budget(tmp_path, monkeypatch):
    """A method grid read at 10 simulated s, FedBuff with the spec's own cap of 3 versions (made by 4 s): FedAvg's
    trial runs to the budget (the cap lifted), FedBuff's is marked in the table and the best line; the curves'
    legend names each trial's method and number, and both plots draw the budget."""
    reset()
    text = METHODS + "when: {method: {fedbuff: {max-model-version: 3}}}\n" + AT_10
    spec = parse_spec(text, "b")
    opts = SweepOptions(output=str(tmp_path / "sweep"), parallel=2, poll_seconds=0.0, bar=False, pruner="none")
    sweep = Sweep(spec, opts, BudgetFake)
    sweep.prepare()
    assert sweep.run() == 0
    trials = {t.params["method"]: t for t in sweep.study.get_trials(states=(TrialState.COMPLETE,))}
    assert trials["fedavg"].user_attrs["ended_early"] is None and trials["fedavg"].user_attrs["sim_seconds"] == 10.0
    why = trials["fedbuff"].user_attrs["ended_early"]
    assert why == "ended at 4 simulated s, before the budget 10 s (completed: version 3 (--max-model-version))"
    report = format_report(sweep.study, sweep.folder, "accuracy at 10 simulated s")
    rows = {line.split()[0]: line for line in report.splitlines() if re.match(r"^\d+ ", line)}
    assert rows[str(trials["fedbuff"].number)].split()[1] == "complete!"
    assert rows[str(trials["fedavg"].number)].split()[1] == "complete"
    assert f"  trial {trials['fedbuff'].number} (method=fedbuff): {why}" in report
    best = f"best: trial {trials['fedbuff'].number}, accuracy at 10 simulated s"  # 0.9 (lr 1e-2) in both: the first
    assert any(line.startswith(best) and "ended before its budget" in line for line in report.splitlines()), report

    figures = {}
    monkeypatch.setattr("jobs.sweep.report._save", lambda fig, folder, name: figures.setdefault(name, fig) and name)
    write_plots(sweep.study, sweep.folder, spec)
    curves = figures["curves.png"].axes[0]
    labels = [t.get_text() for t in curves.get_legend().get_texts()]
    assert sorted(labels) == sorted(
        [f"fedavg #{trials['fedavg'].number}", f"fedbuff #{trials['fedbuff'].number} ended early", "budget 10 s"]
    )
    for name in ("curves.png", "bands.png"):
        lines = figures[name].axes[0].get_lines()
        assert any(list(line.get_xdata()) == [10.0, 10.0] for line in lines), name  # the budget's vertical line


def test_the_docs_example_spec_is_one_the_sweep_accepts_and_its_trials_reach_the_budget():
    text = open(os.path.join(REPO, "docs", "sweeps.md")).read()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    spec = parse_spec(example, "example")
    check_flags(spec)
    assert spec.objective.metric == "accuracy_at"
    for cell in spec.cells():
        flags = spec.trial_flags(cell, spec.repeats()[0])
        assert flags["max-model-version"] == LIFTED_VERSION_CAP and flags["max-sim-time"] >= spec.objective.budget

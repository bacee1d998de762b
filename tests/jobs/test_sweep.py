"""Sweeps without NVFlare: the spec and its refusals (one line, exit 2, before any trial), the objective on
simulated time, and the study's resume logic with a fake trial runner (a dead sweep's running trials failed and
queued again; every planned trial finished exactly once)."""

from __future__ import annotations

import math
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from common.config_flags import flag_args
from jobs.sweep import study as studies
from jobs.sweep.cli import main
from jobs.sweep.objective import final_steps, score
from jobs.sweep.report import cell_summary
from jobs.sweep.runner import Sweep, SweepOptions, plan_parallel
from jobs.sweep.spec import Objective, SpecError, check_flags, parse_spec
from tests.fakes.sweep import BASE, ONE_SEED, STARTED, FakeTrial, refused_before_any_trial, reset, write_spec

SPEC = (
    BASE
    + """
grid:
  method: [fedavg, fedbuff]
search:
  local-lr: {type: log-float, low: 1.0e-4, high: 1.0}
  local-iters: {type: int, low: 1, high: 4}
objective: {metric: accuracy_at, budget: 10, step: 2}
trials: 5
"""
)


def test_a_spec_names_flags_cells_slots_and_the_objective():
    spec = parse_spec(SPEC, "lr")
    assert spec.base == {"num-leaf-nodes": 2, "devices-per-leaf": 4, "device-selection-size": 4, "max-model-version": 5}
    assert spec.cells() == [{"method": "fedavg"}, {"method": "fedbuff"}]
    assert [s["method"] for s in spec.slots()] == ["fedavg", "fedbuff", "fedavg", "fedbuff", "fedavg"]
    assert [(p.name, p.type) for p in spec.search] == [("local-lr", "log-float"), ("local-iters", "int")]
    assert spec.objective == Objective("accuracy_at", 10.0, None, 2.0) and spec.objective.direction == "maximize"
    assert (
        spec.study_name
        == parse_spec(SPEC, "lr").study_name
        != parse_spec(SPEC.replace("1.0}", "0.5}"), "lr").study_name
    )
    check_flags(spec)  # every cell at both ends of each range builds a JobConfig


def test_a_grid_alone_runs_each_cell_once_and_flags_are_exact_words():
    spec = parse_spec(BASE + "grid: {method: [fedavg], seed: [1, 2, 3]}\n", "g")
    assert spec.trials == 3 and [s["seed"] for s in spec.slots()] == [1, 2, 3]
    assert flag_args({"local-lr": 0.1 + 0.2, "augment": True, "speed-means": [1, 1.3]}) == [
        "--local-lr",
        "0.30000000000000004",  # repr: the command reads back the very float the trial ran
        "--augment",
        "--speed-means",
        "1,1.3",
    ]


@pytest.mark.parametrize(
    "text, fix",
    [
        (BASE + "grid: {lerning-rate: [0.1]}\n", "unknown flag --lerning-rate"),
        (BASE + "search: {}\n", "search is empty"),
        (BASE + "search: {local-lr: {type: float, low: 1, high: 0.1}}\n", "low 1 must be below high 0.1"),
        (BASE + "search: {local-lr: {type: log-float, low: 0, high: 1}}\n", "above 0"),
        (BASE + "search: {optimizer: {type: choice, values: []}}\n", "non-empty list"),
        (BASE + "grid: {seed: []}\n", "grid.seed is empty"),
        (BASE + "objective: {metric: accuracy_at}\n", "needs budget"),
        (BASE + "grid: {local-iters: [0]}\n", "--local-iters"),
        (BASE + "grid: {output: [x]}\n", "the sweep sets these itself"),
        ("base: [1, 2\n", "not valid YAML"),
    ],
)
def test_bad_specs_are_refused_in_one_line_naming_the_fix(tmp_path, capsys, text, fix):
    err = refused_before_any_trial(tmp_path, capsys, text)
    assert fix in err, err


def test_the_api_runs_the_same_command(tmp_path, capsys):
    from jobs.api import sweep

    assert sweep(write_spec(tmp_path), output=str(tmp_path / "sweep"), parallel=0, bar=False) == 2
    assert "--parallel 0: 1 or more" in capsys.readouterr().err


def test_a_storage_that_cannot_be_opened_is_refused_before_any_trial(tmp_path, capsys):
    err = refused_before_any_trial(tmp_path, capsys, ONE_SEED, "--storage", "nosuchdb://x/y")
    assert "--storage nosuchdb://x/y: cannot open it" in err, err


def test_the_objective_reads_accuracy_on_simulated_time():
    records = [
        {"version": 1, "accuracy": 0.1, "sim_seconds": 0.0},
        {"version": 2, "accuracy": 0.3, "sim_seconds": 3.5},
        {"version": 3, "accuracy": 0.5, "sim_seconds": 7.0},
    ]
    assert score(Objective("final_accuracy"), records) == 0.5
    assert score(Objective("accuracy_at", budget=5.0), records) == 0.3
    assert score(Objective("time_to_target", target=0.3), records) == 3.5
    assert score(Objective("time_to_target", target=0.9), records) == math.inf
    # steps of 2 simulated seconds: each step holds the newest version made by then; the newest version's own
    # step (3: 6-8 s) waits, a later version may still land in it
    assert final_steps(Objective("final_accuracy", step=2.0), records, -1) == [(0, 0.1), (1, 0.1), (2, 0.3)]
    assert final_steps(Objective("final_accuracy", step=2.0), records, 1) == [(2, 0.3)]
    minimise = final_steps(Objective("time_to_target", target=0.9, step=2.0), records, 1)
    assert minimise == [(2, pytest.approx(0.7))]  # the shortfall, so lower is better for the pruner too


def test_parallel_trials_are_planned_from_the_cores_and_each_trials_leaves(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1, 2, 3, 4, 5, 6, 7})
    spec = parse_spec(BASE + "grid: {seed: [1]}\n", "p")
    assert plan_parallel(spec, None)[:2] == (4, 2)  # 2 leaves a trial, one core each
    assert plan_parallel(spec, 8)[:2] == (8, 1)


class Killed(BaseException):
    """The sweep's process dies (SIGKILL): nothing of it runs any more, its trials stay RUNNING in the study."""


def six_trial_sweep(tmp_path, name: str) -> tuple:
    """A search of 6 trials, 2 at once, polled without pause and never pruned: its spec and options."""
    spec = parse_spec(BASE + "search: {local-lr: {type: log-float, low: 1.0e-4, high: 1.0}}\ntrials: 6\n", name)
    return spec, SweepOptions(output=str(tmp_path / "sweep"), parallel=2, poll_seconds=0.0, bar=False, pruner="none")


def dead_sweep_owner() -> dict:
    """The owner stamp of a sweep of this machine that is no longer alive (a pid that has exited)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return {"host": studies.socket.gethostname(), "sweep_pid": int(dead.stdout)}


def killed_sweep(spec, opts, monkeypatch, launch=FakeTrial) -> Sweep:
    """A sweep run until ``Killed`` is raised in it, with none of its clean-up (as SIGKILL); its folder unlocked."""
    first = Sweep(spec, opts, launch=launch)
    first.prepare()
    monkeypatch.setattr(first, "_stop_all", lambda: None)  # SIGKILL: no clean-up runs
    with pytest.raises(Killed):
        first.run()
    first.lock.close()
    return first


def test_a_killed_sweep_continues_every_trial_exactly_once(tmp_path, monkeypatch, capsys):
    spec, opts = six_trial_sweep(tmp_path, "r")
    owner = dead_sweep_owner()
    monkeypatch.setattr(studies, "owner_attrs", lambda: owner)
    reset()

    def dies_on_the_fourth(flags, folder, cores):
        if len(STARTED) == 3:
            raise Killed
        return FakeTrial(flags, folder, cores)

    first = killed_sweep(spec, opts, monkeypatch, launch=dies_on_the_fourth)
    running = first.study.get_trials(states=(TrialState.RUNNING,))
    assert running, "the kill came with trials running"

    second = Sweep(spec, opts, launch=FakeTrial)
    second.prepare()
    assert second.run() == 0
    trials = second.study.get_trials()
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["slot"] for t in done) == list(range(6))  # every planned trial exactly once
    failed = {t.number: t for t in trials if t.state == TrialState.FAIL}
    assert set(failed) == {t.number for t in running}
    for t in done:  # a trial queued again ran with the failed one's values
        if "requeued_from" in t.user_attrs:
            assert t.params == failed[t.user_attrs["requeued_from"]].params
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    best = studies.best_trial(second.study)
    assert best.value == max(t.value for t in done) and "--local-lr" in best.user_attrs["command"]
    second.lock.close()

    capsys.readouterr()
    assert main(["show", str(tmp_path / "sweep")]) == 0  # the table and the best command, again
    shown = capsys.readouterr().out
    assert f"best: trial {best.number}" in shown and best.user_attrs["command"] in shown
    assert shown.count("complete*") >= 1 and "(* queued again after an interrupted sweep)" in shown
    assert (tmp_path / "sweep" / "history.png").exists()


def test_a_sweep_continued_at_once_waits_for_a_trial_taken_but_never_stamped(tmp_path, monkeypatch, capsys):
    # the e2e sweep test's loss: SIGKILLed between study.ask() and the stamp, the first sweep left slot 3 RUNNING with
    # no owner; the second, started within the grace, ran every other slot and exited 0 without it
    spec, opts = six_trial_sweep(tmp_path, "u")
    owner = dead_sweep_owner()
    stamps = []

    def stamp_then_die_before_the_fourth():
        if len(stamps) == 3:
            raise Killed
        stamps.append(1)
        return owner

    monkeypatch.setattr(studies, "owner_attrs", stamp_then_die_before_the_fourth)
    monkeypatch.setattr(studies, "UNCLAIMED_GRACE_S", 1.0)  # the test's grace; a sweep's is 60 s
    reset()
    first = killed_sweep(spec, opts, monkeypatch)
    (unstamped,) = studies.unclaimed(first.study)
    monkeypatch.undo()
    monkeypatch.setattr(studies, "UNCLAIMED_GRACE_S", 1.0)

    second = Sweep(spec, opts, launch=FakeTrial)
    second.prepare()
    assert second.run() == 0
    trials = second.study.get_trials()
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["slot"] for t in done) == list(range(6)), [(t.number, t.state) for t in trials]
    assert trials[unstamped].state == TrialState.FAIL
    assert [t for t in done if t.user_attrs.get("requeued_from") == unstamped]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert f"trial(s) {unstamped} were running, marked failed, queued again" in capsys.readouterr().out
    second.lock.close()


def test_a_trial_taken_but_never_stamped_is_queued_again_after_the_grace(tmp_path):
    # a sweep SIGKILLed between study.ask() and stamping the trial with its owner leaves a RUNNING trial with
    # no owner: its slot must run again (the e2e sweep test once ended with such a trial RUNNING and its slot lost)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", direction="maximize")
    study.enqueue_trial({"x": 1.0}, user_attrs={"slot": 3})
    taken = study.ask()
    started = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))[0].datetime_start
    soon = started + studies.datetime.timedelta(seconds=1)
    assert studies.requeue_orphans(study, now=soon) == []  # it may be being stamped right now
    later = started + studies.datetime.timedelta(seconds=studies.UNCLAIMED_GRACE_S + 1)
    assert studies.requeue_orphans(study, now=later) == [taken.number]
    assert study.get_trials(deepcopy=False)[taken.number].state == TrialState.FAIL
    (queued,) = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert queued.user_attrs == {"slot": 3, "requeued_from": taken.number}
    stamped = study.ask()  # the same values again; stamped by a live sweep of this machine, left alone however old
    assert stamped.suggest_float("x", 0.0, 2.0) == 1.0
    for key, value in studies.owner_attrs().items():
        stamped.set_user_attr(key, value)
    assert studies.requeue_orphans(study, now=later + studies.datetime.timedelta(hours=1)) == []


def test_a_continued_search_draws_new_values_not_the_first_sweeps_again(tmp_path):
    # seeded as the first sweep was, a continued search's sampler drew that sweep's first values again: the e2e
    # sweep once ran two trials with the same command, one before and one after its kill
    spec = parse_spec(BASE + "search: {local-lr: {type: float, low: 0.0, high: 1.0}}\ntrials: 4\n", "s")
    storage = f"sqlite:///{tmp_path / 'study.db'}"

    def draws(n: int) -> list[float]:
        study = studies.open_study(spec, storage, optuna.pruners.NopPruner(), seed=5)
        values = []
        for _ in range(n):
            trial = study.ask()
            values.append(trial.suggest_float("local-lr", 0.0, 1.0))
            study.tell(trial, 0.5)
        return values

    first = draws(2)
    fresh = optuna.create_study(sampler=studies.make_sampler(spec, 5), direction="maximize")
    assert first == [fresh.ask().suggest_float("local-lr", 0.0, 1.0) for _ in range(2)]  # a new study: the seed's
    again = draws(2)
    assert not set(again) & set(first), (first, again)


def test_two_sweeps_never_share_a_folder(tmp_path):
    spec = parse_spec(BASE + "grid: {seed: [1]}\n", "a")
    opts = SweepOptions(output=str(tmp_path / "sweep"), bar=False)
    first = Sweep(spec, opts)
    first.prepare()
    with pytest.raises(SpecError, match="in use by another sweep"):
        Sweep(spec, opts).prepare()
    first.lock.close()
    with pytest.raises(SpecError, match="holds another sweep"):
        Sweep(parse_spec(BASE + "grid: {seed: [2]}\n", "a"), opts).prepare()


def test_pruners_are_patient_and_steps_are_simulated_seconds():
    spec = parse_spec(BASE + "grid: {seed: [1]}\nobjective: {metric: accuracy_at, budget: 20, step: 2}\n", "p")
    assert studies.pruning_steps(spec, 5.0) == (3, 10)
    for kind, inner in (("hyperband", optuna.pruners.HyperbandPruner), ("median", optuna.pruners.MedianPruner)):
        assert isinstance(studies.make_pruner(kind, 3, 2, 10), optuna.pruners.PatientPruner)
        assert isinstance(studies.make_pruner(kind, 3, 0, 10), inner)  # patience 0: the rule alone


def test_a_grid_over_seeds_shows_mean_and_std_per_cell(tmp_path, capsys):
    spec = parse_spec(BASE + "grid: {method: [fedavg, fedbuff], seed: [1, 2], local-lr: [0.01, 0.1]}\n", "g")
    sweep = Sweep(
        spec, SweepOptions(output=str(tmp_path / "sweep"), parallel=3, poll_seconds=0.0, bar=False), FakeTrial
    )
    sweep.prepare()
    assert sweep.run() == 0
    cells = cell_summary(sweep.study)
    assert "local-lr=0.01, method=fedavg: 0.9000 +- 0.0000 over 2 seeds" in cells, cells
    assert "local-lr=0.1, method=fedbuff: 0.6500 +- 0.0000 over 2 seeds" in cells, cells


def test_a_pruned_run_keeps_its_last_version_and_says_why(tmp_path):
    from common.jsonio import write_json_atomic
    from evaluation.run_recorder import record_pruned

    interrupted = {"status": "interrupted", "reason": "SIGTERM before the run's end", "signal": "SIGTERM", "version": 4}
    write_json_atomic(str(tmp_path / "metrics.json"), {"versions": [{"version": 3}], "outcome": interrupted})
    metrics = record_pruned(str(tmp_path), "pruned by the sweep at 6 simulated seconds")
    assert metrics["outcome"] == {
        "status": "pruned",
        "reason": "pruned by the sweep at 6 simulated seconds",
        "version": 4,
    }
    assert record_pruned(str(tmp_path / "none"), "x") == {}


def test_a_second_spec_or_a_missing_folder_is_refused(tmp_path, capsys):
    path = write_spec(tmp_path)
    assert main([path, path]) == 2
    assert "a sweep takes one spec" in capsys.readouterr().err
    assert main(["show", str(tmp_path)]) == 2
    assert "holds no sweep (no spec.yaml)" in capsys.readouterr().err

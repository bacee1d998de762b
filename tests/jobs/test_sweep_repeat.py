"""Sweeps without NVFlare, continued: a candidate repeated over seeds (its runs packed, its objective and pruning
on their mean), flags added ``when`` a flag takes a value, ``--tensorboard`` read back with TensorBoard's own event
reader, and the remaining refusals."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from jobs.sweep.objective import mean_score, mean_steps
from jobs.sweep.report import format_report
from jobs.sweep.runner import Sweep, SweepOptions
from jobs.sweep.spec import Objective, SpecError, check_flags, parse_spec
from tests.fakes.sweep import BASE, ONE_SEED, PEAK, STOPPED, SeededFake, refused_before_any_trial, reset


@pytest.fixture(autouse=True)
def _fresh():
    reset()


def test_a_repeat_runs_each_candidate_once_per_seed_and_flags_come_when_called_for():
    spec = parse_spec(
        BASE
        + "grid: {method: [fedavg, fedbuff]}\nrepeat: {seed: [0, 1, 2]}\n"
        + "when: {method: {fedavg: {eval-frequency: 1}}}\n"
        + "search: {local-lr: {type: log-float, low: 1.0e-4, high: 1.0}}\ntrials: 4\n",
        "r",
    )
    assert spec.repeats() == [{"seed": 0}, {"seed": 1}, {"seed": 2}] and len(spec.slots()) == 4
    assert spec.trial_flags({"method": "fedavg", "local-lr": 0.1}, {"seed": 2})["eval-frequency"] == 1
    assert "eval-frequency" not in spec.trial_flags({"method": "fedbuff", "local-lr": 0.1}, {"seed": 2})
    # when overrides the base: the cpu table's synchronous method evaluates every version, the others every 10
    over = parse_spec(
        BASE + "  eval-frequency: 10\ngrid: {method: [fedavg]}\nwhen: {method: {fedavg: {eval-frequency: 1}}}\n", "o"
    )
    assert over.trial_flags({"method": "fedavg"})["eval-frequency"] == 1
    check_flags(spec)
    assert spec.digest != parse_spec(spec.text.replace("[0, 1, 2]", "[0, 1]"), "r").digest


def test_a_candidates_steps_and_score_are_the_mean_over_its_runs():
    o = Objective("final_accuracy", step=2.0)
    a = [{"version": 1, "accuracy": 0.2, "sim_seconds": 0.0}, {"version": 2, "accuracy": 0.4, "sim_seconds": 5.0}]
    b = [{"version": 1, "accuracy": 0.4, "sim_seconds": 0.0}, {"version": 2, "accuracy": 0.6, "sim_seconds": 3.0}]
    # a is final up to its step 2 (4-6 s), b up to its step 1: the candidate, up to step 0 only
    assert mean_steps(o, [(a, False), (b, False)], -1) == [(0, pytest.approx(0.3))]
    # b has ended: its last value holds, so a's horizon decides (steps 0, 1)
    assert mean_steps(o, [(a, False), (b, True)], -1) == [(0, pytest.approx(0.3)), (1, pytest.approx(0.3))]
    assert mean_steps(o, [(a, False), ([], False)], -1) == []  # a run not started holds the reports back
    assert mean_steps(o, [(a, True), (b, True)], -1) == []  # all ended: the score is told instead
    assert mean_score(o, [a, b]) == pytest.approx(0.5)
    assert mean_score(o, [a, []]) is None


def test_seeds_are_packed_scored_on_their_mean_and_a_pruned_candidate_stops_them_all(tmp_path, capsys):
    # three candidates x two seeds, two processes at once, each seed its own job (--pack 1); the median rule prunes
    # the third (a hopeless lr) on the mean of its seeds, once the first two are complete
    spec = parse_spec(BASE + "grid: {local-lr: [0.01, 0.011, 1.0e-5]}\nrepeat: {seed: [1, 2]}\n", "p")
    opts = SweepOptions(
        output=str(tmp_path / "sweep"), parallel=2, poll_seconds=0.0, bar=False, pruner="median", pack=1
    )
    sweep = Sweep(spec, opts, launch=SeededFake)
    sweep.prepare()
    assert sweep.run() == 0
    assert PEAK[0] == 2  # packed: both slots busy, never more
    trials = sweep.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    assert trials[0].value == pytest.approx((0.91 + 0.92) / 2) and trials[0].user_attrs["values"] == [0.91, 0.92]
    runs = trials[0].user_attrs["runs"]
    assert [r["folder"] for r in runs] == ["trials/0000-seed1", "trials/0000-seed2"]
    assert all("--seed" in r["command"] and r["exit_code"] == 0 for r in runs)
    assert {f["seed"] for f in STOPPED} == {1, 2} and all(f["local-lr"] == 1e-5 for f in STOPPED)
    shown = format_report(sweep.study, sweep.folder, "final accuracy")
    assert "reproduce its 2 runs (their mean) with:" in shown and runs[1]["command"] in shown
    assert "0.9150 +- 0.0071 over 2 runs (seed)" in shown, shown
    sweep.lock.close()


def test_tensorboard_holds_every_trials_curve_and_hparams(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    spec = parse_spec(
        BASE
        + "grid: {method: [fedavg, fedbuff]}\nsearch: {local-lr: {type: log-float, low: 1.0e-3, high: 0.1}}\ntrials: 3\n",
        "t",
    )
    opts = SweepOptions(
        output=str(tmp_path / "sweep"), parallel=2, poll_seconds=0.0, bar=False, pruner="none", tensorboard=""
    )
    sweep = Sweep(spec, opts, launch=SeededFake)
    sweep.prepare()
    assert sweep.run() == 0
    sweep.lock.close()
    logdir = tmp_path / "sweep" / "tensorboard"
    assert sorted(p.name for p in logdir.iterdir()) == ["0000", "0001", "0002"]
    for t in sweep.study.get_trials():
        acc = EventAccumulator(str(logdir / f"{t.number:04d}")).Reload()
        assert [(e.step, round(e.value, 4)) for e in acc.Scalars("accuracy")] == [
            (v + 1, round(SeededFake(t.params, "", None).accuracy * v / 2, 4)) for v in range(3)
        ]
        assert [e.step for e in acc.Scalars("accuracy_vs_sim_ms")] == [0, 4000, 8000]
        assert acc.Scalars("sweep/objective")[0].value == pytest.approx(t.value)
        content = acc.PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        hp = start.session_start_info.hparams
        assert hp["method"].string_value == t.params["method"]
        assert hp["local-lr"].number_value == pytest.approx(t.params["local-lr"])
        assert hp["status"].string_value == "complete"
        exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        assert {m.name.tag for m in exp.metric_infos} == {"sweep/objective", "sweep/run_objective"}
        method = next(h for h in exp.hparam_infos if h.name == "method")
        assert [v.string_value for v in method.domain_discrete.values] == ["fedavg", "fedbuff"]


@pytest.mark.parametrize(
    "text, args, fix",
    [
        (BASE + "grid: {seed: [1]}\n", ["--patience", "-1"], "--min-resource and --patience: 0 or more"),
        (BASE + "grid: {seed: [1]}\n", ["--min-resource", "-2"], "--min-resource and --patience: 0 or more"),
        (BASE + "grid: {seed: [1]}\nseeds: 3\n", [], "unknown spec key(s) seeds"),
        (BASE + "search: {local-lr: {type: normal, low: 0, high: 1}}\n", [], "type 'normal' is not one of"),
        (BASE + "search: {local-lr: {type: float, low: 0.1, high: 1}}\ntrials: 0\n", [], "whole number of trials"),
        (BASE + "grid: {seed: [1]}\nrepeat: {seed: [1, 2]}\n", [], "seed given twice"),
        (BASE + "grid: {method: [fedavg]}\nrepeat: {}\n", [], "repeat is empty"),
        (BASE + "grid: {method: [fedavg]}\nwhen: {optimizr: {sgd: {local-lr: 1}}}\n", [], "when.optimizr"),
        (BASE + "grid: {method: [fedavg], seed: [1]}\nwhen: {method: {fedavg: {seed: 2}}}\n", [], "when adds seed"),
        (BASE + "grid: {method: [fedavg]}\nwhen: {method: {fedavg: {eval-frequncy: 1}}}\n", [], "--eval-frequncy"),
        (BASE + "grid: {method: [fedavg]}\nrepeat: {local-iters: [1, 0]}\n", [], "local-iters=0"),
    ],
)
def test_more_bad_input_is_refused_in_one_line_before_any_trial(tmp_path, capsys, text, args, fix):
    err = refused_before_any_trial(tmp_path, capsys, text, *args)
    assert fix in err, err


def test_a_when_flag_is_refused_where_it_cannot_apply():
    with pytest.raises(SpecError, match="when: give"):
        parse_spec(BASE + "grid: {method: [fedavg]}\nwhen: {method: [1]}\n", "w")


def test_a_deployment_trials_curve_is_read_from_its_progress_lines_until_its_results_come_home(tmp_path):
    from jobs.sweep.trial import TrialProcess

    log = tmp_path / "0000.log"
    log.write_text(
        "[edgesim] job abc: RUNNING\n"
        "[edgesim] version 1/6 | accuracy 0.1000 | 3.2 s since start | simulated 0.0 s | 1.00 s/version\n"
        "[edgesim] version 2/6 | accuracy 0.2500 | 6.0 s since start | simulated 4.5 s | 1.00 s/version\n"
        "[edgesim] version 2/6 | accuracy 0.2500 | 6.0 s since start | simulated 4.5 s | 1.00 s/version\n"
    )
    proc = TrialProcess.__new__(TrialProcess)  # its reading only: no process
    proc.folder, proc.live_log = str(tmp_path / "0000"), True
    assert [(r["version"], r["accuracy"], r["sim_seconds"]) for r in proc.records()] == [(1, 0.1, 0.0), (2, 0.25, 4.5)]
    (tmp_path / "0000").mkdir()
    (tmp_path / "0000" / "metrics.json").write_text('{"versions": [{"version": 1, "accuracy": 0.125}]}')
    assert proc.records() == [{"version": 1, "accuracy": 0.125}]  # home: the full record wins


def test_a_deployment_that_is_not_up_is_refused_before_any_trial(tmp_path, capsys):
    err = refused_before_any_trial(tmp_path, capsys, ONE_SEED, "--deployment", str(tmp_path / "nope"))
    assert err.startswith(f"error: --deployment {tmp_path / 'nope'}: ") and "not an admin's startup kit" in err, err


@pytest.mark.parametrize("patience, pruned", [(0, True), (2, False)])
def test_patience_spares_a_low_curve_while_it_still_improves(patience, pruned):
    """``--pruner median --patience N``: the median rule prunes a low curve at once; wrapped in ``PatientPruner``,
    not while its last N + 1 values still improve on its earlier best."""
    import optuna

    from jobs.sweep import study as studies

    study = optuna.create_study(direction="maximize", pruner=studies.make_pruner("median", 0, patience, None))
    for _ in range(2):  # two complete trials well above
        t = study.ask()
        for step in range(4):
            t.report(0.8 + 0.01 * step, step)
        study.tell(t, 0.83)
    low = study.ask()
    decisions = []
    for step in range(4):  # below the median at every step, yet improving
        low.report(0.1 + 0.05 * step, step)
        decisions.append(low.should_prune())
    assert any(decisions) is pruned, decisions


def test_the_api_passes_a_switch_as_a_flag_alone(tmp_path, monkeypatch):
    import jobs.sweep.cli as cli
    from jobs.api import sweep

    seen = []
    monkeypatch.setattr(cli, "main", lambda argv: seen.append(argv) or 0)
    assert sweep("s.yaml", tensorboard=True, bar=False, deployment="/d") == 0
    assert sweep("s.yaml", tensorboard=str(tmp_path)) == 0
    assert seen == [
        ["s.yaml", "--tensorboard", "--no-bar", "--deployment", "/d"],
        ["s.yaml", "--tensorboard", str(tmp_path)],
    ]

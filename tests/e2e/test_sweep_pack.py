"""A real sweep whose candidate repeats two seeds (``docs/sweeps.md``): by default its seeds run as ONE job (the job
script's ``--seeds``, ``jobs.sweep.pack``), each seed's results in its run's folder (``trials/0000/seed-N``); with
``--pack 1`` each seed is a job of its own (``trials/0000-seedN``), as before packs. Each seed's ``events.jsonl``
is the same line for line both ways and its accuracies are the same bit for bit (a pack's run is its standalone
run: ``tests/e2e/test_pack.py``), so the candidate's objective is too. The two sweeps run at once (three jobs).
A sweep of three trials (three learning rates, no repeat) with ``--pack 2 --pack-queue 1`` runs them as one job
(the job script's ``--runs`` and ``--runs-at-once 2``): the third trial begins inside the running job when one of
the first two ends, and each trial's results are in its own folder with its job alone's events and, to summation
order, its accuracies."""

from __future__ import annotations

import json
import subprocess

import optuna
import pytest

from tests.conftest import PYTHON, REPO, outputs_when_done

pytestmark = pytest.mark.slow

SPEC = """
base:
  method: fedbuff
  num-leaf-nodes: 2
  devices-per-leaf: 4
  device-selection-size: 4
  delays: paper
  synthetic-size: 600
  subset-size: 40
  local-iters: 2
  local-batch-size: 16
  local-lr: 0.02
  global-lr: 1.0
  eval-backlog: wait
  num-updates-for-model: 2
  min-hole-to-fill: 1
  max-model-version: 6
  workspace: {ws}
repeat: {{seed: [3, 4]}}
objective: {{metric: final_accuracy}}
"""
SEEDS = (3, 4)


def sweep(spec, folder, *args: str) -> subprocess.Popen:
    cmd = [PYTHON, "-m", "jobs.sweep", str(spec), "--output", str(folder), "--no-bar", "--pruner", "none", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def accuracies(folder) -> list[tuple[int, float]]:
    versions = json.loads((folder / "metrics.json").read_text())["versions"]
    return [(v["version"], v["accuracy"]) for v in versions if v.get("accuracy") is not None]


def only_trial(folder) -> optuna.trial.FrozenTrial:
    names = optuna.study.get_all_study_names(f"sqlite:///{folder / 'study.db'}")
    (trial,) = optuna.load_study(study_name=names[0], storage=f"sqlite:///{folder / 'study.db'}").get_trials()
    return trial


def test_a_candidates_seeds_run_as_one_job_with_the_results_of_one_job_each(tmp_path):
    spec = tmp_path / "seeds.yaml"
    spec.write_text(SPEC.format(ws=tmp_path / "ws"))
    procs = [sweep(spec, tmp_path / "packed", "--parallel", "1"), sweep(spec, tmp_path / "apart", "--pack", "1")]
    outs = outputs_when_done(procs, 600)
    assert "[sweep] a candidate's 2 seeds run as one job of 2 runs" in outs[0], outs[0]
    packed, apart = tmp_path / "packed" / "trials", tmp_path / "apart" / "trials"
    assert sorted(p.name for p in packed.iterdir()) == ["0000", "0000.log"]  # one job, one log
    assert "a pack of 2 runs in one job" in (packed / "0000.log").read_text()
    assert sorted(p.name for p in apart.iterdir()) == ["0000-seed3", "0000-seed3.log", "0000-seed4", "0000-seed4.log"]
    for seed in SEEDS:
        mine, alone = packed / "0000" / f"seed-{seed}", apart / f"0000-seed{seed}"
        events = (mine / "events.jsonl").read_text().splitlines()
        assert len(events) == 10 and events == (alone / "events.jsonl").read_text().splitlines()
        assert len({a for _, a in accuracies(mine)}) > 1 and accuracies(mine) == accuracies(alone)
    one, other = only_trial(tmp_path / "packed"), only_trial(tmp_path / "apart")
    assert one.state == other.state == optuna.trial.TrialState.COMPLETE
    assert one.value == other.value and one.user_attrs["values"] == other.user_attrs["values"]
    assert [r["folder"] for r in one.user_attrs["runs"]] == ["trials/0000/seed-3", "trials/0000/seed-4"]
    assert [r["command"] for r in one.user_attrs["runs"]] == [r["command"] for r in other.user_attrs["runs"]]


TRIALS_SPEC = SPEC.replace("  local-lr: 0.02\n", "").replace(
    "repeat: {{seed: [3, 4]}}", "grid: {{local-lr: [0.02, 0.05, 0.03]}}"
)
# three trials of different learning rates in one job, two at a time, the third joining it when one ends: their
# devices train in shared groups, each at its own rate, so each trial's accuracies equal its job alone's only to
# summation order (tests/e2e/test_pack.py's tolerance)
ACCURACY_TOLERANCE = 0.03


def test_three_trials_packed_two_at_a_time_run_as_one_job_each_as_its_job_alone(tmp_path):
    spec = tmp_path / "trials.yaml"
    spec.write_text(TRIALS_SPEC.format(ws=tmp_path / "ws"))
    packed_sweep = sweep(spec, tmp_path / "packed", "--parallel", "1", "--pack", "2", "--pack-queue", "1")
    procs = [packed_sweep, sweep(spec, tmp_path / "apart", "--parallel", "1")]
    outs = outputs_when_done(procs, 600)
    assert "[sweep] up to 2 trials at a time a job, each pruned alone while the others go on, 1 more" in outs[0]
    packed, apart = tmp_path / "packed" / "trials", tmp_path / "apart" / "trials"
    assert sorted(p.name for p in packed.iterdir()) == ["0000", "0001", "0002", "pack-0000.json", "pack-0000.log"]
    log = (packed / "pack-0000.log").read_text()
    assert "a pack of 3 runs in one job" in log and "[edgesim] run 0002 begins: a place in the job is free" in log
    for number in ("0000", "0001", "0002"):
        mine, alone = packed / number, apart / number
        events = (mine / "events.jsonl").read_text().splitlines()
        assert len(events) == 10 and events == (alone / "events.jsonl").read_text().splitlines()
        pairs = list(zip(accuracies(mine), accuracies(alone), strict=True))
        assert all(v == w and abs(a - b) <= ACCURACY_TOLERANCE for (v, a), (w, b) in pairs), pairs
        config = json.loads((mine / "metrics.json").read_text())["config"]["training"]
        assert config["local_lr"] == {"0000": 0.02, "0001": 0.05, "0002": 0.03}[number]
    storage = f"sqlite:///{tmp_path / 'packed' / 'study.db'}"
    (name,) = optuna.study.get_all_study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert [t.user_attrs["pack"] for t in trials] == ["trials/pack-0000"] * 3
    ended = [t.user_attrs["ended"] for t in trials]  # each told to the study once its run ended, not at the pack's end
    assert min(ended[:2]) < ended[2], ended

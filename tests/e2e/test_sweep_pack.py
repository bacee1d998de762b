"""A real sweep of three trials (three learning rates, no repeat) with ``--pack 2 --pack-queue 1`` (``docs/sweeps.md``)
runs them as one job (the job script's ``--runs`` and ``--runs-at-once 2``): the third trial begins inside the
running job when one of the first two ends, and each trial's results are in its own folder with its job alone's
events and, to summation order, its accuracies: their devices train in shared groups, each at its own rate
(``tests/e2e/test_pack.py``'s tolerance). A sweep whose candidate repeats seeds, packed and with ``--pack 1``, is
``tests/e2e/test_pack.py``'s, whose checks of a pack of seeds it feeds."""

from __future__ import annotations

import json

import optuna
import pytest

from tests.conftest import outputs_when_done
from tests.e2e.test_pack import ACCURACY_TOLERANCE, seeds_spec, sweep
from tests.e2e.test_pack import curve as accuracies

pytestmark = pytest.mark.slow


def trials_spec(workspace) -> str:
    """The seeds' sweep of ``tests/e2e/test_pack.py`` as a grid of three learning rates instead of repeated seeds."""
    spec = json.loads(seeds_spec(workspace))
    del spec["base"]["local-lr"], spec["repeat"]
    return json.dumps(spec | {"grid": {"local-lr": [0.02, 0.05, 0.03]}})


def test_three_trials_packed_two_at_a_time_run_as_one_job_each_as_its_job_alone(tmp_path):
    spec = tmp_path / "trials.yaml"
    spec.write_text(trials_spec(tmp_path / "ws"))
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

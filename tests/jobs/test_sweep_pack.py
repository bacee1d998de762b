"""A candidate's repeated seeds as ONE job (``jobs.sweep.pack``), without NVFlare: one launch per candidate with
``--seeds``, its runs read from the pack's ``seed-N`` folders with the values separate jobs give, a pruned
candidate's one process stopped, the one-line fallback when the seeds cannot share a job, ``--pack 1`` and
``--pack 2``, and a bad ``--pack`` refused."""

from __future__ import annotations

import json

import pytest
from optuna.trial import TrialState

import jobs.sweep.runner as runner
from jobs.sweep.cli import main
from jobs.sweep.runner import Sweep, SweepOptions
from jobs.sweep.spec import parse_spec
from tests.fakes.sweep import BASE, PEAK, STARTED, STOPPED, SeededFake, refused_before_any_trial, reset, write_spec

SEEDS = BASE + "grid: {local-lr: [0.01, 0.011, 1.0e-5]}\nrepeat: {seed: [1, 2, 3]}\n"


@pytest.fixture(autouse=True)
def _fresh():
    reset()


def sweep_of(tmp_path, text: str = SEEDS, name: str = "sweep", **options) -> Sweep:
    """A finished sweep of spec ``text`` with the fake launcher, two processes at once."""
    opts = SweepOptions(output=str(tmp_path / name), parallel=2, poll_seconds=0.0, bar=False, **options)
    sweep = Sweep(parse_spec(text, "p"), opts, launch=SeededFake)
    sweep.prepare()
    assert sweep.run() == 0
    sweep.lock.close()
    return sweep


def test_a_candidates_seeds_start_as_one_job_and_score_as_separate_jobs_do(tmp_path, capsys):
    packed = sweep_of(tmp_path, pruner="none")
    out = capsys.readouterr().out
    assert "[sweep] a candidate's 3 seeds run as one job of 3 runs: each job one process, one slot" in out, out
    assert [f["seeds"] for f in STARTED] == [[1, 2, 3]] * 3 and not any("seed" in f for f in STARTED)
    assert PEAK[0] == 2  # a pack is one slot: two at once, never more
    reset()
    apart = sweep_of(tmp_path, name="apart", pruner="none", pack=1)
    assert "seeds run as" not in capsys.readouterr().out  # --pack 1: no pack planned, no line
    assert [f["seed"] for f in STARTED] == [1, 2, 3] * 3 and not any("seeds" in f for f in STARTED)
    for one, other in zip(packed.study.get_trials(), apart.study.get_trials(), strict=True):
        assert one.state == other.state == TrialState.COMPLETE
        assert one.value == other.value and one.user_attrs["values"] == other.user_attrs["values"]
        runs, alone = one.user_attrs["runs"], other.user_attrs["runs"]
        number = f"{one.number:04d}"
        assert [r["folder"] for r in runs] == [f"trials/{number}/seed-{s}" for s in (1, 2, 3)]
        assert [r["folder"] for r in alone] == [f"trials/{number}-seed{s}" for s in (1, 2, 3)]
        assert all(r["pack"] == f"trials/{number}" and r["exit_code"] == 0 for r in runs)
        assert [r["command"] for r in runs] == [r["command"] for r in alone]  # each seed's command alone
        assert [r["versions"] for r in runs] == [r["versions"] for r in alone]


def test_a_pruned_candidate_stops_its_one_process_and_every_run_is_marked_pruned(tmp_path):
    sweep = sweep_of(tmp_path, pruner="median")
    trials = sweep.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    assert STOPPED == [STARTED[2]] and STOPPED[0]["seeds"] == [1, 2, 3] and STOPPED[0]["local-lr"] == 1e-5
    for seed in (1, 2, 3):
        metrics = json.loads((tmp_path / "sweep" / "trials" / "0002" / f"seed-{seed}" / "metrics.json").read_text())
        assert metrics["outcome"]["status"] == "pruned", metrics
    assert [r["exit_code"] for r in trials[2].user_attrs["runs"]] == [143] * 3


def test_seeds_that_cannot_share_a_job_run_as_separate_jobs_after_one_line(tmp_path, capsys):
    sweep_of(tmp_path, BASE + "  on-leaf-loss: continue\n" + SEEDS[len(BASE) :], pruner="none")
    lines = [line for line in capsys.readouterr().out.splitlines() if "separate jobs" in line]
    assert lines == [
        "[sweep] a candidate's seeds run as separate jobs: they cannot share one (run 0: --on-leaf-loss continue: "
        "a pack stops every run when a leaf is lost (with local-lr=0.01))"
    ], lines
    assert [f["seed"] for f in STARTED] == [1, 2, 3] * 3 and not any("seeds" in f for f in STARTED)


def test_pack_2_puts_at_most_two_seeds_in_a_job_and_the_last_alone(tmp_path):
    sweep = sweep_of(tmp_path, BASE + "grid: {local-lr: [0.01]}\nrepeat: {seed: [1, 2, 3]}\n", pack=2)
    assert [(f.get("seeds"), f.get("seed")) for f in STARTED] == [([1, 2], None), (None, 3)]
    runs = sweep.study.get_trials()[0].user_attrs["runs"]
    assert [r["folder"] for r in runs] == ["trials/0000-pack0/seed-1", "trials/0000-pack0/seed-2", "trials/0000-seed3"]


class Launched(SeededFake):
    """The real launcher's signature (``jobs.sweep.trial.TrialProcess``), for the command line's sweeps."""

    def __init__(self, flags, folder, cores, python=None, live_log=False):
        super().__init__(flags, folder, cores)


@pytest.mark.parametrize("args, starts", [([], [[1, 2, 3]]), (["--pack", "1"], [None, None, None])])
def test_the_pack_flag_reaches_the_sweep(tmp_path, monkeypatch, args, starts):
    monkeypatch.setattr(runner, "TrialProcess", Launched)
    spec = write_spec(tmp_path, BASE + "grid: {local-lr: [0.01]}\nrepeat: {seed: [1, 2, 3]}\n")
    assert main([spec, "--output", str(tmp_path / "sweep"), "--no-bar", *args]) == 0
    assert [f.get("seeds") for f in STARTED] == starts


@pytest.mark.parametrize("value, fix", [("0", "--pack 0: 1 or more seeds a job"), ("-3", "--pack -3: 1 or more")])
def test_a_bad_pack_is_refused_in_one_line(tmp_path, capsys, value, fix):
    err = refused_before_any_trial(tmp_path, capsys, SEEDS, "--pack", value)
    assert fix in err, err


def test_a_pack_that_is_not_a_number_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        main([write_spec(tmp_path, SEEDS), "--output", str(tmp_path / "sweep"), "--pack", "all"])
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and err.startswith("error: argument --pack: invalid int value: 'all'"), err
    assert len(err.splitlines()) == 1 and not (tmp_path / "sweep").exists()


class Ended:
    """A pack's process that has ended with ``code``."""

    def __init__(self, code: int):
        self.code, self.started, self.wall_seconds = code, 100.0, 1.0

    def poll(self) -> int:
        return self.code


@pytest.mark.parametrize("code, codes", [(1, [0, 1]), (0, [0, 1]), (143, [143, 143])])
def test_each_seed_of_a_pack_exits_as_its_job_alone_would(tmp_path, code, codes):
    from common.jsonio import write_json_atomic
    from jobs.sweep.pack import PackMember, PackProcess

    pack = PackProcess(Ended(code))
    for seed, status in ((1, "completed"), (2, "ended_early")):
        (tmp_path / f"seed-{seed}").mkdir()
        write_json_atomic(str(tmp_path / f"seed-{seed}" / "metrics.json"), {"outcome": {"status": status}})
    assert [PackMember(pack, str(tmp_path / f"seed-{s}")).poll() for s in (1, 2)] == codes

"""A candidate's repeated seeds as ONE job (``jobs.sweep.pack``), without NVFlare: one launch per candidate with
``--seeds``, its runs read from the pack's ``seed-N`` folders with the values separate jobs give, a pruned
candidate's one process stopped, the one-line fallback when the seeds cannot share a job, ``--pack 1`` and
``--pack 2``, and a bad ``--pack`` refused."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from optuna.trial import TrialState

import jobs.sweep.cli as cli
import jobs.sweep.runner as runner
from jobs.sweep.cli import main
from jobs.sweep.runner import Sweep, SweepOptions
from jobs.sweep.spec import parse_spec
from tests.fakes.sweep import (
    BASE,
    PEAK,
    STARTED,
    STOPPED,
    FakeTrial,
    SeededFake,
    refused_before_any_trial,
    reset,
    write_spec,
)

SEEDS = BASE + "grid: {local-lr: [0.01, 0.011, 1.0e-5]}\nrepeat: {seed: [1, 2, 3]}\n"


@pytest.fixture(autouse=True)
def _fresh():
    reset()


def sweep_of(tmp_path, text: str = SEEDS, name: str = "sweep", launch=SeededFake, **options) -> Sweep:
    """A finished sweep of spec ``text`` with the fake launcher, two processes at once unless ``parallel`` says."""
    options = {"parallel": 2} | options
    opts = SweepOptions(output=str(tmp_path / name), poll_seconds=0.0, bar=False, **options)
    sweep = Sweep(parse_spec(text, "p"), opts, launch=launch)
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
    sweep_of(tmp_path, BASE + "  time-scale: 1\n" + SEEDS[len(BASE) :], pruner="none")
    lines = [line for line in capsys.readouterr().out.splitlines() if "separate jobs" in line]
    assert lines == [
        "[sweep] a candidate's seeds run as separate jobs: they cannot share one (run 0: a pack runs simulated "
        "devices on exact time: leave out --simulator, --devices and --time-scale (with local-lr=0.01))"
    ], lines
    assert [f["seed"] for f in STARTED] == [1, 2, 3] * 3 and not any("seeds" in f for f in STARTED)


def test_pack_2_puts_at_most_two_seeds_in_a_job_and_the_last_alone(tmp_path):
    sweep = sweep_of(tmp_path, BASE + "grid: {local-lr: [0.01]}\nrepeat: {seed: [1, 2, 3]}\n", pack=2)
    assert [(f.get("seeds"), f.get("seed")) for f in STARTED] == [([1, 2], None), (None, 3)]
    runs = sweep.study.get_trials()[0].user_attrs["runs"]
    assert [r["folder"] for r in runs] == ["trials/0000-pack0/seed-1", "trials/0000-pack0/seed-2", "trials/0000-seed3"]


@dataclasses.dataclass
class QuickPoll(SweepOptions):
    """The command line's options, its trials polled without a pause (the fakes end at once)."""

    poll_seconds: float = 0.0


class Launched(SeededFake):
    """The real launcher's signature (``jobs.sweep.trial.TrialProcess``), for the command line's sweeps."""

    def __init__(self, flags, folder, cores, python=None, live_log=False):
        super().__init__(flags, folder, cores)


@pytest.mark.parametrize("args, starts", [([], [[1, 2, 3]]), (["--pack", "1"], [None, None, None])])
def test_the_pack_flag_reaches_the_sweep(tmp_path, monkeypatch, args, starts):
    monkeypatch.setattr(runner, "TrialProcess", Launched)
    monkeypatch.setattr(cli, "SweepOptions", QuickPoll)
    spec = write_spec(tmp_path, BASE + "grid: {local-lr: [0.01]}\nrepeat: {seed: [1, 2, 3]}\n")
    assert main([spec, "--output", str(tmp_path / "sweep"), "--no-bar", *args]) == 0
    assert [f.get("seeds") for f in STARTED] == starts


@pytest.mark.parametrize("value, fix", [("0", "--pack 0: 1 or more runs a job"), ("-3", "--pack -3: 1 or more")])
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


TRIALS = BASE + "grid: {local-lr: [0.01, 0.011, 1.0e-5, 0.0099]}\n"  # four candidates, no repeat


def runs_files(started: list[dict]) -> list[dict]:
    """The ``--runs`` file of each pack of trials started, in the order they started."""
    found = []
    for flags in started:
        if "runs" in flags:
            with open(flags["runs"]) as f:
                found.append(json.load(f))
    return found


def test_pack_2_runs_two_trials_a_job_each_in_its_own_folder_scored_as_alone(tmp_path, capsys):
    packed = sweep_of(tmp_path, TRIALS, pruner="none", pack=2, pack_queue=0, parallel=1)
    assert (
        "[sweep] up to 2 trials at a time a job, each pruned alone while the others go on (" in capsys.readouterr().out
    )
    assert [sorted(f) for f in STARTED] == [["runs"], ["runs"]]  # two processes, no trial alone
    sweep = tmp_path / "sweep" / "trials"
    assert runs_files(STARTED) == [
        {"0000": {"local-lr": 0.01, "output": str(sweep / "0000")} | BASE_FLAGS,
         "0001": {"local-lr": 0.011, "output": str(sweep / "0001")} | BASE_FLAGS},
        {"0002": {"local-lr": 1e-5, "output": str(sweep / "0002")} | BASE_FLAGS,
         "0003": {"local-lr": 0.0099, "output": str(sweep / "0003")} | BASE_FLAGS},
    ]  # fmt: skip
    reset()
    apart = sweep_of(tmp_path, TRIALS, name="apart", pruner="none", pack=1, parallel=1)
    assert not any("runs" in f for f in STARTED) and len(STARTED) == 4
    for one, other in zip(packed.study.get_trials(), apart.study.get_trials(), strict=True):
        assert one.state == other.state == TrialState.COMPLETE and one.value == other.value
        assert one.user_attrs["folder"] == other.user_attrs["folder"] == f"trials/{one.number:04d}"
        assert one.user_attrs["command"] == other.user_attrs["command"]  # each trial's command alone
        assert one.user_attrs["pack"] == f"trials/pack-{2 * (one.number // 2):04d}" and "pack" not in other.user_attrs


def test_pack_2_holds_2_more_trials_waiting_that_join_its_job_as_trials_end(tmp_path, capsys):
    """``--pack 2`` (its queue N by default): the four trials go in ONE job, two at a time (``--runs-at-once 2``),
    in the study's order, each scored as alone; ``--pack-queue 1`` makes jobs of three; a negative queue is refused."""
    packed = sweep_of(tmp_path, TRIALS, pruner="none", pack=2, parallel=1)
    out = capsys.readouterr().out
    assert (
        "[sweep] up to 2 trials at a time a job, each pruned alone while the others go on, 2 more waiting in it to "
        "take the place of one that ends or is pruned (--pack-queue)" in out
    ), out
    assert [sorted(f) for f in STARTED] == [["runs", "runs-at-once"]] and STARTED[0]["runs-at-once"] == 2
    assert [list(r) for r in runs_files(STARTED)] == [["0000", "0001", "0002", "0003"]]
    reset()
    apart = sweep_of(tmp_path, TRIALS, name="apart", pruner="none", pack=1, parallel=1)
    assert [t.value for t in packed.study.get_trials()] == [t.value for t in apart.study.get_trials()]
    reset()
    sweep_of(tmp_path, TRIALS, name="three", pruner="none", pack=2, pack_queue=1, parallel=1)
    assert [list(r) for r in runs_files(STARTED)] == [["0000", "0001", "0002"]]  # the last trial alone
    assert STARTED[0]["runs-at-once"] == 2 and "runs" not in STARTED[1]
    with pytest.raises(runner.SpecError, match=r"--pack-queue -1: 0 or more"):
        Sweep(parse_spec(TRIALS, "q"), SweepOptions(output=str(tmp_path / "q"), pack=2, pack_queue=-1)).prepare()


class EarlyRunsFake(FakeTrial):
    """A pack of trials whose runs end (each its outcome and its last version recorded, as the pack's server records
    them), the first at the third round of polls and the second at the fourth, before the pack's process ends at
    the sixth (its shut-down); ``ORDER`` hears when the process ends."""

    polls_to_end = 5

    def write_runs(self) -> None:
        from common.jsonio import write_json_atomic

        super().write_runs()
        for i, flags in enumerate(self.runs.values()):
            if self.code is None and self.polls >= 3 + i:
                metrics = {"versions": self.records(self.accuracy_of(0, flags))}
                metrics["outcome"] = {"status": "completed", "reason": "version 3 (--max-model-version)", "version": 3}
                write_json_atomic(os.path.join(flags["output"], "metrics.json"), metrics)
        if self.code is not None:
            ORDER.append(f"pack of {next(iter(self.runs))} ended")


ORDER: list[str] = []


def test_a_packs_trial_that_has_ended_is_told_before_the_pack_ends_and_its_slot_stays_taken(tmp_path, monkeypatch):
    """A trial of a pack whose run has ended (``PackMember.final``) is scored and told to the study then, not when
    the pack's last run ends, so the pruner and the sampler count it; the pack keeps its slot until its process
    ends (one process at a time with ``--parallel 1``), and each trial's value is its job alone's."""
    ORDER.clear()
    monkeypatch.setattr(runner, "say", ORDER.append)
    packed = sweep_of(tmp_path, TRIALS, pruner="none", pack=2, pack_queue=0, parallel=1, launch=EarlyRunsFake)
    told = [line.split(":")[0] for line in ORDER if line.startswith(("[sweep] trial", "pack of"))]
    assert told == [
        "[sweep] trial 0 complete", "[sweep] trial 1 complete", "pack of 0000 ended",
        "[sweep] trial 2 complete", "[sweep] trial 3 complete", "pack of 0002 ended",
    ], told  # fmt: skip
    assert PEAK[0] == 1  # the second pack started only once the first's process had ended
    reset()
    apart = sweep_of(tmp_path, TRIALS, name="apart", pruner="none", pack=1, parallel=1)
    assert [t.value for t in packed.study.get_trials()] == [t.value for t in apart.study.get_trials()]


BASE_FLAGS = {"num-leaf-nodes": 2, "devices-per-leaf": 4, "device-selection-size": 4, "max-model-version": 5}


class LongerFake(SeededFake):
    """A fake job that goes on for two rounds of polls after its last record (a pruned run's pack still running)."""

    polls_to_end = 5


def test_a_pruned_trial_of_a_pack_ends_alone_and_the_pack_goes_on(tmp_path):
    sweep = sweep_of(tmp_path, TRIALS, pruner="median", pack=2, pack_queue=0, parallel=1, launch=LongerFake)
    trials = sweep.study.get_trials()
    assert [t.state for t in trials] == [
        TrialState.COMPLETE,
        TrialState.COMPLETE,
        TrialState.PRUNED,
        TrialState.COMPLETE,
    ]
    (_, second) = runs_files(STARTED)
    assert STOPPED == [second["0002"]]  # its run alone, by its stop request: the pack's process was never stopped
    metrics = json.loads((tmp_path / "sweep" / "trials" / "0002" / "metrics.json").read_text())
    assert metrics["outcome"]["status"] == "pruned", metrics
    assert metrics["outcome"]["reason"].startswith("pruned by the sweep at "), metrics
    assert trials[2].user_attrs["exit_code"] == 143 and trials[3].user_attrs["exit_code"] == 0
    assert trials[3].value == 0.8989 and trials[3].user_attrs["versions"] == 3  # its curve to the end


def test_trials_that_cannot_share_a_job_run_as_separate_jobs_after_one_line(tmp_path, capsys):
    sweep_of(tmp_path, BASE + "  time-scale: 1\n" + TRIALS[len(BASE) :], pruner="none", pack=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if "separate jobs" in line]
    assert lines == [
        "[sweep] trials run as separate jobs: they cannot share one (run 0: a pack runs simulated devices on exact "
        "time: leave out --simulator, --devices and --time-scale)"
    ], lines
    assert len(STARTED) == 4 and not any("runs" in f for f in STARTED)


@pytest.mark.parametrize("queue, failed", [(0, [0, 1]), (2, [0, 1, 2, 3])])
def test_a_stopped_sweep_of_packed_trials_continues_each_trial_once(tmp_path, queue, failed):
    """Stopped while its first job runs (with ``--pack-queue 2`` that job holds all four trials, two waiting), the
    sweep marks every trial of the job failed and queues it again; continued, each planned trial completes once."""
    spec = parse_spec(TRIALS, "k")
    opts = SweepOptions(
        output=str(tmp_path / "sweep"), parallel=1, poll_seconds=0.0, bar=False, pack=2, pack_queue=queue, pruner="none"
    )
    first = Sweep(spec, opts, launch=SeededFake)

    def stopped_once_running(flags, folder, cores):
        first.signum = 15  # SIGTERM comes while the first pack runs
        return SeededFake(flags, folder, cores)

    first.launch = stopped_once_running
    first.prepare()
    assert first.run() == 143
    first.lock.close()
    assert STOPPED == [STARTED[0]]  # the whole pack stopped once, not run by run
    second = Sweep(spec, opts, launch=SeededFake)
    second.prepare()
    assert second.run() == 0
    second.lock.close()
    trials = second.study.get_trials()
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["slot"] for t in done) == [0, 1, 2, 3]  # every planned trial once
    assert sorted(t.number for t in trials if t.state == TrialState.FAIL) == failed

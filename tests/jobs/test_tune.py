"""The auto-tuner (``jobs.tune``): exploration and recommendation logic on fake trials, the job-timeout
math, the probe's helpers, peak sampling on the monitor's fake host source, and one small real trial."""

from __future__ import annotations

import json
import time

import pytest
import torch

from evaluation.utilisation import GB
from jobs.build import resolve
from jobs.config import JobConfig
from jobs.tune import cli, measure, probe, search
from jobs.tune.search import (
    NO_GAIN,
    OK,
    OOM,
    TrialPoint,
    TrialResult,
    candidate_points,
    explore,
    recommend,
    recommend_job_timeout,
    worker_steps,
)
from processors.data.config import DataConfig
from processors.training import TrainingConfig
from simulation.planner import HardwareProfile, plan_workers
from tests.fakes.monitor_fakes import FakeHostSource


class FakeTrials:
    """A trial function from a table workers -> devices/s (or an exception to raise); remembers what ran."""

    def __init__(self, table: dict):
        self.table = table
        self.calls: list[TrialPoint] = []

    def __call__(self, point: TrialPoint) -> TrialResult:
        self.calls.append(point)
        key = (point.workers, point.group_size)
        outcome = self.table[key] if key in self.table else self.table[point.workers]
        if isinstance(outcome, BaseException):
            raise outcome
        return TrialResult(
            point.workers,
            point.group_size,
            devices=16,
            seconds=16 / outcome,
            devices_per_s=outcome,
            peak_rss_bytes=100 * point.workers * 2**20,
            torch_threads=1,
        )


def test_worker_steps_are_powers_of_two_up_to_the_cap():
    assert worker_steps(1) == [1]
    assert worker_steps(8) == [1, 2, 4, 8]
    assert worker_steps(6) == [1, 2, 4, 6]
    assert candidate_points(2, group_sizes=(1, 4)) == [
        TrialPoint(1, 1),
        TrialPoint(2, 1),
        TrialPoint(1, 4),
        TrialPoint(2, 4),
    ]
    with pytest.raises(ValueError):
        worker_steps(0)


def test_out_of_memory_is_survived_reported_and_stops_the_branch():
    trials = FakeTrials(
        {1: 10.0, 2: 19.0, 4: torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate"), 8: 50.0}
    )
    results = explore(trials, candidate_points(8), min_gain=0.05)
    assert [p.workers for p in trials.calls] == [1, 2, 4]  # W=8 never tried after the OOM
    assert [(r.workers, r.status) for r in results] == [(1, OK), (2, OK), (4, OOM)]
    assert "out of memory" in results[2].detail
    rec = recommend(results)
    assert rec.num_workers == 2 and rec.devices_per_s == 19.0
    assert "out of memory at W=4" in rec.reason
    table = search.format_table(results)
    assert "oom" in table.splitlines()[-1] and table.splitlines()[-1].split()[2] == "-"


def test_oom_by_message_and_other_errors_stop_only_their_branch():
    trials = FakeTrials(
        {
            (1, 1): 10.0,
            (2, 1): RuntimeError("DefaultCPUAllocator: out of memory"),
            (1, 4): RuntimeError("shape mismatch"),
            (1, 8): 30.0,
            (2, 8): 45.0,
        }
    )
    points = [TrialPoint(w, g) for g in (1, 4, 8) for w in (1, 2)]
    results = explore(trials, points, min_gain=0.05)
    assert [(r.workers, r.group_size, r.status) for r in results] == [
        (1, 1, OK),
        (2, 1, OOM),
        (1, 4, "error"),
        (1, 8, OK),
        (2, 8, OK),
    ]
    assert "shape mismatch" in results[2].detail
    rec = recommend(results)
    assert (rec.num_workers, rec.group_size) == (2, 8)


def test_an_oom_result_returned_by_the_trial_also_stops_the_branch():
    calls = []

    def run(point):
        calls.append(point.workers)
        if point.workers == 2:
            return TrialResult(2, status=OOM, detail="halved")
        return TrialResult(point.workers, devices=4, seconds=1.0, devices_per_s=4.0)

    results = explore(run, candidate_points(8))
    assert calls == [1, 2] and results[-1].status == OOM


def test_diminishing_returns_stop_exploration():
    trials = FakeTrials({1: 10.0, 2: 18.0, 4: 18.5, 8: 40.0, 16: 80.0})
    results = explore(trials, candidate_points(16), min_gain=0.05)
    assert [p.workers for p in trials.calls] == [1, 2, 4]  # +2.8% at W=4 < 5%: W=8 and W=16 never run
    assert [r.status for r in results] == [OK, OK, NO_GAIN]
    assert "+2.8%" in results[-1].detail
    # a slower trial is no gain either, and the gain is measured against the best so far
    trials = FakeTrials({1: 10.0, 2: 9.0, 4: 100.0})
    assert [r.status for r in explore(trials, candidate_points(4), min_gain=0.05)] == [OK, NO_GAIN]
    # min_gain 0 keeps going while throughput does not drop
    trials = FakeTrials({1: 10.0, 2: 10.0, 4: 12.0})
    assert [r.status for r in explore(trials, candidate_points(4), min_gain=0.0)] == [OK, OK, OK]


def test_recommendation_follows_the_measured_numbers():
    def trial(w, dps, status=OK):
        return TrialResult(w, devices=8, seconds=8 / dps, devices_per_s=dps, status=status)

    assert recommend([trial(1, 10.0), trial(2, 25.0), trial(4, 21.0, NO_GAIN)]).num_workers == 2
    # a "no gain" trial is still a measurement: when it is the fastest (tolerance 0), it wins
    assert recommend([trial(1, 10.0), trial(2, 10.4, NO_GAIN)]).num_workers == 2
    # exact ties go to fewer workers
    assert recommend([trial(4, 20.0), trial(1, 10.0), trial(2, 20.0)]).num_workers == 2
    # within the tolerance counts as a tie: fewer workers, and the reason says so
    rec = recommend([trial(1, 10.0), trial(2, 10.4, NO_GAIN)], tolerance=0.05)
    assert rec.num_workers == 1 and rec.devices_per_s == 10.0 and "within 5%" in rec.reason
    assert rec.flags() == "--num-workers 1"
    # nothing measured: no worker recommendation, but the reason names what happened
    rec = recommend([TrialResult(1, status=OOM, detail="CUDA out of memory")])
    assert rec.num_workers is None and "oom" in rec.reason and rec.flags() == ""


def test_job_timeout_recommendation_math():
    assert recommend_job_timeout(0.0) == 60
    assert recommend_job_timeout(12.3) == 60
    assert recommend_job_timeout(20.0) == 60
    assert recommend_job_timeout(25.01) == 76  # 75.03 rounded up
    assert recommend_job_timeout(100.0) == 300
    with pytest.raises(ValueError):
        recommend_job_timeout(-1.0)
    rec = recommend([TrialResult(2, devices=4, seconds=1.0, devices_per_s=4.0)], first_task_seconds=30.2)
    assert rec.job_timeout == 91 and rec.flags() == "--num-workers 2 --job-timeout 91"
    assert json.loads(json.dumps(rec.to_dict()))["flags"] == rec.flags()


def test_first_reports_take_each_leafs_earliest_wall_time(tmp_path):
    (tmp_path / "leaf_site-1.jsonl").write_text(
        '{"wall": 105.0, "sim": 0.0, "device": "site-1#0", "version": 1}\n'
        '{"wall": 103.5, "sim": 0.0, "device": "site-1#1", "version": 1}\n'
    )
    (tmp_path / "leaf_site-2.jsonl").write_text('{"wall": 108.0, "sim": 0.0, "device": "site-2#0", "version": 1}\n')
    (tmp_path / "leaf_site-3.jsonl").write_text("")
    assert probe.first_reports(str(tmp_path)) == {"site-1": 103.5, "site-2": 108.0}


def test_probe_args_shrink_the_job_and_tuner_flags_are_not_passed_on(tmp_path):
    parser = cli.build_tune_parser()
    argv = (
        "--num-leaf-nodes 3 --trial-devices 4 --skip-job-probe --json=x.json --min-gain 0.1 --local-iters 7 "
        "--max-workers 2"
    ).split()
    job_argv = cli._job_argv(argv, parser)
    assert job_argv == ["--num-leaf-nodes", "3", "--local-iters", "7"]
    args = parser.parse_args(probe.probe_args(job_argv, str(tmp_path), leaves=3, devices_per_leaf=100))
    assert (args.num_leaf_nodes, args.local_iters, args.max_model_version) == (3, 2, 2)
    assert (args.devices_per_leaf, args.device_selection_size, args.env) == (2, 6, "sim")
    assert args.output == str(tmp_path / "out")


def test_peak_sampler_keeps_the_highest_reading_of_a_scripted_source():
    host = FakeHostSource(ram_used_gb=(1.0, 3.0, 2.0))
    sampler = measure.PeakSampler(lambda: host.read()["ram_used_gb"] * GB, interval=0.001)
    with sampler:
        while host.reads < 4:
            pass
    assert sampler.peak == 3.0 * GB and sampler.samples >= 4


def _tiny_config() -> JobConfig:
    return resolve(
        JobConfig(
            data=DataConfig(synthetic_size=500, subset_size=16),
            training=TrainingConfig(local_batch_size=8, local_iters=2, compute_device="cpu"),
        )
    )


def test_one_small_real_trial_measures_a_positive_throughput():
    threads = torch.get_num_threads()
    try:
        plan = plan_workers(HardwareProfile(1), devices_per_leaf=2, per_worker_bytes=2**20)
        run = measure.make_trial_runner(_tiny_config(), plan, torch.device("cpu"), trial_devices=2, cores=1)
        results = explore(run, [TrialPoint(1)])
    finally:
        torch.set_num_threads(threads)
    (result,) = results
    assert result.status == OK, result.detail
    assert result.devices == 2 and result.seconds > 0 and result.devices_per_s > 0
    assert result.peak_rss_bytes > 10 * 2**20 and result.peak_cuda_bytes is None and result.torch_threads == 1
    assert recommend(results).num_workers == 1


def test_cli_without_job_probe_prints_a_table_and_writes_json(tmp_path, capsys):
    threads = torch.get_num_threads()
    out = tmp_path / "tune.json"
    try:
        rc = cli.main(
            [
                "--synthetic-size",
                "500",
                "--subset-size",
                "16",
                "--local-batch-size",
                "8",
                "--local-iters",
                "2",
                "--compute-device",
                "cpu",
                "--trial-devices",
                "2",
                "--max-workers",
                "2",
                "--min-gain",
                "-1",
                "--skip-job-probe",
                "--json",
                str(out),
                "--engine",
                "per-device",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    text = capsys.readouterr().out
    assert rc == 0
    assert "devices/s" in text and "peak MiB" in text and "recommended flags: --num-workers" in text
    report = json.loads(out.read_text())
    assert [t["workers"] for t in report["trials"]] == [1, 2]  # min gain -1: both run
    assert report["job_probe"] is None and report["recommendation"]["job_timeout"] is None
    assert report["recommendation"]["num_workers"] in (1, 2)


def test_cli_refuses_a_bad_job_configuration(capsys):
    assert cli.main(["--max-model-version", "1", "--skip-job-probe"]) == 2
    assert "--max-model-version" in capsys.readouterr().err


def test_measure_trial_out_of_memory_cancels_queued_devices_and_is_recorded():
    started = []

    def train_one(device_ids) -> None:
        (device_id,) = device_ids  # group size 1: one device per call
        started.append(device_id)
        time.sleep(0.01)  # 200 devices would take ~1 s on 2 workers: enough to see the cancellation
        if device_id == "d3":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    threads = torch.get_num_threads()
    try:
        ids = [f"d{i}" for i in range(200)]
        results = explore(lambda p: measure.measure_trial(p, train_one, ids, cores=1), [TrialPoint(2), TrialPoint(4)])
    finally:
        torch.set_num_threads(threads)
    assert [(r.workers, r.status) for r in results] == [(2, OOM)]
    assert "d199" not in started  # the devices still queued were cancelled
    assert (
        search.format_table(results)
        .splitlines()[1]
        .endswith("oom RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    )


def test_group_trials_train_groups_per_call_and_the_recommendation_names_the_engine():
    calls = []
    threads = torch.get_num_threads()
    try:
        ids = [f"d{i}" for i in range(10)]
        result = measure.measure_trial(TrialPoint(1, 4), lambda group: calls.append(len(group)), ids, cores=1)
    finally:
        torch.set_num_threads(threads)
    assert calls == [4, 4, 4, 2] and result.devices == 10  # one warm-up group, then the 10 devices in groups of 4
    per_device = TrialResult(1, 1, devices=10, seconds=1.0, devices_per_s=10.0)
    grouped = TrialResult(1, 8, devices=10, seconds=0.5, devices_per_s=20.0)
    assert recommend([per_device, grouped]).flags() == "--engine vectorized --group-size 8 --num-workers 1"
    assert recommend([per_device]).flags() == "--num-workers 1"  # no engines compared: no engine flag
    slower = TrialResult(1, 8, devices=10, seconds=2.0, devices_per_s=5.0)
    assert recommend([per_device, slower]).flags() == "--engine per-device --num-workers 1"

"""The reproduction harness's arithmetic: time to an accuracy, mean +- std over seeds, curves on a common grid."""

import os

import pytest

from benchmarks.reproduce_fedrevive import SCALES, job_command, method_labels, on_grid, summary_row, time_to
from tests.conftest import REPO

RUN_A = [
    {"version": 1, "sim_seconds": 0.0, "accuracy": 0.1},
    {"version": 11, "sim_seconds": 5.0, "accuracy": 0.55},
    {"version": 21, "sim_seconds": 9.0, "accuracy": 0.65},
]
RUN_B = [{"version": 1, "sim_seconds": 0.0, "accuracy": 0.1}, {"version": 11, "sim_seconds": 7.0, "accuracy": 0.45}]


def test_time_to_is_the_first_evaluated_version_at_or_above_the_threshold():
    assert time_to(RUN_A, 0.5) == 5.0 and time_to(RUN_A, 0.65) == 9.0
    assert time_to(RUN_B, 0.5) is None


def test_a_summary_row_averages_over_seeds_and_counts_who_reached_each_threshold():
    row = summary_row("fedrevive", [RUN_A, RUN_B])
    assert row["final accuracy"] == "0.550 +- 0.141"  # mean and sample std of 0.65 and 0.45
    assert row["best accuracy"] == "0.550 +- 0.141"
    assert row["time to 0.5"] == "5.000 (1/2)" and row["time to 0.7"] == "- (0/2)"


def test_curves_are_read_on_a_common_grid_as_the_last_evaluation_so_far():
    assert on_grid(RUN_A, [-1.0, 0.0, 4.9, 5.0, 100.0]) == [None, 0.1, 0.1, 0.55, 0.65]


def test_each_run_gets_the_budget_the_seed_and_its_own_folders_and_extra_flags_win(tmp_path):
    cmd = job_command("fedbuff", 2, "cpu", 40.0, str(tmp_path / "out"), ["--local-iters", "3"])
    assert cmd[cmd.index("--max-sim-time") + 1] == "40.0" and cmd[cmd.index("--seed") + 1] == "2"
    assert cmd[-2:] == ["--local-iters", "3"]  # after the scale's own --local-iters: argparse keeps the last
    assert "--synthetic-difficulty" in SCALES["cpu"]["flags"] and "resnet18" in SCALES["paper"]["flags"]


def test_user_methods_are_named_by_their_class_and_only_fedrevive_gets_its_own_flags(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(os.path.join(REPO, "examples"))
    assert method_labels(["fedavg", "fedasync:FedAsync"]) == {"fedavg": "fedavg", "fedasync:FedAsync": "fedasync"}
    with pytest.raises(ValueError, match="Nope"):
        method_labels(["fedasync:Nope"])
    fedrevive = job_command("fedrevive", 0, "cpu", 40.0, str(tmp_path), [])
    user = job_command("fedasync:FedAsync", 0, "cpu", 40.0, str(tmp_path), [])
    assert (
        "--fr-s-max" in fedrevive
        and "--fr-s-max" not in user
        and user[user.index("--method") + 1] == "fedasync:FedAsync"
    )


def test_synchronous_methods_are_evaluated_every_version_and_asynchronous_ones_every_ten(tmp_path):
    def eval_frequency(cmd: list[str]) -> str:
        return cmd[len(cmd) - 1 - cmd[::-1].index("--eval-frequency") + 1]  # the last one given wins

    assert eval_frequency(job_command("fedavg", 0, "cpu", 40.0, str(tmp_path), [])) == "1"
    assert eval_frequency(job_command("fedbuff", 0, "cpu", 40.0, str(tmp_path), [])) == "10"
    assert eval_frequency(job_command("fedrevive", 0, "paper", 200.0, str(tmp_path), [])) == "10"
    assert "--augment" in SCALES["paper"]["flags"] and "--augment" not in SCALES["cpu"]["flags"]  # see its docstring

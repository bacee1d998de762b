"""``--seeds`` and ``jobs.api.run(..., seeds=...)`` (``jobs.seeds``): every refusal is one line naming the fix, exit
code 2 (a ``ConfigError`` from the API), before any process starts; and the table's figures are the seeds'. The
pack itself runs end to end in ``tests/e2e/test_pack.py``."""

from __future__ import annotations

import statistics

import pytest

from common.choices import ConfigError
from jobs.run.results import RunResult
from jobs.seeds import SeedsResult, mean_std, parse_seeds, seed_exit_code, seeds_table

SMALL = ["--method", "fedbuff", "--devices-per-leaf", "3", "--device-selection-size", "4", "--synthetic-size", "500"]


pytestmark = pytest.mark.usefixtures("no_pack_starts")


def refused(flags: list[str], capsys) -> tuple[int, str]:
    """The job script's exit code for ``flags`` and its one line on stderr (nothing on stdout)."""
    from jobs.pt_job_fedrevive import main

    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(flags))
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and not out.strip(), (out, err)
    return exit_info.value.code, lines[0]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--seeds", "3"], "a pack needs at least 2 seeds; for one seed use --seed 3"),
        (["--seeds", "0,1,0"], "--seeds 0,1,0 repeats 0: give each seed once"),
        (["--seeds", "0,one"], "give integers separated by commas"),
        (["--seeds", "0,1.5"], "give integers separated by commas"),
        (["--seeds", "0,-1"], "use non-negative integers"),
        (["--seeds", "0,1", "--seed", "0"], "--seeds with --seed: "),  # 0 is --seed's default: written, still refused
        (["--seeds", "0,1", "--seed=2"], "--seeds with --seed: "),
        (["--seeds", "0,1", "--dry-run"], "--seeds with --dry-run: "),
        (["--seeds", "0,1", "--env", "poc"], "run 0: --env poc: a pack runs on SimEnv only"),  # jobs.pack_check's
        (["--seeds", "0,1", "--time-scale", "1"], "run 0: a pack runs simulated devices on exact time"),
    ],
)
def test_a_refused_pack_of_seeds_exits_2_in_one_line_before_anything_starts(flags, says, tmp_path, capsys):
    code, line = refused([*SMALL, *flags, "--output", str(tmp_path / "out")], capsys)
    assert code == 2 and line.startswith("error: ") and says in line, line
    assert not (tmp_path / "out").exists()  # no results folder, no workspace


def test_the_synchronous_job_script_refuses_alike(tmp_path, capsys):
    from jobs.pt_job_fedavg import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--seeds", "1,1", "--output", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "--seeds 1,1 repeats 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"seeds": [4]}, "at least 2 seeds"),
        ({"seeds": [1, 2, 2]}, "repeats 2"),
        ({"seeds": [0, 1.0]}, "give integers"),
        ({"seeds": [0, True]}, "give integers"),
        ({"seeds": [0, 1], "seed": 0}, "--seeds with --seed"),
        ({"seeds": [0, 1], "devices_per_leaf": 0}, "devices"),  # a bad option: the build's own refusal
    ],
)
def test_the_api_refuses_seeds_with_a_config_error(kwargs, says, tmp_path):
    from jobs.api import run

    with pytest.raises(ConfigError, match=says):
        run("fedbuff", output=str(tmp_path / "out"), synthetic_size=500, **kwargs)
    assert not (tmp_path / "out").exists()


def test_the_api_refuses_seeds_with_a_made_config(tmp_path):
    from jobs.api import make_config, run

    cfg = make_config("fedbuff", output=str(tmp_path / "out"), synthetic_size=500)
    with pytest.raises(ConfigError, match="seeds= with a JobConfig"):
        run(cfg, seeds=[0, 1])


def test_seeds_parse_from_the_flag_and_from_a_list():
    assert parse_seeds("2,0,1") == parse_seeds([2, 0, 1]) == [2, 0, 1]  # the seeds' order is kept


def test_the_table_shows_each_seed_and_their_mean_and_std():
    def result(seed: int, accuracies: list[float]) -> RunResult:
        versions = [{"version": v, "accuracy": a} for v, a in enumerate(accuracies, 1)]
        return RunResult(0, f"out/seed-{seed}", {"versions": versions, "outcome": {"status": "completed"}})

    result = SeedsResult(0, "out", {5: result(5, [0.1, 0.25]), 7: result(7, [0.1, 0.5]), 9: result(9, [0.4])})
    assert result.final_accuracies == {5: 0.25, 7: 0.5, 9: 0.4}
    assert result.mean == pytest.approx(statistics.mean([0.25, 0.5, 0.4]))
    assert result.std == pytest.approx(statistics.stdev([0.25, 0.5, 0.4]))
    lines = seeds_table(result).splitlines()
    assert lines[1].split() == ["5", "0.2500", "2", "completed", "out/seed-5"]
    assert lines[-1] == f"final accuracy, mean +- std over 3 seeds: {mean_std([0.25, 0.5, 0.4])}"
    assert mean_std([0.25, 0.5, 0.4]) == "0.3833 +- 0.1258"


def test_a_seed_without_an_accuracy_has_no_mean():
    runs = {
        0: RunResult(1, "out/seed-0", {}),
        1: RunResult(1, "out/seed-1", {"versions": [{"version": 1, "accuracy": 0.3}]}),
    }
    result = SeedsResult(1, "out", runs)
    assert result.mean is None and result.std is None
    assert seeds_table(result).splitlines()[-1] == "final accuracy: no mean +- std (seed(s) 0 evaluated no version)"


def test_a_seed_that_ended_early_exits_1_as_its_run_alone_would():
    completed, early = {"outcome": {"status": "completed"}}, {"outcome": {"status": "stopped", "reason": "budget"}}
    assert [seed_exit_code(0, m) for m in (completed, early, {})] == [0, 1, 1]
    assert seed_exit_code(1, completed) == 1 and seed_exit_code(2, {}) == 2  # the job failed, or was refused

"""Refusals that e2e tests once checked by starting a job script in a fresh interpreter (each importing torch, for
a few seconds) now call the script's entry point here: the same exit code and message, and no NVFlare process."""

import sys

import pytest

from jobs.pt_job_fedavg import main
from jobs.run import driver


@pytest.fixture(autouse=True)
def no_nvflare(monkeypatch):
    """Fail the test if a refused config reaches the point where NVFlare would start."""

    def boom(*_a, **_k):
        raise AssertionError("NVFlare environment was created for a refused config")

    monkeypatch.setattr(driver, "make_env", boom)


def refused(entry, flags: list[str]) -> int:
    """The job script's exit code for ``flags``: a refusal exits from argparse (``SystemExit``) or returns it."""
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(entry(flags))
    return exit_info.value.code


def test_a_bad_import_path_is_refused_before_any_process_starts(tmp_path, monkeypatch, capsys):
    """Moved from ``tests/e2e/test_bring_your_own.py`` (four fresh interpreters there, each importing torch for a
    refusal): a model or dataset by import path that does not import, or is no model, is refused naming it."""
    from tests.conftest import job_args
    from tests.e2e.test_bring_your_own import _users_package

    monkeypatch.syspath_prepend(_users_package(tmp_path / "src"))
    for name in [m for m in sys.modules if m.split(".")[0] == "users_pkg"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.chdir(tmp_path)
    cases = {
        ("--model", "users_pkg.models:Nope"): "Nope",
        ("--model", "no_such_pkg.models:Net"): "no_such_pkg",
        ("--dataset", "users_pkg.data:nothing"): "nothing",
        ("--model", "torch.nn:Identity"): "Identity",
    }
    for (flag, value), named in cases.items():
        code = refused(main, [flag, value, *job_args(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2, (flag, value, err[-2000:])
        assert named in err and "Traceback" not in err, err[-2000:]
        assert not (tmp_path / "ws").exists()  # refused before NVFlare made a workspace
    for name in [m for m in sys.modules if m.split(".")[0] == "users_pkg"]:
        monkeypatch.delitem(sys.modules, name)  # the package lives in this test's folder only


def test_a_poisoned_dataset_is_refused_before_start_in_one_line(tmp_path, capsys):
    """Moved from ``tests/e2e/test_nonfinite.py`` (a fresh interpreter there): NaN in 25 of 2,500 training rows is
    refused before any process starts, in one line naming the count and the flag that drops them."""
    from jobs.pt_job_fedrevive import main as job_script
    from tests.e2e.test_nonfinite import _flags
    from tests.fakes.nonfinite import NAN_ROWS

    assert refused(job_script, _flags(tmp_path, "refused", "--dataset", "tests.fakes.nonfinite:poisoned")) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert f"{NAN_ROWS} of 2500 training rows" in line and "--dataset-nonfinite drop" in line, line
    assert not (tmp_path / "refused" / "ws").exists()  # refused before NVFlare made a workspace


def test_resume_refuses_a_folder_without_metrics(tmp_path, capsys):
    """Moved from ``tests/e2e/test_long_runs.py`` (a fresh interpreter there): ``--resume`` of a folder that holds
    no run's ``metrics.json`` is refused, exit 2, naming what is missing."""
    from jobs.pt_job_fedrevive import main as job_script

    (tmp_path / "run").mkdir()
    assert refused(job_script, ["--resume", str(tmp_path / "run")]) == 2
    assert "no metrics.json there" in capsys.readouterr().err


def test_dry_run_refuses_a_policy_that_needs_training_results_in_one_line(tmp_path, monkeypatch, capsys):
    """Moved from ``tests/e2e/test_selection_methods.py`` (a fresh interpreter there): ``--dry-run`` trains nothing,
    so a selection policy that reads the devices' losses is refused in one line, and no trace is written."""
    from jobs.pt_job_fedrevive import main as job_script
    from tests.conftest import EXAMPLES
    from tests.e2e.test_selection_methods import COMMON, RUNS

    monkeypatch.syspath_prepend(EXAMPLES)
    flags = [*COMMON, *RUNS["power_of_choice"], "--dry-run", "--output", str(tmp_path / "out")]
    assert refused(job_script, flags) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--dry-run trains nothing" in lines[0], lines
    assert not (tmp_path / "out" / "events.jsonl").exists()

"""benchmarks/perf/bench_fixed_cost.py reads the phases of a run from NVFlare's logs (every site's, in time order). The
benchmark itself runs jobs, so it is run by hand, not here."""

from benchmarks.perf import bench_fixed_cost


def test_the_phases_markers_are_read_from_every_log_in_time_order(tmp_path):
    server, site = tmp_path / "job" / "server", tmp_path / "job" / "site-1"
    server.mkdir(parents=True)
    site.mkdir(parents=True)
    (server / "log.txt").write_text(
        "2026-01-01 10:00:01,000 - SimulatorRunner - INFO - Deploy and start the Server App.\n"
        "a line without a time stamp\n"
        "2026-01-01 10:00:03,500 - ServerRunner - INFO - [identity=x] - END_RUN fired\n"
    )
    (site / "log.txt").write_text(
        "2026-01-01 10:00:02,250 - ClientRunner - INFO - [identity=site-1] - client runner started\n"
    )
    lines = bench_fixed_cost.log_lines(str(tmp_path))
    assert [logger for _, logger, _ in lines] == ["SimulatorRunner", "ClientRunner", "ServerRunner"]
    deploy = bench_fixed_cost.find(lines, "SimulatorRunner", "Deploy and start", "first")
    started = bench_fixed_cost.find(lines, "ClientRunner", "client runner started", "last")
    assert started - deploy == 1.25
    assert bench_fixed_cost.find(lines, "MPM", "Good Bye", "last") is None


def test_the_benchmarks_start_a_job_from_another_checkout_the_same_way(monkeypatch):
    """``harness.job_command`` (used by ``run_job``, which ``bench_fixed_cost.measure`` runs its job with, and by
    ``same_bits``): the checkout's script, ``--output`` last, and the checkout first on ``PYTHONPATH`` for every
    process of the job."""
    import os
    import sys

    from benchmarks.lib import harness

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    argv, env = harness.job_command("jobs/pt_job_fedavg.py", ["--seed", "7"], "/out", repo="/other/checkout")
    assert argv == [sys.executable, "/other/checkout/jobs/pt_job_fedavg.py", "--seed", "7", "--output", "/out"]
    assert env["PYTHONPATH"].split(os.pathsep) == ["/other/checkout", "/elsewhere"]
    assert bench_fixed_cost.run_job is harness.run_job
    from benchmarks.checks import same_bits

    assert same_bits.job_command is harness.job_command


def test_the_refused_flag_is_timed_to_the_jobs_exit_and_a_flag_that_was_not_refused_fails_the_bench(
    tmp_path, monkeypatch
):
    """``refusal_seconds`` runs the real job script with ``REFUSED`` added: it exits 2 and writes nothing; a flag
    the job takes instead (here ``--help``, exit 0) stops the bench naming the exit."""
    import pytest

    from tests.conftest import REPO

    seconds = bench_fixed_cost.refusal_seconds("jobs/pt_job_fedavg.py", [], str(tmp_path / "out"), REPO)
    assert 0 < seconds < 60 and not (tmp_path / "out").exists()
    monkeypatch.setattr(bench_fixed_cost, "REFUSED", ["--help"])
    with pytest.raises(SystemExit, match="--help was not refused .exit 0."):
        bench_fixed_cost.refusal_seconds("jobs/pt_job_fedavg.py", [], str(tmp_path / "out"), REPO)

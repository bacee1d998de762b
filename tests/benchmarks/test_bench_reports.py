"""The benches' split pieces: a baseline checkout from before the benchmarks were sorted still finds its null
trainer (``protocol_runs.in_checkout``), and the transport floor's table is printed from figures alone."""

import argparse

from benchmarks.perf import protocol_runs, transport_report


def test_a_baseline_checkout_from_before_the_move_runs_its_null_trainer_from_its_old_path(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "benchmarks").mkdir(parents=True)
    (old / "benchmarks" / "null_training.py").write_text("")
    (new / "benchmarks" / "lib").mkdir(parents=True)
    (new / "benchmarks" / "lib" / "null_training.py").write_text("")
    assert protocol_runs.in_checkout(str(old), protocol_runs.NULL_JOB) == "benchmarks/null_training.py"
    assert protocol_runs.in_checkout(str(new), protocol_runs.NULL_JOB) == protocol_runs.NULL_JOB
    assert protocol_runs.in_checkout(str(tmp_path), protocol_runs.NULL_JOB) == protocol_runs.NULL_JOB  # neither
    assert protocol_runs.in_checkout(str(old), "jobs/pt_job_fedavg.py") == "jobs/pt_job_fedavg.py"


def test_the_transport_table_is_printed_from_the_figures_it_is_given(capsys):
    """Two modes and the job beside them: each mode's line, the job's traffic, and the ratio column of the two."""
    args = argparse.Namespace(modes=["shm", "wire"], leaves=2, diffs_per_sync=4, versions_per_update=0.5)
    args.model, args.seconds = "cifar10_convnet", 1.0

    def floor(rate: float, server_ms: float) -> dict:
        return {"updates": 100, "updates_per_s": rate, "server_ms": server_ms, "leaves_ms": 1.0,
                "server_cores": 0.5, "sync_p50_ms": 2.0, "sync_p99_ms": 4.0, "versions_per_sync": 2,
                "blob_bytes": 250_000, "bulk": {"leaf-0": "shm"}}  # fmt: skip

    job = {"devices_per_second": 300.0, "cpu_ms": {"server": 0.9, "leaves": 2.0}, "server_cores": 0.7}
    transport_report.print_report(args, {"shm": floor(800.0, 0.2), "wire": floor(400.0, 0.4)}, job)
    out = capsys.readouterr().out
    assert "the job's traffic: 4 diffs per report, 0.50 versions per update" in out
    assert "--bulk shm: 2 leaves, 4 diffs up and 2 versions down per sync, each 250 kB" in out
    assert "(leaf-0: shm)" in out
    rate_row = next(line for line in out.splitlines() if line.startswith("updates/s"))
    assert rate_row.split()[1:] == ["300.0", "800.0", "400.0", "2.00x", "1500"]

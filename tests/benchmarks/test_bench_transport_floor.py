"""benchmarks/perf/bench_transport_floor.py: NVFlare's wire alone, between real cells in real processes, and the job's
traffic read from the server's own log line."""

import os
import re
import subprocess
import sys

import pytest

from benchmarks.perf.bench_transport_floor import protocol_line
from scheduling.exact_assessor import PROTOCOL_SUMMARY

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "perf", "bench_transport_floor.py")


def test_the_job_s_traffic_is_read_from_the_line_its_server_logs():
    logged = PROTOCOL_SUMMARY.format(reports=120, wakes=7, applied=5528, models=4323)
    found = protocol_line().search(f"2026-11-27 09:30:00,000 - ExactTimeAssessor - INFO - [run=x] - {logged}")
    assert (found["reports"], found["applied"], found["models"]) == ("120", "5528", "4323")


@pytest.mark.slow
def test_the_floor_moves_whole_diffs_and_versions_between_real_cells_and_prints_its_cpu(tmp_path):
    """Two leaf processes sync with the server's cell for a short window, through shared memory and then on the
    wire; the bench checks the first sync and reply arrive whole (or exits non-zero) and prints each process's CPU
    per update, the server's cores, the sync round trips, and the ratios."""
    argv = [sys.executable, BENCH, "--seconds", "1", "--warmup", "0.5", "--diffs-per-sync", "4", "--bulk", "shm,wire"]
    done = subprocess.run([*argv, "--versions-per-update", "0.5"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--bulk shm: 2 leaves, 4 diffs up and 2 versions down per sync" in done.stdout
    assert "(leaf-0: shm, leaf-1: shm)" in done.stdout  # the leaves proved they share memory with the server
    assert "--bulk wire: 2 leaves, 4 diffs up and 2 versions down per sync" in done.stdout
    names = ("updates/s", "server CPU ms per update", "leaves CPU ms per update", "server cores used")
    rows = {}
    for line in done.stdout.splitlines():
        m = re.match(
            r"(" + "|".join(map(re.escape, names)) + r"|sync round trip p\d\d ms)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x",
            line,
        )
        if m:
            rows[m[1]] = tuple(float(v) for v in m.groups()[1:])
    assert set(rows) == {*names, "sync round trip p50 ms", "sync round trip p99 ms"}
    assert all(
        shm > 0 and wire > 0 and abs(ratio - shm / wire) < 0.02 + 0.05 * ratio for shm, wire, ratio in rows.values()
    )


def test_a_bad_window_exits_2_with_one_line_before_any_process_starts():
    done = subprocess.run([sys.executable, BENCH, "--seconds", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "bench_transport_floor: --leaves, --seconds and --diffs-per-sync must be positive"
    ]


@pytest.mark.slow
def test_a_reply_that_lost_a_version_fails_the_bench_naming_it_and_leaves_no_process(monkeypatch, capfd):
    import psutil

    from benchmarks.perf import bench_transport_floor

    answer = bench_transport_floor.Server.on_sync

    def one_version_short(self, request):
        reply = answer(self, request)
        reply.payload["versions"] = reply.payload["versions"][:-1]
        return reply

    monkeypatch.setattr(bench_transport_floor.Server, "on_sync", one_version_short)
    argv = ["bench_transport_floor.py", "--seconds", "1", "--warmup", "0.5", "--diffs-per-sync", "4"]
    monkeypatch.setattr(sys, "argv", [*argv, "--versions-per-update", "0.5"])
    with pytest.raises(SystemExit, match="bench_transport_floor: .*leaf"):
        bench_transport_floor.main()
    assert "the reply held 1 versions" in capfd.readouterr().err
    assert not psutil.Process().children(recursive=True)

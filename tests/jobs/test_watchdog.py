"""The driver's watchdog stops a job only when it makes no progress after its outcome: a slow first evaluation that
beats (``common.heartbeat``) keeps its job alive past the default grace; silence past the grace stops it; a dead
server is noticed at the next look.

Each look is ``Watchdog.check`` with the time given, so no test waits for the grace to pass; one test runs the
watchdog's own thread against a real child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from common.heartbeat import Heartbeat, read_heartbeat
from common.result_files import HEARTBEAT
from jobs.run.watchdog import Watchdog
from tests.conftest import REPO

GRACE = 70.0  # the default: 60 s plus the smallest update timeout


def write_metrics(folder, mtime: float, **fields) -> None:
    """``metrics.json`` with ``fields``, stamped ``mtime`` (the watchdog notices a change by it)."""
    path = folder / "metrics.json"
    path.write_text(json.dumps({"versions": []} | fields))
    os.utime(path, (mtime, mtime))


DECIDED = {"outcome": {"status": "completed", "version": 3}}


def test_a_slow_first_evaluation_that_beats_outlives_the_default_grace(tmp_path):
    write_metrics(tmp_path, 1000.0, **DECIDED)  # the outcome; version 1 not even recorded yet
    dog = Watchdog(str(tmp_path), shutdown_grace=GRACE)
    assert dog.check(0.0, server_alive=True) == ""
    beating = Heartbeat(str(tmp_path), "evaluating", 1)
    for now in range(30, 300, 30):  # a 5-minute first evaluation, beating (here every 30 s)
        beating.beat()
        assert dog.check(float(now), server_alive=True) == "", now
    assert dog.check(270.0 + GRACE, server_alive=True) == ""  # the last beat at 270 s: still within its grace
    reason = dog.check(270.0 + GRACE + 1, server_alive=True)
    assert "no progress for 70 s" in reason and "evaluating version 1" in reason


def test_silence_past_the_grace_stops_a_decided_job(tmp_path):
    write_metrics(tmp_path, 1000.0, **DECIDED)
    dog = Watchdog(str(tmp_path), shutdown_grace=GRACE)
    assert dog.check(0.0, server_alive=True) == ""
    assert dog.check(GRACE, server_alive=True) == ""
    assert "no progress" in dog.check(GRACE + 1, server_alive=True)


def test_a_record_is_progress_and_an_old_beat_is_not(tmp_path):
    Heartbeat(str(tmp_path), "evaluating", 2).beat()  # a beat from before the outcome, never repeated
    write_metrics(tmp_path, 1000.0, **DECIDED)
    dog = Watchdog(str(tmp_path), shutdown_grace=GRACE)
    assert dog.check(0.0, server_alive=True) == ""
    write_metrics(tmp_path, 1050.0, **DECIDED, versions=[{"version": 2}])  # recorded at 50 s
    assert dog.check(50.0, server_alive=True) == ""
    assert dog.check(50.0 + GRACE, server_alive=True) == ""
    assert "no progress" in dog.check(51.0 + GRACE, server_alive=True)


def test_before_the_outcome_neither_silence_nor_time_stops_a_job(tmp_path):
    write_metrics(tmp_path, 1000.0)
    dog = Watchdog(str(tmp_path), shutdown_grace=GRACE)
    assert dog.check(0.0, server_alive=None) == ""  # the server not known yet
    assert dog.check(10 * GRACE, server_alive=True) == ""


def test_a_dead_server_is_noticed_at_once_before_and_after_the_outcome(tmp_path):
    write_metrics(tmp_path, 1000.0)
    dog = Watchdog(str(tmp_path), shutdown_grace=GRACE)
    assert dog.check(0.0, server_alive=True) == ""
    assert dog.check(1.0, server_alive=False) == "the NVFlare server process died"

    write_metrics(tmp_path, 1000.0, **DECIDED)
    dog = Watchdog(str(tmp_path), shutdown_grace=GRACE)
    Heartbeat(str(tmp_path), "evaluating", 3).beat()  # beating right up to its death: dead all the same
    assert dog.check(0.0, server_alive=True) == ""
    assert "died after the run's outcome" in dog.check(1.0, server_alive=False)


def test_a_server_that_ends_after_its_summary_ended_normally(tmp_path):
    write_metrics(tmp_path, 1000.0, **DECIDED)
    dog = Watchdog(str(tmp_path), shutdown_grace=GRACE)
    assert dog.check(0.0, server_alive=True) == ""
    write_metrics(tmp_path, 1001.0, **DECIDED, summary={"last_version": 3})  # END_RUN, then it exits
    assert dog.check(1.0, server_alive=False) == ""


def test_a_pack_is_decided_only_when_every_run_is_and_progress_in_any_run_counts(tmp_path):
    ended, going = tmp_path / "seed-0", tmp_path / "seed-1"
    ended.mkdir(), going.mkdir()
    write_metrics(ended, 1000.0, **DECIDED)  # run 0 decided early; run 1 still training
    write_metrics(going, 1000.0)
    dog = Watchdog([str(ended), str(going)], shutdown_grace=GRACE)
    assert dog.check(0.0, server_alive=True) == ""
    assert dog.check(10 * GRACE, server_alive=True) == ""  # run 0's silence stops nothing while run 1 goes on
    write_metrics(going, 1100.0, **DECIDED)  # run 1 decided at 700 s: the pack's grace starts
    assert dog.check(700.0, server_alive=True) == ""
    write_metrics(going, 1200.0, **DECIDED, versions=[{"version": 3}])  # run 1 still recording: progress
    assert dog.check(700.0 + GRACE, server_alive=True) == ""
    assert "no progress" in dog.check(701.0 + 2 * GRACE, server_alive=True)


def test_a_pack_whose_server_dies_after_one_run_finished_is_noticed(tmp_path):
    done, going = tmp_path / "seed-0", tmp_path / "seed-1"
    done.mkdir(), going.mkdir()
    write_metrics(done, 1000.0, **DECIDED, summary={"last_version": 3})
    write_metrics(going, 1000.0)
    dog = Watchdog([str(done), str(going)], shutdown_grace=GRACE)
    assert dog.check(0.0, server_alive=True) == ""
    assert dog.check(1.0, server_alive=False) == "the NVFlare server process died"


def test_a_heartbeat_beats_while_its_block_runs_and_once_more_at_its_end(tmp_path):
    assert read_heartbeat(str(tmp_path)) is None
    with Heartbeat(str(tmp_path), "checkpoint", 4, interval=0.01):
        first = read_heartbeat(str(tmp_path))
        assert first["what"] == "checkpoint" and first["version"] == 4 and not first["done"]
        seen = {first["beat"]}
        while len(seen) < 3:  # the thread beats on its own
            seen.add(read_heartbeat(str(tmp_path))["beat"])
    last = read_heartbeat(str(tmp_path))
    assert last["done"] and last["beat"] > max(seen - {last["beat"]})
    assert not (tmp_path / f"{HEARTBEAT}.tmp").exists()
    with Heartbeat("", "evaluating", 1):  # no folder: beats nowhere
        pass


WATCHED = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.path.insert(0, {repo!r})
    from jobs.run.watchdog import Watchdog
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    end = time.time() + 60
    with Watchdog({out!r}, shutdown_grace=0.5, interval=0.1) as dog:
        while child.poll() is None and time.time() < end:
            time.sleep(0.05)
    print("stopped" if child.poll() is not None else "running", dog.reason, flush=True)
    child.kill()
    """
)


def test_the_watchdog_stops_every_process_of_a_job_without_progress(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"versions": [], **DECIDED}))
    script = WATCHED.format(repo=REPO, out=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90).stdout
    assert out.startswith("stopped") and "no progress" in out, out

"""The process guard stops a whole process tree, grandchildren in their own sessions included."""

import subprocess
import sys
import time

import psutil

from jobs.run.process_guard import stop_descendants


def test_stop_descendants_reaches_grandchildren_in_their_own_session():
    # like NVFlare's leaf workers: a grandchild in its own session never gets the terminal's Ctrl-C
    code = (
        "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)'], "
        "start_new_session=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.time() + 20
    while len(psutil.Process().children(recursive=True)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    tree = psutil.Process().children(recursive=True)
    assert len(tree) == 2
    assert stop_descendants(grace_seconds=5) == 2
    child.wait(timeout=5)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree)


def test_exit_now_keeps_what_was_printed_and_logged_and_the_exit_code(tmp_path):
    """The job scripts end with ``exit_now``: no interpreter teardown, but nothing written is lost."""
    from tests.conftest import REPO

    log = tmp_path / "log.txt"
    code = (
        "import logging, sys\n"
        f"logging.basicConfig(filename={str(log)!r}, level=logging.INFO)\n"
        "from jobs.run.process_guard import exit_now\n"
        "print('to stdout', end=''); print('to stderr', end='', file=sys.stderr); logging.info('logged')\n"
        "exit_now(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "to stdout", "to stderr")
    assert "logged" in log.read_text()


def test_the_guard_stops_what_started_inside_it_and_spares_what_ran_before():
    """A tracker's service (W&B's) starts before the job: the guard around the job leaves it to its owner."""
    from jobs.run.process_guard import no_orphans

    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with no_orphans(grace_seconds=5):
            inside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        assert inside.wait(timeout=10) is not None
        assert before.poll() is None
    finally:
        before.kill()
        before.wait()

"""Ctrl-C or SIGTERM on the driver of a real run stops every process the job started, keeps the results, and
records the run as interrupted (the signal, the last version, the summary) in ``metrics.json``."""

import json
import signal
import subprocess
import time

import psutil
import pytest

from tests.conftest import PYTHON, REPO, job_args


def wait_for_version(metrics_path, version: int, proc, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the job ended before it could be interrupted"
        try:
            if json.loads(metrics_path.read_text())["versions"][-1]["version"] >= version:
                return
        except (FileNotFoundError, json.JSONDecodeError, KeyError, IndexError):
            pass
        time.sleep(0.5)
    pytest.fail(f"no version {version} within {timeout} s")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_a_running_job_leaves_no_process_and_keeps_results(tmp_path, sig, code):
    flags = job_args(tmp_path, "--max-model-version", "500", "--local-iters", "2")
    proc = subprocess.Popen(
        [PYTHON, "jobs/pt_job_fedavg.py", *flags], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for_version(tmp_path / "out" / "metrics.json", 2, proc, timeout=240)
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert len(tree) >= 3, "SimEnv runs the server and each leaf in processes of their own"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, out[-3000:]
    survivors = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not survivors, [" ".join(p.cmdline()[:4]) for p in survivors]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["versions"][-1]["version"] >= 2
    assert (tmp_path / "out" / "accuracy.png").exists()
    name = signal.Signals(sig).name
    outcome = metrics["outcome"]
    assert outcome["status"] == "interrupted" and outcome["signal"] == name, outcome
    assert outcome["version"] >= metrics["versions"][-1]["version"]
    assert metrics["summary"]["last_version"] == outcome["version"]
    assert f"interrupted ({name})" in out

"""Nothing is lost when evaluation is slow: a real FedAvg job whose every evaluation outlasts the watchdog's grace.

The test double is a real model whose forward pass sleeps in eval mode only (``tests.fakes.slow_model``: training is
unaffected, each of the server's evaluations takes 8 s), and the driver's test-only grace hook
(``jobs.run.driver.GRACE_ENV``) sets the grace to 5 s, so an evaluation outlasts it as a ResNet-18 evaluation on a
busy 2-core CPU outlasts the real one (over 100 s against 70 s).

- Beside two bounded CPU-burning processes, the run ends with every scheduled version evaluated and saved: the
  server's heartbeat keeps the watchdog off it. Its console shows no AuxRunner ERROR line (fix 18).
- The server killed while it evaluates the last version: the run exits 3, its last version is on disk, and
  ``python -m jobs.finish`` completes ``metrics.json``.
"""

from __future__ import annotations

import json
import subprocess

import psutil
import torch

from jobs.run.driver import GRACE_ENV, INCOMPLETE
from tests.conftest import PYTHON, REPO, job_args, wait_for
from tests.fakes.slow_model import slow_model_env

BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def slow_job(tmp_path) -> tuple[list[str], dict]:
    """The command of a 3-version FedAvg run with the slow model, and its environment (the model importable, the
    watchdog's grace 5 s)."""
    env = slow_model_env(tmp_path, seconds=8.0)
    env[GRACE_ENV] = "5"
    flags = job_args(
        tmp_path,
        *"--model slow_model:SlowToEvaluate --max-model-version 3 --delays none --local-iters 1".split(),
        *"--local-batch-size 8 --subset-size 16 --synthetic-size 1000".split(),
    )
    return [PYTHON, "jobs/pt_job_fedavg.py", *flags], env


def test_a_slow_evaluation_under_load_keeps_every_version_and_the_console_clean(tmp_path):
    command, env = slow_job(tmp_path)
    burners = [subprocess.Popen([PYTHON, "-c", BURN.format(seconds=240)]) for _ in range(2)]
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert [r["version"] for r in metrics["versions"]] == [1, 2, 3]
    assert max(r["eval_seconds"] for r in metrics["versions"][1:]) > 5  # each outlasted the grace
    assert metrics["saved_version"] == 3 and metrics["summary"]["versions_unevaluated"] == []
    assert set(torch.load(tmp_path / "out" / "global_model.pt")) >= {"net.0.weight", "net.3.bias"}
    assert not (tmp_path / "out" / "working.json").exists()  # the driver clears the heartbeat
    assert "no progress" not in output and "[edgesim] warning" not in output.lower()
    assert "__sync_runner__" not in output  # fix 18: kept in NVFlare's log files only
    assert [line for line in output.splitlines() if "AuxRunner - ERROR" in line] == []
    logs = "".join(p.read_text() for p in (tmp_path / "out" / "nvflare").rglob("log.txt"))
    assert "__sync_runner__" in logs or "synced to parent" in logs  # the log files hold NVFlare's own lines


def server_of(job: psutil.Process) -> psutil.Process | None:
    """The NVFlare server process of a SimEnv job: the parent of its leaves' ``simulator_worker`` processes."""
    for p in job.children(recursive=True):
        try:
            if "simulator_worker" in " ".join(p.cmdline()):
                return p.parent()
        except psutil.Error:
            pass
    return None


def test_a_server_killed_while_evaluating_exits_3_with_its_last_version_saved_and_finishes(tmp_path):
    command, env = slow_job(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job, server = psutil.Process(proc.pid), None

        def evaluating_the_last_version() -> bool:
            nonlocal server
            server = server or server_of(job)
            try:
                beat = json.loads((out / "working.json").read_text())
                decided = "outcome" in json.loads((out / "metrics.json").read_text())
            except (OSError, ValueError):
                return False
            return decided and beat["what"] == "evaluating" and beat["version"] == 3 and not beat["done"]

        wait_for(evaluating_the_last_version, proc, 300, "the last version's evaluation")
        server.kill()
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == INCOMPLETE, output[-3000:]
    last_line = output.strip().splitlines()[-1]
    assert "version 3 was made and saved" in last_line and f"python -m jobs.finish {out}" in last_line
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["saved_version"] == 3 and 3 in metrics["summary"]["versions_unevaluated"]
    assert (out / "global_model.pt").exists()

    finished = subprocess.run(
        [PYTHON, "-m", "jobs.finish", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["versions"][-1]["version"] == 3 and metrics["versions"][-1]["finished"]
    assert metrics["summary"]["versions_unevaluated"] == [] and metrics["summary"]["last_evaluated_version"] == 3

"""Nothing is lost when evaluation is slow: a real FedAvg job whose every evaluation outlasts the watchdog's grace.

The test double is a real model whose forward pass sleeps in eval mode only (``tests.fakes.slow_model``: training is
unaffected, each of the server's evaluations takes 6 s), and the driver's test-only grace hook
(``jobs.run.driver.GRACE_ENV``) sets the grace to 5 s, so an evaluation outlasts it as a ResNet-18 evaluation on a
busy 2-core CPU outlasts the real one (over 100 s against 70 s).

- Beside two bounded CPU-burning processes, the run ends with every scheduled version evaluated and saved: the
  server's heartbeat keeps the watchdog off it. Its console shows no AuxRunner ERROR line (fix 18).
- The server killed while it evaluates the last version: the run exits 3, its last version is on disk, and
  ``python -m jobs.finish`` completes ``metrics.json``.

The two jobs start at once (``slow_runs``), so their evaluations' sleeps overlap.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from jobs.run.driver import GRACE_ENV, INCOMPLETE
from tests.conftest import PYTHON, REPO, job_args, wait_for
from tests.fakes.slow_model import slow_model_env

BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def slow_job(tmp_path) -> tuple[list[str], dict]:
    """The command of a 3-version FedAvg run with the slow model, and its environment (the model importable, the
    watchdog's grace 5 s)."""
    env = slow_model_env(tmp_path, seconds=6.0)
    env[GRACE_ENV] = "5"
    flags = job_args(
        tmp_path,
        *"--model slow_model:SlowToEvaluate --max-model-version 3 --delays none --local-iters 1".split(),
        *"--local-batch-size 8 --subset-size 16 --synthetic-size 1000".split(),
    )
    return [PYTHON, "jobs/pt_job_fedavg.py", *flags], env


def server_of(job: psutil.Process) -> psutil.Process | None:
    """The NVFlare server process of a SimEnv job: the parent of its leaves' ``simulator_worker`` processes."""
    for p in job.children(recursive=True):
        try:
            if "simulator_worker" in " ".join(p.cmdline()):
                return p.parent()
        except psutil.Error:
            pass
    return None


def evaluating_the_last_version_in(out) -> bool:
    """Whether the run in ``out`` has decided its outcome and its server is evaluating version 3 (its heartbeat)."""
    try:
        beat = json.loads((out / "working.json").read_text())
        decided = "outcome" in json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        return False
    return decided and beat["what"] == "evaluating" and beat["version"] == 3 and not beat["done"]


@dataclass
class Ended:
    """A job of this module that has ended: its exit code, console, folder and environment."""

    code: int
    output: str
    folder: Path
    env: dict


@pytest.fixture(scope="module")
def slow_runs(tmp_path_factory) -> dict[str, Ended]:
    """Both tests' jobs, started at once: most of each is its evaluations' sleep, so the two waits overlap (one job
    after the other took 84 s of the suite). ``loaded`` runs beside two CPU-burning processes to its end;
    ``killed`` has its server killed while it evaluates the last version. Consoles go to files, so neither job
    blocks on a full pipe while the other is watched."""
    started = {}
    for name in ("killed", "loaded"):
        root = tmp_path_factory.mktemp(name)
        command, env = slow_job(root)
        console = open(root / "console.txt", "w")  # noqa: SIM115 (closed when the job has ended)
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=console, stderr=subprocess.STDOUT, text=True)
        started[name] = (proc, console, root, env)
    burners = [subprocess.Popen([PYTHON, "-c", BURN.format(seconds=240)]) for _ in range(2)]
    ended = {}
    try:
        proc, console, root, env = started["killed"]
        job, server = psutil.Process(proc.pid), None

        def evaluating_the_last_version() -> bool:
            nonlocal server
            server = server or server_of(job)
            return evaluating_the_last_version_in(root / "out")

        wait_for(evaluating_the_last_version, proc, 300, "the last version's evaluation", str(root / "console.txt"))
        server.kill()
        for name, (proc, console, root, env) in started.items():
            proc.wait(timeout=400)
            console.close()
            ended[name] = Ended(proc.returncode, (root / "console.txt").read_text(), root / "out", env)
    finally:
        for proc in [p for p, *_ in started.values()] + burners:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return ended


def test_a_slow_evaluation_under_load_keeps_every_version_and_the_console_clean(slow_runs):
    run = slow_runs["loaded"]
    output, out = run.output, run.folder
    assert run.code == 0, output[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert [r["version"] for r in metrics["versions"]] == [1, 2, 3]
    assert max(r["eval_seconds"] for r in metrics["versions"][1:]) > 5  # each outlasted the grace
    assert metrics["saved_version"] == 3 and metrics["summary"]["versions_unevaluated"] == []
    assert set(torch.load(out / "global_model.pt")) >= {"net.0.weight", "net.3.bias"}
    assert not (out / "working.json").exists()  # the driver clears the heartbeat
    assert "no progress" not in output and "[edgesim] warning" not in output.lower()
    assert "__sync_runner__" not in output  # fix 18: kept in NVFlare's log files only
    assert [line for line in output.splitlines() if "AuxRunner - ERROR" in line] == []
    logs = "".join(p.read_text() for p in (out / "nvflare").rglob("log.txt"))
    assert "__sync_runner__" in logs or "synced to parent" in logs  # the log files hold NVFlare's own lines


def test_a_server_killed_while_evaluating_exits_3_with_its_last_version_saved_and_finishes(slow_runs):
    run = slow_runs["killed"]
    output, out = run.output, run.folder
    assert run.code == INCOMPLETE, output[-3000:]
    last_line = output.strip().splitlines()[-1]
    assert "version 3 was made and saved" in last_line and f"python -m jobs.finish {out}" in last_line
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["saved_version"] == 3 and 3 in metrics["summary"]["versions_unevaluated"]
    assert (out / "global_model.pt").exists()

    finished = subprocess.run(
        [PYTHON, "-m", "jobs.finish", str(out)], cwd=REPO, env=run.env, capture_output=True, text=True, timeout=120
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["versions"][-1]["version"] == 3 and metrics["versions"][-1]["finished"]
    assert metrics["summary"]["versions_unevaluated"] == [] and metrics["summary"]["last_evaluated_version"] == 3

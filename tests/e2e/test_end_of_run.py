"""The end of a real run is safe and visible: with an evaluator much slower than the protocol, superseded versions
are skipped (and said to be), the last version is evaluated, recorded and saved, the end-of-run lines agree with
``metrics.json``, and on a terminal (a pseudo-terminal of no size, as ``script`` gives) a progress bar is drawn.

The slow evaluator is a real model whose forward pass sleeps in eval mode only: training is unaffected, every
evaluation on the server takes seconds.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time

import torch

from tests.conftest import PYTHON, REPO, job_args
from tests.fakes.slow_model import slow_model_env


def run_on_a_terminal(cmd: list[str], env: dict, timeout: float) -> tuple[int, str]:
    """Run ``cmd`` with its stdin, stdout and stderr on a new pseudo-terminal of no size; its exit code and output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    output, deadline = b"", time.time() + timeout
    try:
        while time.time() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the other side is closed: the job has ended
                    break
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        proc.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return proc.returncode, output.decode(errors="replace")


def test_a_slow_evaluator_never_loses_the_last_version_and_a_terminal_shows_a_bar(tmp_path):
    env = slow_model_env(tmp_path, seconds=1.5)
    flags = job_args(
        tmp_path,
        *"--method fedbuff --delays none --model slow_model:SlowToEvaluate --max-model-version 14".split(),
        *"--local-iters 1 --local-batch-size 8 --subset-size 16 --synthetic-size 1000 --eval-backlog skip".split(),
    )
    code, output = run_on_a_terminal([PYTHON, "jobs/pt_job_fedrevive.py", *flags], env, timeout=400)
    assert code == 0, output[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    evaluated = [r["version"] for r in metrics["versions"]]
    assert evaluated[-1] == 14 == metrics["outcome"]["version"], evaluated
    assert len(evaluated) < 14 and sum(r.get("skipped", 0) for r in metrics["versions"]) == 14 - len(evaluated)
    assert "older version(s) not evaluated" in output
    summary = metrics["summary"]
    assert summary["last_version"] == summary["last_evaluated_version"] == 14
    assert f"13 version(s) trained, {len(evaluated)} evaluated" in output
    assert f"final accuracy {summary['final_accuracy']:.4f} (version 14)" in output
    # Nothing was cut short: none of our own warnings. (NVFlare may log that it dropped a leaf's update that
    # arrived after the job's last task ended: a device trained past the last version, which no run keeps.)
    assert "[edgesim] warning" not in output.lower()
    saved = torch.load(tmp_path / "out" / "global_model.pt")
    assert set(saved) == {"net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"}
    assert "[edgesim] versions:" in output and "%|" in output  # the tqdm bar, drawn on the terminal

"""No model or diff is ever rendered as text on the per-device path of a real run.

A ``sitecustomize`` on ``PYTHONPATH`` (``tests/repr_guard``) makes every process of the run record any numpy
``repr``/``str`` of a large array. NVFlare's leaf executor and device simulator do that in debug f-strings that
run even with debug logging off (about 15 ms per device each); our executor and simulator must not.
"""

import os
import subprocess

from tests.conftest import PYTHON, REPO, job_args

GUARD_DIR = os.path.join(REPO, "tests", "repr_guard")


def run_guarded(tmp_path, script: str, *flags: str) -> str:
    guard = tmp_path / "rendered.txt"
    env = dict(os.environ, EDGESIM_REPR_GUARD=str(guard))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (GUARD_DIR, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([PYTHON, script, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return guard.read_text() if guard.exists() else ""


def test_guard_sees_a_rendered_array(tmp_path):
    """The guard itself works in a child process: rendering a large array is recorded."""
    rendered = run_guarded(tmp_path, "-c", "import numpy as np; f'{np.zeros(5000)}'")
    assert "rendered an array of 5000 elements" in rendered


def test_fedavg_run_renders_no_model_or_diff(tmp_path):
    rendered = run_guarded(tmp_path, "jobs/pt_job_fedavg.py", *job_args(tmp_path, "--max-model-version", "3"))
    assert rendered == "", rendered[:4000]

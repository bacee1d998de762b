"""No model or diff is ever rendered as text on the per-device path of a real run.

A ``sitecustomize`` on ``PYTHONPATH`` (``tests/repr_guard``) makes every process of the run record any numpy
``repr``/``str`` of a large array. NVFlare's leaf executor and device simulator do that in debug f-strings that
run even with debug logging off (about 15 ms per device each); our executor and simulator must not. The real run
under the guard is ``tests/e2e/test_fedavg.py``'s SimEnv run (one job checks both).
"""

from tests.conftest import run_guarded


def test_guard_sees_a_rendered_array(tmp_path):
    """The guard itself works in a child process: rendering a large array is recorded."""
    _, rendered = run_guarded(tmp_path, "-c", "import numpy as np; f'{np.zeros(5000)}'")
    assert "rendered an array of 5000 elements" in rendered

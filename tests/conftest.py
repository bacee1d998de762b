"""Shared fixtures: small synthetic data, a task processor factory, and helpers to run the real job entry points.

Every test under ``tests/e2e`` runs real NVFlare jobs for tens of seconds each: it is marked ``slow`` here, so
``pytest -m "not slow"`` is the fast subset (CI runs everything).
"""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
E2E_DIR = os.path.join(REPO, "tests", "e2e")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(item.path).startswith(E2E_DIR):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def fresh_weights_cache(monkeypatch):
    """Each test gets an empty per-process cache of converted global weights (``processors.task_processor``): the
    cache is keyed by version number only, and tests reuse version numbers with different models. Its cache of
    devices' sample indices is emptied too: tests replace ``device_indices``."""
    task_processor = sys.modules.get("processors.task_processor")
    if task_processor is not None:
        monkeypatch.setattr(task_processor, "_global_params", {})
        task_processor._device_indices.cache_clear()


@pytest.fixture(scope="session")
def small_data():
    from processors.data.sources import make_synthetic

    return make_synthetic(2000, 400, seed=0)


def make_processor(
    synthetic_size: int = 2000, seed: int = 0, subset_size: int = 350, profile: str = "high", **training
):
    """The job's task processor on synthetic data and the CPU; ``training`` overrides ``TrainingConfig`` fields."""
    from processors.data.config import DataConfig
    from processors.task_processor import TrainingTaskProcessor
    from processors.training import TrainingConfig

    data = DataConfig(synthetic_size=synthetic_size, subset_size=subset_size)
    training = TrainingConfig(**({"compute_device": "cpu"} | training))
    return TrainingTaskProcessor(data=data.to_dict(), training=training.to_dict(), seed=seed, profile=profile)


def job_args(tmp_path, *extra: str, output: bool = True) -> list[str]:
    """Flags for a small but real NVFlare run: 2 leaves, 8 devices a round, synthetic data."""
    return (["--output", str(tmp_path / "out")] if output else []) + [
        "--num-leaf-nodes",
        "2",
        "--devices-per-leaf",
        "6",
        "--device-selection-size",
        "8",
        "--synthetic-size",
        "3000",
        "--local-lr",
        "1e-3",
        "--workspace",
        str(tmp_path / "ws"),
        *extra,
    ]


GUARD_DIR = os.path.join(REPO, "tests", "repr_guard")


def run_guarded(tmp_path, script: str, *flags: str) -> tuple[str, str]:
    """Run ``script`` (or ``-c CODE``) with ``tests/repr_guard`` in every process of it: its stdout, and every
    numpy rendering of a large array the guard recorded ("": none; ``tests/e2e/test_no_payload_rendering.py``)."""
    import subprocess

    guard = tmp_path / "rendered.txt"
    env = dict(os.environ, EDGESIM_REPR_GUARD=str(guard))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (GUARD_DIR, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([PYTHON, script, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, guard.read_text() if guard.exists() else ""

"""Shared fixtures: small synthetic data, and helpers to run the real job entry points."""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def small_data():
    from processors.data.sources import make_synthetic

    return make_synthetic(2000, 400, seed=0)


def job_args(tmp_path, *extra: str, output: bool = True) -> list[str]:
    """Flags for a small but real NVFlare run: 2 leaves, 8 devices a round, synthetic data."""
    return (["--output", str(tmp_path / "out")] if output else []) + [
        "--num-leaf-nodes", "2",
        "--devices-per-leaf", "6",
        "--device-selection-size", "8",
        "--synthetic-size", "3000",
        "--local-lr", "1e-3",
        "--workspace", str(tmp_path / "ws"),
        *extra,
    ]  # fmt: skip


PYTHON = sys.executable

"""The build step (``jobs.build``): one run's config is derived once, from the flags to the driver, and only a
resolved config runs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

import common.privacy_accounting
import jobs.build
import jobs.privacy
import jobs.run.driver
import jobs.run.schedule_plan
from jobs.config import JobConfig
from tests.conftest import REPO

pytest.importorskip("dp_accounting")

FEDBUFF_DP = [
    "--method", "fedbuff", "--dp", "central", "--dp-noise", "seeded", "--dp-target-epsilon", "8",
    "--dp-clip-norm", "0.05", "--num-leaf-nodes", "2", "--devices-per-leaf", "6", "--device-selection-size", "8",
    "--synthetic-size", "3000", "--max-model-version", "6", "--seed", "7",
]  # fmt: skip
WALK_CEILING = 115  # benchmarks/checks/config_walk.py's count at this commit (a ratchet); issue 58's goal is 40


def counted(monkeypatch, calls: Counter, owner, name: str) -> None:
    """Count the calls of ``owner.name`` (a function or a method), keeping what it does."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        calls[name] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def test_one_dp_run_derives_each_value_once_from_its_flags_to_the_driver(tmp_path, monkeypatch):
    """FedBuff with central DP, seeded noise and a target epsilon, through the job's own entry and the driver (a
    dry run: the schedule, no NVFlare): the auto model, the results folder, the validation, the privacy plan, the
    schedule and its timeline, the noise and its key are each computed once."""
    from jobs.cli import job_main

    calls: Counter = Counter()
    for owner, name in (
        (jobs.build, "auto_model"),
        (jobs.build, "results_folder"),
        (jobs.build, "resolve_privacy"),
        (JobConfig, "validate"),
        (jobs.run.schedule_plan, "make_schedule"),
        (jobs.run.schedule_plan, "run_timeline"),
        (common.privacy_accounting, "noise_for_epsilon"),
        (jobs.privacy, "noise_key"),
    ):
        counted(monkeypatch, calls, owner, name)
    out = tmp_path / "out"
    assert job_main("test", [*FEDBUFF_DP, "--dry-run", "--output", str(out)]) == 0
    assert os.path.exists(out / "timeline.json")
    once = ["auto_model", "results_folder", "resolve_privacy", "validate", "noise_for_epsilon", "noise_key"]
    assert {k: calls[k] for k in once} == dict.fromkeys(once, 1)
    assert calls["make_schedule"] == calls["run_timeline"] == 1  # planned for the noise; the dry run writes it


def test_the_driver_runs_only_a_resolved_config_and_a_copy_is_resolved_again(tmp_path):
    cfg = jobs.build.build_config("fedavg", {"output": str(tmp_path / "out"), "dry_run": True})
    assert cfg.resolved and cfg.training.model == "cifar10_convnet"
    copy = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, seed=1))
    assert not copy.resolved  # a changed config may need every derived value again
    with pytest.raises(TypeError, match="resolved config only"):
        jobs.run.driver.run(copy)
    assert jobs.build.resolve(cfg) is cfg  # nothing is derived again
    assert jobs.build.resolve(copy).resolved
    by_hand = jobs.build.resolve(JobConfig())
    assert by_hand.training.model == "cifar10_convnet" and by_hand.run.job_name == "edgesim_fedavg"
    assert by_hand.output_dir.startswith(os.path.expanduser(by_hand.run.workspace))


def test_building_a_dp_config_walks_back_into_a_module_at_most_the_ceiling():
    """``benchmarks/checks/config_walk.py`` in a fresh process: the returns into a module the build had left."""
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "checks", "config_walk.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=REPO,
    )
    found = json.loads(done.stdout)
    assert "jobs.build" in found["modules"] and "jobs.privacy" in found["modules"]
    assert 0 < found["returns"] <= WALK_CEILING, found

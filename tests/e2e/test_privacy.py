"""Real DP-FedBuff runs (SimEnv, 2 leaves). Central DP with adaptive clipping, a target epsilon and seeded noise
records epsilon and the accountant's inputs for every version; the recorded epsilon is never below what
dp-accounting gives, called directly, for the busiest device's actual versions read from ``events.jsonl``,
composed unamplified at the relation's sensitivity; nothing un-noised is published; no device goes into a version
twice; and a run killed and resumed from its checkpoint ends bit for bit like the uninterrupted one. With secure
noise (the default), two runs of one command follow the same seeded schedule but release different models."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest

from tests.conftest import PYTHON, REPO, SMALL_JOB, checkpoint_version, digest, kill_tree, wait_for
from tests.e2e.job_runs import resume

dp_accounting = pytest.importorskip("dp_accounting")

FLAGS = [
    *SMALL_JOB,
    *("--seed", "7", "--method", "fedbuff", "--max-model-version", "14", "--checkpoint-every", "2"),
    *("--dp", "central", "--dp-target-epsilon", "8", "--dp-clip-norm", "0.05", "--dp-noise", "seeded"),
    *("--dp-adaptive-clipping", "--dp-count-noise", "2"),
]
FIELDS = {"mechanism", "accountant", "noise_multiplier", "sampling_probability", "compositions", "delta", "epsilon"}


def command(out) -> list[str]:
    return [PYTHON, "jobs/pt_job_fedrevive.py", *FLAGS, "--output", str(out)]


def library_epsilon(noise_multiplier: float, compositions: int, delta: float) -> float:
    """dp-accounting directly: ``compositions`` unamplified Gaussians."""
    event = dp_accounting.GaussianDpEvent(noise_multiplier)
    return dp_accounting.rdp.RdpAccountant().compose(event, compositions).get_epsilon(delta)


def busiest_device_versions(results, up_to: int) -> int:
    """The most versions (made, at most ``up_to``) any one device's counted update went into, from the trace."""
    events = [json.loads(line) for line in (results / "events.jsonl").read_text().splitlines()]
    went = {(e["device"], e["version"]) for e in events if not e.get("failed") and e["version"] <= up_to}
    return max(Counter(d for d, _ in went).values())


def test_a_dp_fedbuff_run_records_epsilon_per_version_and_resumes_with_the_same_noise_and_epsilon(tmp_path):
    popen = dict(cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    whole = subprocess.Popen(command(tmp_path / "whole"), **popen)
    killed = subprocess.Popen(command(tmp_path / "killed"), **popen)
    try:
        wait_for(lambda: checkpoint_version(tmp_path / "killed") >= 6, killed, 300, "a checkpoint at version 6")
    finally:
        kill_tree(killed.pid)
    out, _ = whole.communicate(timeout=400)
    assert whole.returncode == 0, out[-3000:]
    assert "differential privacy (central)" in out and "epsilon" in out
    resumed = resume(tmp_path / "killed", *command(tmp_path / "killed"))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    metrics = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    records = [r["privacy"] for r in metrics["versions"]]
    assert [r["version"] for r in metrics["versions"]] == list(range(1, 15))
    assert all(FIELDS <= set(p) for p in records)
    assert all(p["sampling_probability"] == 1.0 and p["neighbouring"] == "replace-one" for p in records)
    epsilons = [p["epsilon"] for p in records]
    assert epsilons == sorted(epsilons) and epsilons[0] == 0 and 0 < epsilons[-1] <= 8.0
    sigma = metrics["config"]["privacy"]["dp_noise_multiplier"]
    for version, p in enumerate(records[1:], start=2):
        # the versions made so far (2..version): the busiest device's count, from the trace, not from our code
        busiest = busiest_device_versions(tmp_path / "whole", version)
        assert p["compositions"] == p["busiest_device_participations"] == busiest
        assert p["epsilon"] >= library_epsilon(sigma / 2, busiest, p["delta"]) * (1 - 1e-3)
    assert metrics["summary"]["epsilon"] == epsilons[-1]
    assert len({p["clip_norm"] for p in records}) > 5  # adaptive clipping moved it
    assert not any("clipped_fraction" in p or "server_clipped" in p for p in records)  # nothing un-noised
    events = [json.loads(line) for line in (tmp_path / "whole" / "events.jsonl").read_text().splitlines()]
    counted = Counter((e["device"], e["version"]) for e in events if not e.get("failed"))
    assert max(counted.values()) == 1

    again = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    assert [r["privacy"] for r in again["versions"]] == records
    for name in ("events.jsonl", "global_model.pt"):
        assert digest(tmp_path / "killed" / name) == digest(tmp_path / "whole" / name), name
    assert [r["accuracy"] for r in again["versions"]] == [r["accuracy"] for r in metrics["versions"]]


def test_secure_noise_makes_two_runs_of_one_command_release_different_models_on_the_same_schedule(tmp_path):
    flags = [*SMALL_JOB, "--seed", "7", "--method", "fedbuff", "--max-model-version", "4"]
    flags += ["--dp", "central", "--dp-noise-multiplier", "1.0", "--dp-clip-norm", "0.05"]  # secure: the default
    popen = dict(cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    runs = [
        subprocess.Popen([PYTHON, "jobs/pt_job_fedrevive.py", *flags, "--output", str(tmp_path / n)], **popen)
        for n in "ab"
    ]
    for run in runs:
        out, _ = run.communicate(timeout=400)
        assert run.returncode == 0, out[-3000:]
        assert "secure DP noise" in out
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "events.jsonl").read_bytes() == (b / "events.jsonl").read_bytes()  # the seeded schedule
    assert (a / "global_model.pt").read_bytes() != (b / "global_model.pt").read_bytes()  # fresh noise each run

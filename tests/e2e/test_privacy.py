"""A real DP-FedBuff run (SimEnv, 2 leaves): central DP with adaptive clipping and a target epsilon records epsilon
and the accountant's inputs for every version (equal to dp-accounting's from those inputs, within the target), the
clip norm moving and the fraction clipped; no device goes into a version twice; and a run killed and resumed from
its checkpoint ends bit for bit like the uninterrupted one, with the same noise and the same epsilon."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest

from tests.conftest import PYTHON, REPO, SMALL_JOB, checkpoint_version, kill_tree, wait_for

dp_accounting = pytest.importorskip("dp_accounting")

FLAGS = [
    *SMALL_JOB,
    *("--seed", "7", "--method", "fedbuff", "--max-model-version", "14", "--checkpoint-every", "2"),
    *("--dp", "central", "--dp-target-epsilon", "8", "--dp-clip-norm", "0.05"),
    *("--dp-adaptive-clipping", "--dp-count-noise", "2"),
]
FIELDS = {"mechanism", "accountant", "noise_multiplier", "sampling_probability", "compositions", "delta", "epsilon"}


def command(out) -> list[str]:
    return [PYTHON, "jobs/pt_job_fedrevive.py", *FLAGS, "--output", str(out)]


def library_epsilon(p: dict) -> float:
    event = dp_accounting.PoissonSampledDpEvent(
        p["sampling_probability"], dp_accounting.GaussianDpEvent(p["noise_multiplier"])
    )
    return dp_accounting.rdp.RdpAccountant().compose(event, p["compositions"]).get_epsilon(p["delta"])


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
    resumed = subprocess.run(
        [*command(tmp_path / "killed"), "--resume", str(tmp_path / "killed")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    metrics = json.loads((tmp_path / "whole" / "metrics.json").read_text())
    records = [r["privacy"] for r in metrics["versions"]]
    assert [r["version"] for r in metrics["versions"]] == list(range(1, 15))
    assert all(FIELDS <= set(p) for p in records)
    assert [p["compositions"] for p in records] == list(range(14))  # poisson: every version made is one
    assert all(p["sampling_probability"] == pytest.approx(2 / 24) for p in records)
    epsilons = [p["epsilon"] for p in records]
    assert epsilons == sorted(epsilons) and epsilons[0] == 0 and 0 < epsilons[-1] <= 8.0
    assert all(p["epsilon"] == pytest.approx(library_epsilon(p), rel=1e-3) for p in records[1:])
    assert metrics["summary"]["epsilon"] == epsilons[-1]
    assert len({p["clip_norm"] for p in records}) > 5  # adaptive clipping moved it
    assert all(0 <= p["clipped_fraction"] <= 1 for p in records[1:])
    events = [json.loads(line) for line in (tmp_path / "whole" / "events.jsonl").read_text().splitlines()]
    counted = Counter((e["device"], e["version"]) for e in events if not e.get("failed"))
    assert max(counted.values()) == 1

    again = json.loads((tmp_path / "killed" / "metrics.json").read_text())
    assert [r["privacy"] for r in again["versions"]] == records
    for name in ("events.jsonl", "global_model.pt"):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert [r["accuracy"] for r in again["versions"]] == [r["accuracy"] for r in metrics["versions"]]

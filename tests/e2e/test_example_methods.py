"""The example methods (``examples/``) run as users run them, ``--method module:Class`` on the command line, on
real NVFlare jobs with exact simulated time: the project's schedule drives each (its trace equals the reference
schedule's), the method's settings are recorded, and its versions move the model. FedProx's device hook changes
what devices train: the same seeded run as plain FedAvg, with the same trace, ends with another model.

Plain FedAvg's two runs are also ``tests/e2e/test_exact_time.py``'s FedAvg case (one pair of jobs serves both):
its trace equals the reference schedule's, exactly B updates a version, and it repeats, accuracies included,
across worker counts and sync intervals.

The jobs run at once (their results do not depend on it: exact time)."""

from __future__ import annotations

import collections
import json
import os
import subprocess

import torch

from tests.conftest import PYTHON, REPO
from tests.e2e.test_exact_time import COMMON, METHODS, reference

EXAMPLES = os.path.join(REPO, "examples")
RUNS = {  # name: (flags, the reference schedule it must follow)
    "fedasync": (["--method", "fedasync:FedAsync", "--fa-alpha", "0.8", "--max-model-version", "8"], "fedrevive"),
    "nvflare_weighting": (
        ["--method", "fedbuff_nvflare_weighting:NVFlareWeightedFedBuff", "--max-model-version", "12"]
        + "--num-updates-for-model 2 --min-hole-to-fill 1 --global-lr 0.5".split(),
        "fedbuff",
    ),
    "fedprox": (["--method", "fedprox:FedProx", "--prox-mu", "1.0", "--max-model-version", "4"], "fedavg"),
    # the exact-time FedAvg pair: across worker counts and sync intervals
    "fedavg": (
        ["--method", "fedavg", "--max-model-version", "4", "--num-workers", "1", "--update-interval", "0.1"],
        "fedavg",
    ),
    "fedavg_again": (
        ["--method", "fedavg", "--max-model-version", "4", "--num-workers", "2", "--update-interval", "0.4"],
        "fedavg",
    ),
}


def test_the_example_methods_run_from_the_command_line_on_exact_time(tmp_path):
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (EXAMPLES, os.environ.get("PYTHONPATH")) if p)}
    procs = {}
    try:
        for name, (flags, _) in RUNS.items():
            out = ["--output", str(tmp_path / name / "out"), "--workspace", str(tmp_path / name / "ws")]
            procs[name] = subprocess.Popen(
                [PYTHON, "jobs/pt_job_fedrevive.py", *COMMON, *flags, *out],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        outputs = {name: proc.communicate(timeout=500)[0] for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    metrics, traces = {}, {}
    for name, (_, schedule) in RUNS.items():
        assert procs[name].returncode == 0, outputs[name][-3000:]
        out = tmp_path / name / "out"
        traces[name] = trace = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        assert trace == reference(schedule), name
        metrics[name] = json.loads((out / "metrics.json").read_text())
        accuracies = [r["accuracy"] for r in metrics[name]["versions"]]
        assert len(set(accuracies)) > 1, (name, accuracies)  # the versions changed the model
    # exact time (test_exact_time.py's FedAvg case): exactly B updates a version, the same trace and accuracies
    assert set(collections.Counter(r["version"] for r in traces["fedavg"]).values()) == {METHODS["fedavg"][0]}
    assert traces["fedavg_again"] == traces["fedavg"]
    accuracy, accuracy_again = ([r["accuracy"] for r in metrics[n]["versions"]] for n in ("fedavg", "fedavg_again"))
    assert accuracy_again == accuracy
    assert metrics["fedasync"]["config"]["method"] == "fedasync:FedAsync"
    assert metrics["fedasync"]["config"]["method_settings"] == {"alpha": 0.8, "exponent": 0.5}
    assert metrics["fedprox"]["config"]["method_settings"] == {"mu": 1.0}
    prox, plain = (torch.load(tmp_path / name / "out" / "global_model.pt") for name in ("fedprox", "fedavg"))
    moved = {k: float((prox[k] - plain[k]).abs().max()) for k in plain}
    assert max(moved.values()) > 1e-4, moved  # the proximal term changed what the devices trained

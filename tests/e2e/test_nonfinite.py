"""Issue 56's NaN cases as real FedAvg jobs (SimEnv, 2 leaves of 10 devices, 8 versions, a small MLP on 16 float
features and three classes). The poisoned dataset (NaN in one feature of 25 of its 2,500 training rows) is refused
before any process starts, in one line, exit 2
(``tests/jobs/test_refused_in_process.py``). With ``--dataset-nonfinite drop`` it learns as the clean dataset
does. A trainer whose one device returns NaN and inf in its diff (``tests.fakes.nonfinite.NaNDeviceTrainer``)
leaves the released model finite, its accuracy within noise of the clean run's, and that device counted failed
with the reason in ``events.jsonl``. The three jobs run at once."""

from __future__ import annotations

import json
import os
import subprocess

import torch

from tests.conftest import PYTHON, REPO
from tests.e2e.test_interrupts import JOB_WITH_TRAINER
from tests.fakes.nonfinite import NAN_DEVICE, NAN_ROWS

COMMON = [
    *("--method", "fedavg", "--model", "tests.fakes.nonfinite:Mlp", "--num-leaf-nodes", "2"),
    *("--devices-per-leaf", "10", "--device-selection-size", "10", "--max-model-version", "8", "--seed", "0"),
]
ENV = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
# the accuracies of runs on the same separable data: the clean run reaches about 0.99 in 8 versions
WITHIN_NOISE = 0.05


def _flags(tmp_path, name: str, *extra: str) -> list[str]:
    return [*COMMON, *extra, "--output", str(tmp_path / name / "out"), "--workspace", str(tmp_path / name / "ws")]


def test_dropped_rows_and_a_nan_device_leave_a_finite_model_that_learns_as_the_clean_run(tmp_path):
    runs = {
        "clean": [
            PYTHON,
            "jobs/pt_job_fedrevive.py",
            *_flags(tmp_path, "clean", "--dataset", "tests.fakes.nonfinite:clean"),
        ],
        "drop": [
            PYTHON,
            "jobs/pt_job_fedrevive.py",
            *_flags(tmp_path, "drop", "--dataset", "tests.fakes.nonfinite:poisoned", "--dataset-nonfinite", "drop"),
        ],
        "nan-device": [
            *(PYTHON, "-c", JOB_WITH_TRAINER, "tests.fakes.nonfinite:NaNDeviceTrainer"),
            *_flags(tmp_path, "nan-device", "--dataset", "tests.fakes.nonfinite:clean"),
        ],
    }
    procs = {
        name: subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, cmd in runs.items()
    }
    try:
        outputs = {name: proc.communicate(timeout=400)[0] for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    results = {}
    for name, proc in procs.items():
        assert proc.returncode == 0, (name, outputs[name][-3000:])
        out = tmp_path / name / "out"
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["outcome"]["status"] == "completed", (name, metrics["outcome"])
        model = torch.load(out / "global_model.pt", weights_only=True)
        assert all(torch.isfinite(t).all() for t in _tensors(model)), name
        results[name] = metrics["versions"][-1]["accuracy"], [json.loads(x) for x in (out / "events.jsonl").open()]
    clean_accuracy = results["clean"][0]
    assert clean_accuracy > 0.9, clean_accuracy  # the data is learnable: the comparison means something
    assert abs(results["drop"][0] - clean_accuracy) <= WITHIN_NOISE, results["drop"][0]
    assert abs(results["nan-device"][0] - clean_accuracy) <= WITHIN_NOISE, results["nan-device"][0]
    assert f"{NAN_ROWS} training and 0 test rows holding NaN or inf left out" in outputs["drop"]

    failed = [e for e in results["nan-device"][1] if e.get("failed")]
    assert failed and {e["device"] for e in failed} == {NAN_DEVICE}, failed
    assert all("its update holds NaN or inf" in e["error"] and "refused at its leaf" in e["error"] for e in failed)
    assert not any(e.get("failed") for e in results["clean"][1] + results["drop"][1])


def _tensors(saved) -> list[torch.Tensor]:
    """Every tensor in a saved model, whatever its nesting."""
    if isinstance(saved, torch.Tensor):
        return [saved]
    if isinstance(saved, dict):
        return [t for v in saved.values() for t in _tensors(v)]
    return []

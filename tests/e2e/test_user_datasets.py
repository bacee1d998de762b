"""Real jobs on per-user data, run at once: generated LEAF FEMNIST with FedAvg, a generated TFF EMNIST file with
FedBuff (both with ``--partition natural``: each device one writer; the FedBuff job trains ``--local-epochs 8``, so
writers of unequal size take unequal simulated time, which ``--dry-run`` must plan byte for byte), and generated LEAF
Shakespeare with LEAF's char-LSTM (each device one speaking role; token ids through the leaves' task processor and
the server's evaluator). Small: 2 leaves, a few versions."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from tests.conftest import PYTHON, REPO
from tests.fakes.user_formats import write_leaf_femnist, write_leaf_shakespeare, write_tff_emnist

MODEL = """
from torch import nn


class Net(nn.Module):
    def __init__(self, init_seed=None):  # taken and ignored: the project seeds the initial weights anyway
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 62))

    def forward(self, x):
        return self.net(x)
"""


def _flags(root, *extra: str, model: str = "users_pkg.models:Net") -> list[str]:
    return [
        *("--output", str(root / "out"), "--workspace", str(root / "ws")),
        *("--num-leaf-nodes", "2", "--devices-per-leaf", "8", "--device-selection-size", "6"),
        *("--partition", "natural", "--model", model, "--local-batch-size", "8"),
        *("--local-lr", "3e-3", "--max-model-version", "4", "--data-root", str(root / "data")),
        *extra,
    ]


@pytest.mark.slow
def test_leaf_femnist_tff_emnist_and_leaf_shakespeare_train_by_user(tmp_path):
    package = tmp_path / "src" / "users_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(textwrap.dedent(MODEL))
    writers = write_leaf_femnist(tmp_path / "leaf" / "data", users=12)
    h5 = write_tff_emnist(tmp_path / "tff" / "files", clients=10)
    roles = write_leaf_shakespeare(tmp_path / "text" / "data", users=6)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path / "src"), REPO])}
    runs = {  # the job script, its flags
        "leaf": ("pt_job_fedavg.py", _flags(tmp_path / "leaf", "--dataset", "femnist")),
        "tff": (
            "pt_job_fedrevive.py",  # the asynchronous methods' script
            tff_flags := _flags(
                tmp_path / "tff",
                "--dataset",
                h5,
                "--method",
                "fedbuff",
                "--num-updates-for-model",
                "3",
                "--local-epochs",
                "8",  # each writer trains over all its own samples: unequal work and time
            ),
        ),
        "text": (
            "pt_job_fedavg.py",
            [
                *_flags(tmp_path / "text", "--dataset", "shakespeare", model="char_lstm"),
                *("--local-iters", "2", "--max-model-version", "2"),  # the last of a repeated flag wins
            ],
        ),
    }
    procs = {
        name: subprocess.Popen(
            [PYTHON, os.path.join(REPO, "jobs", job), *flags],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, (job, flags) in runs.items()
    }
    try:
        outputs = {name: proc.communicate(timeout=400)[0] for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    # the timing-only planner accounts for each writer's work as the real run did: the same events, byte for byte
    dry = [*tff_flags, "--dry-run"]
    dry[dry.index(str(tmp_path / "tff" / "out"))] = str(tmp_path / "tff-dry")
    planned = subprocess.run(
        [PYTHON, os.path.join(REPO, "jobs", "pt_job_fedrevive.py"), *dry],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    events = (tmp_path / "tff" / "out" / "events.jsonl").read_bytes()
    assert events and events == (tmp_path / "tff-dry" / "events.jsonl").read_bytes()
    text = json.load(open(tmp_path / "text" / "out" / "metrics.json"))
    assert procs["text"].returncode == 0 and text["outcome"]["status"] == "completed", outputs["text"][-3000:]
    assert text["partition"]["users"] == len(roles) and text["partition"]["devices"] == 16
    assert [r["version"] for r in text["versions"]] == [1, 2] and all(
        0.0 <= r["accuracy"] <= 1.0 for r in text["versions"]
    )
    # the planner counted the fused LSTM: one device at a time on the CPU (measured faster, bench_engine.py)
    assert text["planner"]["engine"] == "per-device" and "MFLOP per training sample" in text["planner"]["engine_reason"]
    for name, users in {"leaf": len(writers), "tff": 10}.items():
        assert procs[name].returncode == 0, outputs[name][-3000:]
        metrics = json.load(open(tmp_path / name / "out" / "metrics.json"))
        assert metrics["outcome"]["status"] == "completed"
        partition = metrics["partition"]
        assert partition["users"] == users and partition["devices"] == 16
        sizes = partition["samples_per_user"]
        assert sizes["min"] < sizes["max"] and 0 < sizes["gini"] < 1  # users hold unequal amounts
        assert metrics["versions"][-1]["accuracy"] > 0.5  # 8 patterns: chance is 0.125
        spread = metrics["versions"][-1]["per_user"]  # every user has test samples: each scored on its own
        assert spread["users"] == users and spread["min"] <= spread["median"] <= spread["max"]
        assert (tmp_path / name / "out" / "accuracy.png").stat().st_size > 0
        reports = (tmp_path / name / "out" / "leaf_site-1.jsonl").read_text().splitlines()
        assert reports and all(json.loads(line)["ok"] for line in reports)

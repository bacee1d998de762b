"""A real FedBuff run (SimEnv, 2 leaves) with top-k and error feedback on slow uplinks, each device's drawn from a
log-normal: it completes, each update's line of ``events.jsonl`` records its encoded bytes, the trace is the one
the dry-run planner plans from those bytes over each device's own link (the job script's entry point in this
process: a dry run starts no NVFlare), and ``metrics.json`` counts the bytes moved."""

from __future__ import annotations

import json
import math
import subprocess

from jobs.pt_job_fedrevive import main as fedrevive_job
from tests.conftest import PYTHON, REPO, SMALL_JOB

VALUES = 62050  # cifar10_convnet's update
FLAGS = [
    *SMALL_JOB,
    *("--seed", "4", "--method", "fedbuff", "--max-model-version", "5"),
    *("--compress", "topk:0.1", "--uplink-kbps", "lognormal:200:1", "--downlink-kbps", "2000"),
]


def run(out, *extra: str) -> subprocess.CompletedProcess:
    command = [PYTHON, "jobs/pt_job_fedrevive.py", *FLAGS, "--output", str(out), *extra]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400, check=False)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_compressed_run_times_its_uploads_by_their_bytes(tmp_path):
    done = run(tmp_path / "run", "--workspace", str(tmp_path / "ws"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert fedrevive_job([*FLAGS, "--output", str(tmp_path / "plan"), "--dry-run"]) == 0
    events = lines(tmp_path / "run" / "events.jsonl")
    expected = 8 * math.ceil(0.1 * VALUES)
    counted = [e for e in events if not e.get("failed")]
    assert counted and all(e["upload_bytes"] == expected for e in counted)
    assert [{k: v for k, v in e.items() if k != "error"} for e in events] == lines(tmp_path / "plan" / "events.jsonl")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["outcome"]["status"] == "completed"
    assert metrics["summary"]["bytes_up"] == expected * len(counted)  # every counted update, to the last version
    assert metrics["summary"]["bytes_down"] % (4 * VALUES) == 0 and metrics["summary"]["bytes_down"] > 0
    assert (tmp_path / "run" / "error_feedback").is_dir()  # each device's residual, kept for --resume


def test_nvflares_float16_filters_run_in_the_job_and_time_their_bytes(tmp_path):
    """``--compress nvflare:float16``: the leaves run NVFlare's ModelQuantizer and ModelDequantizer on each update;
    each upload is NVFlare's float16 payload, 2 bytes a value, over the device's uplink."""
    import importlib.util

    import pytest

    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("NVFlare's quantization filters import bitsandbytes (pip install bitsandbytes)")
    flags = [*SMALL_JOB, "--seed", "4", "--method", "fedbuff", "--max-model-version", "4"]
    flags += ["--compress", "nvflare:float16", "--uplink-kbps", "uniform:100:400", "--output", str(tmp_path / "run")]
    command = [PYTHON, "jobs/pt_job_fedrevive.py", *flags, "--workspace", str(tmp_path / "ws")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    counted = [e for e in lines(tmp_path / "run" / "events.jsonl") if not e.get("failed")]
    assert counted and all(e["upload_bytes"] == 2 * VALUES for e in counted)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["outcome"]["status"] == "completed"
    assert metrics["summary"]["bytes_up"] == 2 * VALUES * len(counted)

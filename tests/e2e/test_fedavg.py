"""Real NVFlare runs of the FedAvg job: in SimEnv with either training engine (the vectorised one, the default for
models without BatchNorm, and the per-device one), and exported then run by the ``nvflare simulator`` CLI."""

import glob
import json
import os
import subprocess

import pytest
import torch

from jobs.pt_job_fedavg import main as fedavg_job
from processors.models import build_model
from tests.conftest import PYTHON, REPO, job_args, kill_tree, run_guarded

CHANCE = 0.1


def _run(args, timeout=400):
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def simenv_runs(tmp_path_factory) -> dict[str, tuple]:
    """Two real SimEnv FedAvg runs at once (one start-up's wait, not two). ``vectorized``: the vectorised engine in
    groups of 3, with ``tests/repr_guard`` in every process, checked by the first three tests below; returns
    (results folder, stdout, what the guard recorded). ``per-device``: the per-device engine; returns (results
    folder, stdout, stderr, exit code)."""
    tmp = tmp_path_factory.mktemp("fedavg")
    alone = tmp / "per-device"
    per_device = subprocess.Popen(
        [PYTHON, "jobs/pt_job_fedavg.py", *job_args(alone, "--engine", "per-device", "--max-model-version", "3")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        flags = job_args(tmp, "--max-model-version", "3", "--engine", "vectorized", "--group-size", "3")
        out, rendered = run_guarded(tmp, "jobs/pt_job_fedavg.py", *flags)
        stdout, stderr = per_device.communicate(timeout=400)
    finally:
        if per_device.poll() is None:
            kill_tree(per_device.pid)
    return {
        "vectorized": (tmp / "out", out, rendered),
        "per-device": (alone / "out", stdout, stderr, per_device.returncode),
    }


@pytest.fixture(scope="module")
def simenv_run(simenv_runs) -> tuple:
    return simenv_runs["vectorized"]


def test_no_process_of_a_run_renders_a_model_or_diff_as_text(simenv_run):
    _, _, rendered = simenv_run
    assert rendered == "", rendered[:4000]


def test_the_vectorized_engine_trains_every_selected_device_in_its_groups(simenv_run):
    results, out, _ = simenv_run
    assert "engine: vectorized, groups of 3 device(s)" in out
    metrics = json.loads((results / "metrics.json").read_text())
    assert (metrics["planner"]["engine"], metrics["planner"]["group_size"]) == ("vectorized", 3)
    reports = [json.loads(line) for f in glob.glob(str(results / "leaf_*.jsonl")) for line in open(f)]
    assert all(r["ok"] for r in reports) and max(r["group"] for r in reports) == 3


def test_the_per_device_engine_trains_every_selected_device_and_learns(simenv_runs):
    """The per-device engine in a real SimEnv run (once a module of its own): its job runs beside the vectorised one."""
    results, stdout, stderr, code = simenv_runs["per-device"]
    engine, group = "per-device", 1
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert f"engine: {engine}, groups of {group} device(s)" in stdout
    metrics = json.loads((results / "metrics.json").read_text())
    assert (metrics["planner"]["engine"], metrics["planner"]["group_size"]) == (engine, group)
    assert max(r["accuracy"] for r in metrics["versions"][1:]) > 0.2, metrics["versions"]
    reports = [json.loads(line) for f in glob.glob(str(results / "leaf_*.jsonl")) for line in open(f)]
    assert all(r["ok"] for r in reports) and max(r["group"] for r in reports) == group


def test_fedavg_in_simenv_learns_and_writes_all_outputs(simenv_run):
    results, out, _ = simenv_run
    assert "Parallel workers:" in out and "[edgesim] version 3/3" in out and "devices trained per second" in out
    metrics = json.loads((results / "metrics.json").read_text())
    versions = metrics["versions"]
    assert [r["version"] for r in versions] == [1, 2, 3]
    assert max(r["accuracy"] for r in versions[1:]) > 2 * CHANCE, versions
    assert metrics["config"]["federation"]["device_selection_size"] == 8 and metrics["planner"]["num_workers"] >= 1
    assert metrics["environment"]["nvflare"].startswith("2.9")
    assert metrics["summary"]["versions_trained"] == 2
    # the evaluator's system monitor: per-version figures, a summary and (possibly empty) warnings
    has_gpu = torch.cuda.is_available()
    for r in versions:
        assert isinstance(r["system"]["cpu_percent"], float) and isinstance(r["system"]["ram_used_gb"], float)
        if not has_gpu:
            assert r["system"]["gpu_util_percent"] is None and r["system"]["vram_used_gb"] is None
    assert versions[-1]["devices_per_second"] > 0
    assert metrics["system"]["num_samples"] > 0 and isinstance(metrics["system"]["cpu_percent_mean"], float)
    assert isinstance(metrics["system"]["warnings"], list)
    if not has_gpu:
        assert metrics["system"]["gpus"] is None
    assert "[edgesim] system: " in out
    model = build_model("cifar10_convnet")
    model.load_state_dict(torch.load(results / "global_model.pt"))
    assert (results / "accuracy.png").stat().st_size > 1000
    assert glob.glob(str(results / "tensorboard" / "events.out.tfevents.*"))
    # 8 devices a round: each round's selected devices all reported (synchronous), once each
    reports = [json.loads(line) for f in glob.glob(str(results / "leaf_*.jsonl")) for line in open(f)]
    for version in (1, 2):
        devices = [r["device"] for r in reports if r["version"] == version]
        assert len(devices) == len(set(devices)) == 8, reports


def test_exported_job_runs_under_nvflare_simulator_cli(tmp_path):
    export = tmp_path / "export"
    flags = job_args(tmp_path, "--max-model-version", "2", "--export-only", str(export), output=False)
    assert fedavg_job(flags) == 0  # the job script's entry point, here: an export starts no process
    job_dir = export / "edgesim_fedavg"
    assert (job_dir / "meta.json").exists()
    server_config = next(job_dir.glob("**/config_fed_server.json")).read_text()
    assert '"init_seed": 0' in server_config and "edgesim_evaluator" in server_config
    nvflare = os.path.join(os.path.dirname(PYTHON), "nvflare")
    workspace = tmp_path / "cli_ws"
    out = _run([nvflare, "simulator", str(job_dir), "-w", str(workspace), "-n", "2", "-t", "2"])
    results = workspace / "server" / "simulate_job" / "app_server"  # where the README says they are
    versions = json.loads((results / "metrics.json").read_text())["versions"]
    assert [r["version"] for r in versions] == [1, 2]
    for name in ("events.jsonl", "global_model.pt", "accuracy.png", "leaf_site-1.jsonl", "leaf_site-2.jsonl"):
        assert (results / name).exists(), name  # the files a SimEnv run writes
    assert glob.glob(str(results / "tensorboard" / "events.out.tfevents.*"))
    for version in (1, 2):  # each progress line once, as NVFlare's console log line
        assert out.count(f"[edgesim] version {version}/2 |") == 1, out[-3000:]

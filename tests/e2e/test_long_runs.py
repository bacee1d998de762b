"""Long runs survive: a run killed with SIGKILL and resumed ends exactly where an uninterrupted run ends (on a
diurnal fleet, a FedScale availability trace, or measured speeds: the uninterrupted run
equals the reference schedule too); two runs at once both finish; a dead server or a lost leaf is noticed, the run
ends non-zero with the reason, and nothing is left running. The killed runs move their diffs and versions through
shared memory (``--bulk auto``): a leaf and then the server killed leave nothing of it behind."""

from __future__ import annotations

import collections
import json
import os
import pickle
import subprocess
import time
from dataclasses import replace

import psutil
import pytest
import torch

from benchmarks.lib.fedrevive_small import FEDREVIVE_SMALL
from common.delays import DELAY_PRESETS
from jobs.config import JobConfig
from jobs.run.schedule_plan import schedule_for
from scheduling.event_reference import reference_trace
from tests.conftest import DIURNAL, PYTHON, REPO, SMALL_JOB, checkpoint_version, digest, kill_tree, wait_for
from tests.e2e.job_runs import finish, resume

PAPER = DELAY_PRESETS["paper"]

SMALL = [*SMALL_JOB, "--seed", "5", "--eval-frequency", "4"]
METHOD_FLAGS = {
    "fedavg": ["--method", "fedavg", "--max-model-version", "8", "--global-lr", "1.0"],
    "fedbuff": ["--method", "fedbuff", "--max-model-version", "24", "--global-lr", "0.5"],
    "fedrevive": ["--method", "fedrevive", "--max-model-version", "24", "--global-lr", "0.5", *FEDREVIVE_SMALL],
}


def start(tmp_path, name: str, *flags: str) -> subprocess.Popen:
    out = tmp_path / name
    return subprocess.Popen(
        [PYTHON, "jobs/pt_job_fedrevive.py", *SMALL, *flags, "--output", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def shared_memory_of(pids: list[int]) -> set[str]:
    """The rings of shared memory (``common.shared_ring``) these processes hold open or mapped."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                found |= {line.split()[-2] for line in f if "memfd:edgesim-" in line}
        except OSError:  # it ended
            pass
    return found


def kill_a_leaf_then_the_server(proc: subprocess.Popen) -> list[psutil.Process]:
    """SIGKILL one leaf, then the server, then whatever is left of the job (a crash of each, in turn)."""
    workers = processes_of(proc, "simulator_worker")
    (server,) = {w.parent() for w in workers}
    for victim in (workers[0], server):
        victim.kill()
        victim.wait(timeout=30)
    return kill_tree(proc.pid)


def results(out) -> tuple[str, list, dict]:
    metrics = json.loads((out / "metrics.json").read_text())
    return (out / "events.jsonl").read_text(), [(r["version"], r["accuracy"]) for r in metrics["versions"]], metrics


# a FedScale-format availability trace: 6 clients, on/off windows repeating every 6 units (one always online)
AVAILABILITY_TRACE = {
    0: {"active": [0.0, 3.5], "inactive": [2.0, 5.5], "finish_time": 6.0},
    1: {"active": [1.0], "inactive": [4.0], "finish_time": 6.0},
    2: {"active": [0.0], "inactive": [6.0], "finish_time": 6.0},
    3: {"active": [2.5], "inactive": [5.0], "finish_time": 6.0},
    4: {"active": [0.5, 4.0], "inactive": [1.5, 5.8], "finish_time": 6.0},
    5: {"active": [0.0, 5.0], "inactive": [3.0, 6.0], "finish_time": 6.0},
}


def fleet_flags(method: str, tmp_path) -> list[str]:
    """Each method's case on another fleet model, so a resume covers it too: FedAvg on a FedScale availability
    trace, FedBuff on a diurnal fleet (devices come and go, and drop out), FedRevive with measured speeds from a
    small FedScale capacity trace."""
    if method == "fedbuff":
        return DIURNAL
    if method == "fedavg":
        trace = tmp_path / "availability.pkl"
        trace.write_bytes(pickle.dumps(AVAILABILITY_TRACE))
        return ["--availability", str(trace)]
    trace = tmp_path / "capacity.pkl"
    trace.write_bytes(
        pickle.dumps({i: {"computation": 2.0 + 7 * i, "communication": 800.0 + 900 * i} for i in range(6)})
    )
    return ["--delays", "none", "--capacity-file", str(trace)]


def check_fleet(method: str, trace: list[dict], metrics: dict) -> None:
    """The trace is the reference schedule's for the run's own recorded config, and the results show the fleet."""
    assert trace == reference_trace(schedule_for(JobConfig.from_dict(metrics["config"])))
    assert trace != reference_trace(schedule_for(replace(JobConfig.from_dict(metrics["config"]), delays=PAPER)))
    failed = sum(1 for r in trace if r.get("failed"))
    last = metrics["versions"][-1]
    assert last["fleet"]["updates"] == len(trace)
    assert metrics["summary"].get("failure_rate", 0.0) == round(failed / len(trace), 4)
    if method == "fedrevive":
        return
    assert failed > 0  # devices dropped out
    online = [r["fleet"]["online"] for r in metrics["versions"] if "fleet" in r]
    assert all(0 < n <= 24 for n in online) and min(online) < 24
    counted = collections.Counter(r["version"] for r in trace if not r.get("failed"))
    if method == "fedavg":  # a round averages the devices that reported, without those that dropped out
        assert min(counted.values()) < 8 and set(counted) == set(range(2, last["version"] + 1))


@pytest.mark.parametrize("method", ["fedavg", "fedbuff", "fedrevive"])
def test_a_run_killed_and_resumed_ends_exactly_like_an_uninterrupted_run(tmp_path, method):
    """Each on a fleet model of its own (``fleet_flags``): the uninterrupted run also equals the reference schedule."""
    flags = [*METHOD_FLAGS[method], *fleet_flags(method, tmp_path), "--checkpoint-every", "2"]
    whole = start(tmp_path, "whole", *flags)  # the uninterrupted run goes at the same time
    killed = start(tmp_path, "killed", *flags)
    middle = 4 if method == "fedavg" else 10
    wait_for(lambda: checkpoint_version(tmp_path / "killed") >= middle, killed, 300, f"checkpoint at {middle}")
    job = [p.pid for p in psutil.Process(killed.pid).children(recursive=True)]
    assert shared_memory_of(job) >= {"/memfd:edgesim-versions", "/memfd:edgesim-diffs"}  # the run shares memory
    gone = kill_a_leaf_then_the_server(killed)
    assert not [p for p in gone if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    code, out = finish(whole)
    assert code == 0, out[-3000:]
    killed_out = tmp_path / "killed"  # the original command with --resume appended
    resumed = resume(killed_out, PYTHON, "jobs/pt_job_fedrevive.py", *SMALL, *flags, "--output", str(killed_out))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout
    # nothing of the killed run is left: no process holds its memory, and none was ever named in /dev/shm
    assert not shared_memory_of(job) and not [name for name in os.listdir("/dev/shm") if "edgesim" in name]
    assert json.loads((tmp_path / "whole" / "metrics.json").read_text())["bulk"] == {"site-1": "shm", "site-2": "shm"}
    events, accuracy, whole = results(tmp_path / "whole")
    events_again, accuracy_again, again = results(tmp_path / "killed")
    assert events_again == events
    check_fleet(method, [json.loads(line) for line in events.splitlines()], whole)
    assert accuracy_again == accuracy
    assert again["outcome"]["status"] == "completed" and again["outcome"]["version"] == whole["outcome"]["version"]
    assert digest(tmp_path / "killed" / "global_model.pt") == digest(tmp_path / "whole" / "global_model.pt")


RESNET18_BN = (
    "--model resnet18_bn --num-leaf-nodes 2 --devices-per-leaf 4 --device-selection-size 8 --max-model-version 2 "
    "--local-iters 1 --synthetic-size 600"
).split()


def test_two_runs_at_once_with_default_outputs_both_finish_one_a_resnet18_on_the_cpu(tmp_path):
    """Two jobs at once in one workspace, each in its own default results folder. One is the BatchNorm ResNet-18
    (``resnet18_bn``) through ``pt_job_fedavg.py``: its evaluation on 2 CPU cores once took longer than the leaves'
    update timeout, and the run ended after version 1 with exit code 0. Evaluation now runs beside the protocol and
    timeouts scale with the model."""
    workspace = ["--workspace", str(tmp_path / "ws")]
    small = [*SMALL, *METHOD_FLAGS["fedavg"], "--max-model-version", "3", *workspace]
    runs = {
        "small": subprocess.Popen(
            [PYTHON, "jobs/pt_job_fedrevive.py", *small],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
        "resnet18_bn": subprocess.Popen(
            [PYTHON, "jobs/pt_job_fedavg.py", *RESNET18_BN, *workspace],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    }
    try:
        outputs = {name: proc.communicate(timeout=600) for name, proc in runs.items()}
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                kill_tree(proc.pid)
    for name, proc in runs.items():
        assert proc.returncode == 0, "".join(o or "" for o in outputs[name])[-3000:]
    folders = sorted((tmp_path / "ws" / "results").iterdir())
    assert len(folders) == 2, folders
    metrics = {}
    for folder in folders:
        m = json.loads((folder / "metrics.json").read_text())
        metrics[m["config"]["training"]["model"]] = (m, folder)
    for model, last in (("cifar10_convnet", 3), ("resnet18_bn", 2)):  # past version 1, where the bug ended it
        assert metrics[model][0]["outcome"] == metrics[model][0]["outcome"] | {"status": "completed", "version": last}
    m, folder = metrics["resnet18_bn"]
    assert [r["version"] for r in m["versions"]] == [1, 2]
    assert "warning" not in outputs["resnet18_bn"][1], outputs["resnet18_bn"][1][-2000:]
    # the devices' BatchNorm statistics travelled through NVFlare and made the server's model's own
    state = torch.load(folder / "global_model.pt")
    for name in ("bn1", "layer4.1.bn2"):
        assert not torch.allclose(state[f"{name}.running_mean"], torch.zeros(1)), name
        assert not torch.allclose(state[f"{name}.running_var"], torch.ones(1)), name
        assert bool((state[f"{name}.running_var"] > 0).all()), name


def processes_of(proc: subprocess.Popen, marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if marker in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_a_dead_server_is_noticed_and_the_run_ends_non_zero_with_nothing_left(tmp_path):
    proc = start(tmp_path, "out", *METHOD_FLAGS["fedbuff"], "--max-model-version", "5000", "--checkpoint-every", "2")
    wait_for(lambda: checkpoint_version(tmp_path / "out") >= 2, proc, 300, "a checkpoint")
    tree = psutil.Process(proc.pid).children(recursive=True)
    (server,) = {w.parent() for w in processes_of(proc, "simulator_worker")}
    killed_at = time.time()
    server.kill()
    code, out = finish(proc, timeout=120)
    assert code == 1, out[-3000:]
    assert time.time() - killed_at < 60, "the dead server was noticed late"
    assert "server process" in out and "died" in out and "--resume" in out, out[-2000:]
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("policy", ["stop", "continue", "continue-pack"])
def test_a_lost_leaf_ends_in_its_policys_outcome(tmp_path, policy):
    """``continue-pack``: a pack of three runs, two at a time (``--runs``, ``--runs-at-once 2``), goes on without the
    lost leaf: each running run fails the leaf's devices in flight and never selects them again, and the third run,
    joining after the loss, never selects them at all."""
    versions = "5000" if policy == "stop" else "40"
    pack = policy == "continue-pack"
    extra = []
    if pack:
        runs = {"a": {}, "b": {"seed": 6, "max-model-version": 60}, "c": {"seed": 7, "max-model-version": 12}}
        (tmp_path / "runs.json").write_text(json.dumps(runs))
        extra = ["--runs", str(tmp_path / "runs.json"), "--runs-at-once", "2"]
    proc = start(
        tmp_path,
        "out",
        *METHOD_FLAGS["fedbuff"],
        "--max-model-version",
        versions,
        "--leaf-timeout",
        "8",
        "--on-leaf-loss",
        policy.removesuffix("-pack"),
        *extra,
    )
    out_dir = tmp_path / "out" / "a" if pack else tmp_path / "out"
    wait_for(
        lambda: (out_dir / "events.jsonl").exists() and len((out_dir / "events.jsonl").read_text().splitlines()) > 6,
        proc,
        300,
        "some applied updates",
    )
    tree = psutil.Process(proc.pid).children(recursive=True)
    leaf = next(p for p in processes_of(proc, "simulator_worker") if "site-2" in " ".join(p.cmdline()))
    leaf.kill()
    code, out = finish(proc, timeout=300)
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if policy == "stop":
        assert code == 1, out[-3000:]
        assert metrics["outcome"]["status"] == "stopped" and "site-2" in metrics["outcome"]["reason"]
        assert "site-2" in out and metrics["versions"], out[-2000:]
        return
    assert code == 0, out[-3000:]
    for folder in [out_dir, tmp_path / "out" / "b"] if pack else [out_dir]:
        assert json.loads((folder / "metrics.json").read_text())["outcome"]["status"] == "completed"
        events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        lost = [e for e in events if e.get("failed")]
        assert lost and all(e["device"].startswith("site-2#") for e in lost)
        lost_at = max(e["base_version"] for e in lost)
        later = [e for e in events if e["base_version"] > lost_at]
        assert later and not any(e["device"].startswith("site-2#") for e in later)  # never selected again
    if pack:
        joined = tmp_path / "out" / "c"
        outcome = json.loads((joined / "metrics.json").read_text())["outcome"]
        assert (outcome["status"], outcome["version"]) == ("completed", 12), outcome
        events = [json.loads(line) for line in (joined / "events.jsonl").read_text().splitlines()]
        assert events and not any(e["device"].startswith("site-2#") for e in events)
        assert "run c begins" in out, out[-3000:]


def test_a_finished_run_resumed_with_a_larger_last_version_goes_on_as_if_it_had_never_stopped(tmp_path):
    """``--resume`` with a larger ``--max-model-version`` extends a run that completed (docs/long-runs.md): its
    last arrival had selected nobody (the last version existed); resumed, those devices are selected at once, and
    the whole trace is the one a run to the larger version follows."""
    flags = [*METHOD_FLAGS["fedbuff"][:2], "--global-lr", "0.5", "--checkpoint-every", "1"]
    code, out = finish(start(tmp_path, "run", *flags, "--max-model-version", "4"))
    assert code == 0, out[-3000:]
    assert checkpoint_version(tmp_path / "run") == 4
    run_out = tmp_path / "run"
    command = [PYTHON, "jobs/pt_job_fedrevive.py", *SMALL, *flags, "--max-model-version", "9", "--output", str(run_out)]
    resumed = resume(run_out, *command)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    trace_text, accuracies, metrics = results(tmp_path / "run")
    assert metrics["outcome"]["status"] == "completed" and accuracies[-1][0] == 9
    trace = [json.loads(line) for line in trace_text.splitlines()]
    assert trace == reference_trace(schedule_for(JobConfig.from_dict(metrics["config"])))

"""Ctrl-C or SIGTERM on the driver of a real run stops every process the job started, keeps the results, and
records the run as interrupted (the signal, the last version, the summary) in ``metrics.json``."""

import json
import signal
import subprocess
import time

import psutil
import pytest

from tests.conftest import PYTHON, REPO, job_args, kill_tree
from tests.tracker_readers import mlflow_runs, mlflow_series


def wait_for_version(metrics_path, version: int, proc, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the job ended before it could be interrupted"
        try:
            if json.loads(metrics_path.read_text())["versions"][-1]["version"] >= version:
                return
        except (FileNotFoundError, json.JSONDecodeError, KeyError, IndexError):
            pass
        time.sleep(0.5)
    pytest.fail(f"no version {version} within {timeout} s")


SIGNALS = {signal.SIGINT: 130, signal.SIGTERM: 143}  # each signal and the driver's exit code


def test_interrupting_a_running_job_leaves_no_process_and_keeps_results(tmp_path):
    """Two jobs at once (one job start's cost, not two), one stopped with Ctrl-C's SIGINT, the other with SIGTERM."""
    procs: dict[signal.Signals, subprocess.Popen] = {}
    trees, outs = {}, {}
    try:
        for sig in SIGNALS:
            flags = job_args(tmp_path / sig.name, "--max-model-version", "500", "--local-iters", "2")
            procs[sig] = subprocess.Popen(
                [PYTHON, "jobs/pt_job_fedavg.py", *flags],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        for sig, proc in procs.items():
            wait_for_version(tmp_path / sig.name / "out" / "metrics.json", 2, proc, timeout=240)
            trees[sig] = psutil.Process(proc.pid).children(recursive=True)
            assert len(trees[sig]) >= 3, "SimEnv runs the server and each leaf in processes of their own"
            proc.send_signal(sig)
        for sig, proc in procs.items():
            outs[sig], _ = proc.communicate(timeout=120)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    for sig, code in SIGNALS.items():
        proc, out, tree, results = procs[sig], outs[sig], trees[sig], tmp_path / sig.name / "out"
        assert proc.returncode == code, out[-3000:]
        survivors = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not survivors, [" ".join(p.cmdline()[:4]) for p in survivors]
        metrics = json.loads((results / "metrics.json").read_text())
        assert metrics["versions"][-1]["version"] >= 2
        assert (results / "accuracy.png").exists()
        name = signal.Signals(sig).name
        outcome = metrics["outcome"]
        assert outcome["status"] == "interrupted" and outcome["signal"] == name, outcome
        assert outcome["version"] >= metrics["versions"][-1]["version"]
        assert metrics["summary"]["last_version"] == outcome["version"]
        assert f"interrupted ({name})" in out


# the job's command line with the engine's ``trainer`` option (it has no flag), as benchmarks/lib/null_training.py runs it
JOB_WITH_TRAINER = (
    "import sys; from jobs.cli import job_main; from jobs.run.process_guard import exit_now; "
    "exit_now(job_main('', sys.argv[2:], method=None, hidden={'trainer': sys.argv[1]}))"
)


@pytest.mark.parametrize(
    "method, trainer",
    [("fedavg", "FailingTrainer"), ("fedbuff", "FailingFromVersion2Trainer")],
    ids=["fedavg-fails-from-the-start", "fedbuff-fails-after-a-checkpoint"],
)
def test_a_run_whose_devices_all_fail_stops_in_seconds_naming_the_error(tmp_path, method, trainer):
    """Every task raises (FedAvg: from the first; FedBuff: once version 1's devices are done, after checkpoints):
    the server stops the run at the default --max-consecutive-failures instead of reselecting for ever, naming the
    count and the error; the driver exits 1, with the --resume command when there is a checkpoint, and every
    process of the job is gone."""
    flags = job_args(tmp_path, "--method", method, "--local-iters", "1", "--checkpoint-every", "1")
    command = [PYTHON, "-c", JOB_WITH_TRAINER, f"tests.fakes.processors:{trainer}", *flags]
    logs = {name: open(tmp_path / name, "w+") for name in ("stdout", "stderr")}  # failures log a lot: no pipe
    proc = subprocess.Popen(command, cwd=REPO, stdout=logs["stdout"], stderr=logs["stderr"], text=True)
    events, tree, first_failure = tmp_path / "out" / "events.jsonl", {}, None
    try:
        while proc.poll() is None:  # what the job started, and when the server applied its first failed update
            try:
                tree |= {p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.NoSuchProcess:  # it has just ended
                pass
            if first_failure is None and events.exists() and '"failed": true' in events.read_text():
                first_failure = time.time()
            assert time.time() - (first_failure or time.time()) < 60, "the run went on failing"
            time.sleep(0.2)
        ended = time.time()
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
        for f in logs.values():
            f.close()
    out, err = ((tmp_path / name).read_text() for name in ("stdout", "stderr"))
    assert proc.returncode == 1, out[-3000:] + err[-3000:]
    assert first_failure is not None and ended - first_failure < 30, "from the first failure to the job's end"
    survivors = [p for p in tree.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert len(tree) >= 3 and not survivors, [" ".join(p.cmdline()[:4]) for p in survivors]
    outcome = json.loads((tmp_path / "out" / "metrics.json").read_text())["outcome"]
    reason = outcome["reason"]
    assert outcome["status"] == "stopped", outcome
    assert "100 device updates in a row failed with an error" in reason and "--max-consecutive-failures 100" in reason
    assert "RuntimeError: a bug in the fake trainer: version" in reason
    assert f"the run stopped early: {reason}" in err
    resumable = (tmp_path / "out" / "checkpoint").exists()
    assert resumable == (method == "fedbuff") and outcome["version"] >= (2 if resumable else 1), outcome
    assert (f"--resume {tmp_path / 'out'}" in err) == resumable


def test_interrupting_a_tracked_pack_records_every_run_interrupted_and_leaves_no_process(tracker_env, mlflow_store):
    """A pack of two seeds (``--seeds``), tracked in MLflow, stopped with SIGTERM: both runs recorded as interrupted,
    their results kept, the exit code the signal's, and no process of the job left (NVFlare reports the signal as a
    failed job); each seed has its own MLflow run, as if it had run alone, ended with its outcome."""
    tmp_path = tracker_env
    flags = job_args(tmp_path, "--max-model-version", "500", "--local-iters", "2", "--seeds", "3,4")
    flags += ["--tracking", "mlflow", "--tracking-uri", mlflow_store]
    proc = subprocess.Popen(
        [PYTHON, "jobs/pt_job_fedavg.py", *flags], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        for seed in (3, 4):
            wait_for_version(tmp_path / "out" / f"seed-{seed}" / "metrics.json", 2, proc, timeout=240)
        tree = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    assert proc.returncode == 143, out[-3000:]
    survivors = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not survivors, [" ".join(p.cmdline()[:4]) for p in survivors]
    assert "interrupted (SIGTERM)" in out and "the pack's job failed" not in out, out[-3000:]
    for seed in (3, 4):
        results = tmp_path / "out" / f"seed-{seed}"
        metrics = json.loads((results / "metrics.json").read_text())
        outcome = metrics["outcome"]
        assert outcome["status"] == "interrupted" and outcome["signal"] == "SIGTERM", outcome
        assert metrics["versions"][-1]["version"] >= 2 and (results / "accuracy.png").exists()
        assert metrics["summary"]["last_version"] == outcome["version"]
    runs = {r.data.params["seed"]: r for r in mlflow_runs(mlflow_store)}
    assert sorted(runs) == ["3", "4"], sorted(runs)
    for seed, run in runs.items():
        metrics = json.loads((tmp_path / "out" / f"seed-{seed}" / "metrics.json").read_text())
        assert run.info.status == "KILLED" and run.data.tags["outcome"] == "interrupted", run.data.tags
        accuracy = mlflow_series(mlflow_store, run.info.run_id, "accuracy")
        assert accuracy == [(r["version"], r["accuracy"]) for r in metrics["versions"]]

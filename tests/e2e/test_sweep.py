"""A real sweep on the easy synthetic data: a search of 6 trials, 2 at a time, pruned on simulated time by the median
rule, with --tensorboard; the sweep is SIGKILLed mid-study (its trials end with it), the same command continues it
to the end with every planned trial finished exactly once (and in TensorBoard once), and the printed best command,
run alone, gives its trial's accuracy."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import time

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from tests.conftest import PYTHON, REPO

pytestmark = pytest.mark.slow

SPEC = """
base:
  method: fedavg
  num-leaf-nodes: 2
  devices-per-leaf: 4
  device-selection-size: 8
  synthetic-size: 3000
  subset-size: 300
  synthetic-difficulty: 0
  max-model-version: 6
  delays: paper
  seed: 3
  workspace: {ws}
grid:
  local-lr: [0.01, 0.002, 1.0e-7]
search:
  global-lr: {{type: float, low: 0.9, high: 1.1}}
objective: {{metric: accuracy_at, budget: 25, step: 1.0}}
trials: 6
"""


# Why pruning is certain whatever the timing: the search spreads the grid's cells in turn, so slots 2 and 5 never learn
# (local-lr 1e-7) and the others do. The median rule prunes once two trials have completed, and two learning ones
# have completed before the later of slots 2 and 5 starts (the queue runs by trial number, a killed trial's rerun
# last); from its first step past --min-resource it is below their median, long before version 6.


def finished(folder) -> int:
    """Trials the study counts as ended (complete or pruned): a pruned trial's job ends a moment before."""
    if not (folder / "study.db").exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{folder / 'study.db'}?mode=ro", uri=True, timeout=30)) as db:
        try:
            return db.execute("select count(*) from trials where state in ('COMPLETE', 'PRUNED')").fetchone()[0]
        except sqlite3.OperationalError:  # the tables are being created
            return 0


def of_this_sweep(folder) -> list[str]:
    """Every living process whose command line names the sweep's folder: its trials' drivers and NVFlare's."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if str(folder) in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmdline[:120])
    return found


def test_a_sweep_survives_sigkill_prunes_and_its_best_command_reproduces(tmp_path):
    spec = tmp_path / "lr.yaml"
    spec.write_text(SPEC.format(ws=tmp_path / "ws"))
    folder = tmp_path / "sweep"
    cmd = [PYTHON, "-m", "jobs.sweep", str(spec), "--output", str(folder), "--parallel", "2", "--min-resource", "2"]
    cmd += ["--pruner", "median"]
    cmd += ["--no-bar", "--tensorboard"]
    started = time.time()
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 400
        # kill it once a trial has ended and another runs (between two trials none may run for a moment)
        while time.time() < deadline and first.poll() is None:
            if finished(folder) >= 1 and psutil.Process(first.pid).children():
                break
            time.sleep(0.2)
        assert first.poll() is None, first.communicate()[0][-3000:]
        assert psutil.Process(first.pid).children(), "a trial was running when the sweep was killed"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        left = of_this_sweep(folder)
        deadline = time.time() + 90
        while left and time.time() < deadline:  # each trial's job ends with the sweep (PR_SET_PDEATHSIG)
            time.sleep(1)
            left = of_this_sweep(folder)
        assert not left, left
    finally:
        if first.poll() is None:
            first.kill()

    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "were running, marked failed, queued again" in out

    storage = f"sqlite:///{folder / 'study.db'}"
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    trials = optuna.load_study(study_name=name, storage=storage).get_trials()
    ended = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert sorted(t.user_attrs["slot"] for t in ended) == list(range(6)), [(t.number, t.state) for t in trials]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    failed = {t.number: t.params for t in trials if t.state == TrialState.FAIL}
    assert failed, "the kill left running trials, failed and queued again"
    for t in ended:  # a requeued trial keeps every value its killed one had chosen (none, if killed before)
        if "requeued_from" in t.user_attrs:
            assert failed[t.user_attrs["requeued_from"]].items() <= t.params.items()
    pruned = [t for t in ended if t.state == TrialState.PRUNED]
    assert pruned, "some trials are pruned"
    for t in pruned:
        metrics = json.loads((folder / t.user_attrs["folder"] / "metrics.json").read_text())
        assert metrics["outcome"]["status"] == "pruned", metrics["outcome"]
        assert metrics["outcome"]["version"] >= metrics["versions"][-1]["version"]
    assert any(
        json.loads((folder / t.user_attrs["folder"] / "metrics.json").read_text())["outcome"]["version"] < 6
        for t in pruned
    )  # cut before the end
    for name in ("curves.png", "history.png"):
        assert (folder / name).exists()
    # --tensorboard: every ended trial's curve and hparams, whichever of the two sweeps ended it
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    for t in ended:
        board = EventAccumulator(str(folder / "tensorboard" / f"{t.number:04d}")).Reload()
        records = json.loads((folder / t.user_attrs["folder"] / "metrics.json").read_text())["versions"]
        assert [e.step for e in board.Scalars("accuracy")] == [r["version"] for r in records]
        start = board.PluginTagToContent("hparams")["_hparams_/session_start_info"]
        hp = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
        assert hp["status"].string_value == t.state.name.lower() and "local-lr" in hp
    best_line = out[out.index("reproduce it alone with:") :].splitlines()[1].strip()
    complete = [t for t in ended if t.state == TrialState.COMPLETE]
    (best,) = [t for t in complete if t.user_attrs["command"] == best_line]  # two may tie at the best value
    assert best.value == max(t.value for t in complete) and best_line.startswith("python jobs/pt_job_fedrevive.py")
    sweep_seconds = time.time() - started

    alone = tmp_path / "alone"
    words = best_line.split()[1:] + ["--output", str(alone)]
    rerun = subprocess.run([PYTHON, *words], cwd=REPO, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    records = json.loads((alone / "metrics.json").read_text())["versions"]
    at_budget = [r["accuracy"] for r in records if r["sim_seconds"] <= 25][-1]
    assert at_budget == best.value, (at_budget, best.value)
    print(f"sweep {sweep_seconds:.0f} s, best command alone {time.time() - started - sweep_seconds:.0f} s")

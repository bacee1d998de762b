"""A pack killed and resumed (``jobs.run.pack_folder``): a job script's ``--runs`` pack of four runs, two at a time
(``--runs-at-once 2``): one short (it completes before the kill), one long, one that takes the short one's place
(``mid``) and one still waiting for a place (``late``), is stopped with SIGTERM after the long run's checkpoint at
version 4 or later; ``--resume`` of the pack's folder, alone, continues them as one job again, two at a time, the
waiting run (it wrote no checkpoint) anew from its saved config (and ``jobs.api.run(resume=...)`` of it once more
returns each run, ended, as it was). Each run's ``events.jsonl`` then
equals the same pack's uninterrupted run's line for line, and its accuracies equal them to summation order: each run
restarts at its own checkpoint's release, so releases the two runs trained in one cross-run group before may train
apart after (the tolerance of ``tests/e2e/test_pack.py``, a few test samples)."""

from __future__ import annotations

import json
import signal
import subprocess

from common.result_files import EVENTS, PACK_MANIFEST
from jobs.run.results import read_metrics
from tests.conftest import PYTHON, REPO, checkpoint_version, wait_for
from tests.e2e.job_runs import finish, resume

FLAGS = [
    "--method", "fedbuff", "--num-leaf-nodes", "2", "--devices-per-leaf", "4", "--device-selection-size", "4",
    "--delays", "paper", "--synthetic-size", "600", "--subset-size", "40", "--local-iters", "2",
    "--local-batch-size", "16", "--local-lr", "0.02", "--global-lr", "1.0", "--eval-backlog", "wait",
    "--num-updates-for-model", "2", "--min-hole-to-fill", "1", "--max-model-version", "40", "--checkpoint-every", "2",
]  # fmt: skip
RUNS = {
    "short": {"max-model-version": 4, "seed": 3},
    "long": {"local-lr": 0.05},
    "mid": {"max-model-version": 12, "seed": 5},  # joins when short ends; far from its end at the kill
    "late": {"max-model-version": 4, "seed": 7},  # waits for long or mid to end: never begins before the kill
}
LAST = {"short": 4, "long": 40, "mid": 12, "late": 4}
TOLERANCE = 0.03  # tests/e2e/test_pack.py's: cross-run groups change a diff's summation order only


def start(tmp_path, name: str) -> subprocess.Popen:
    cmd = [PYTHON, "jobs/pt_job_fedrevive.py", *FLAGS, "--runs", str(tmp_path / "runs.json"), "--runs-at-once", "2"]
    cmd.append("--output")
    return subprocess.Popen(
        [*cmd, str(tmp_path / name)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_a_pack_stopped_and_resumed_from_its_folder_ends_as_the_uninterrupted_pack(tmp_path):
    (tmp_path / "runs.json").write_text(json.dumps(RUNS))
    whole, killed = start(tmp_path, "whole"), start(tmp_path, "killed")
    out = tmp_path / "killed"
    wait_for(
        lambda: (
            checkpoint_version(out / "long") >= 4 and (read_metrics(out / "short").get("outcome") or {}).get("status")
        ),
        killed,
        300,
        "the long run's checkpoint at version 4 and the short run's end",
    )
    assert json.loads((out / PACK_MANIFEST).read_text()) == {"kind": "runs", "runs": {n: n for n in RUNS}, "at_once": 2}
    killed.send_signal(signal.SIGTERM)
    code, printed = finish(killed)
    assert code == 143, printed[-3000:]
    assert read_metrics(out / "long")["outcome"]["status"] == "interrupted"
    at = checkpoint_version(out / "long")
    before = [
        r for r in read_metrics(out / "long")["versions"] if r["version"] <= at
    ]  # kept by the resume, as they were
    assert read_metrics(out / "short")["outcome"]["status"] == "completed"
    assert checkpoint_version(out / "late") == 0 and not read_metrics(out / "late").get("versions")  # never began
    code, printed = finish(whole)
    assert code == 0, printed[-3000:]

    resumed = resume(out)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"{out / 'short'} (resuming), {out / 'long'} (resuming), {out / 'mid'} (" in resumed.stdout
    assert f"{out / 'late'} (anew: it wrote no checkpoint)" in resumed.stdout  # from its saved config, in its folder
    assert 4 <= at < 40 and read_metrics(out / "long")["versions"][: len(before)] == before  # continued, not run again
    rows = [line.split()[:4] for line in resumed.stdout.splitlines() if line.startswith(tuple(f"{n} " for n in RUNS))]
    assert [(r[0], r[3]) for r in rows] == [(n, "completed") for n in RUNS], resumed.stdout[-3000:]
    for name, last in LAST.items():
        again, alone = read_metrics(out / name), read_metrics(tmp_path / "whole" / name)
        assert again["outcome"]["status"] == "completed" and again["outcome"]["version"] == last, again["outcome"]
        assert (out / name / EVENTS).read_text() == (tmp_path / "whole" / name / EVENTS).read_text(), name
        curve = [(r["version"], r["accuracy"]) for r in again["versions"]]
        expected = [(r["version"], r["accuracy"]) for r in alone["versions"]]
        assert [v for v, _ in curve] == [v for v, _ in expected] == list(range(1, last + 1)), name
        assert max(abs(a - b) for (_, a), (_, b) in zip(curve, expected, strict=True)) <= TOLERANCE, (curve, expected)

    # from Python: resume= of the pack's folder, every run already ended, ends each again at once, as it was
    from jobs.api import run

    curves = {name: [(r["version"], r["accuracy"]) for r in read_metrics(out / name)["versions"]] for name in RUNS}
    again = run(resume=str(out))
    assert list(again.runs) == list(RUNS) and again.exit_code == 0
    for name, r in again.runs.items():
        assert r.accuracies == curves[name] and r.outcome["status"] == "completed", (name, r.outcome)

"""A pack of runs of different flags, end to end (``jobs.pack_runs``, ``docs/packs.md``): the job script's ``--runs
FILE`` runs four runs (their own local learning rate, seed and last version) as ONE NVFlare job, two at a time
(``--runs-at-once 2``), and a stop request in one run's folder (what the sweep writes when it prunes one trial of a
pack) ends that run alone, ``pruned`` with the request's reason, while the other completes.

* Each run's ``metrics.json`` holds its own flags (the command line's, with the run's after them).
* The job exits 1, as a pack of seeds does when one ended early, and its table names the pruned run.
* The stopped run was made to last (200 versions): it ends long before, so the request was acted on, and the other
  run reaches its last version: a pack's job goes on after one of its runs has ended.
* The places the pruned run and the completed run leave are taken by the two waiting runs inside the same job (its
  server's log says each join), and each joined run's ``events.jsonl`` equals its standalone run's line for line,
  its accuracies within ``tests/e2e/test_pack.py``'s tolerance (its releases train beside other runs' in the leaves'
  cross-run groups: summation order). So a sweep's pruned trial's place is taken by its next trial without a
  second start-up, and what that trial records is what it would alone.

From Python, ``jobs.api.run(..., runs={NAME: {option: value}})`` runs two runs of different learning rates and
seeds as one job and returns each run's result by its name.
"""

from __future__ import annotations

import json
import subprocess

from common.result_files import EVENTS, STOP_REQUEST
from jobs.run.results import read_metrics
from tests.conftest import PYTHON, REPO, kill_tree, wait_for
from tests.e2e.job_runs import finish
from tests.e2e.test_pack import ACCURACY_TOLERANCE

SMALL = [
    "--method", "fedbuff", "--num-leaf-nodes", "2", "--devices-per-leaf", "4", "--device-selection-size", "4",
    "--delays", "paper", "--synthetic-size", "600", "--subset-size", "40", "--local-iters", "2",
    "--local-batch-size", "16", "--local-lr", "0.02", "--global-lr", "1.0", "--eval-backlog", "wait",
    "--num-updates-for-model", "2", "--min-hole-to-fill", "1", "--max-model-version", "6",
]  # fmt: skip
RUNS = {
    "kept": {"local-lr": 0.05},
    "pruned": {"local-lr": 0.2, "seed": 5, "max-model-version": 200},
    "late": {"local-lr": 0.05, "seed": 7},  # waits: joins when the first of the two above ends
    "last": {"seed": 9, "max-model-version": 4},  # waits: joins when the second ends
}
REASON = "pruned by the test at version 1"


def start(*flags: str) -> subprocess.Popen:
    cmd = [PYTHON, "jobs/pt_job_fedrevive.py", *SMALL, *flags]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_stop_request_ends_one_run_of_a_pack_the_other_completes_and_waiting_runs_take_their_places(tmp_path):
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(RUNS))
    out = tmp_path / "pack"
    proc = start("--runs", str(runs), "--runs-at-once", "2", "--output", str(out))
    # the joining runs' standalone jobs, started beside the pack (exact time: what they record does not depend on it)
    alone = {name: start(*flags_of(RUNS[name]), "--output", str(tmp_path / name)) for name in ("late", "last")}
    pruned = out / "pruned"
    try:
        wait_for(lambda: len(read_metrics(pruned).get("versions", [])) >= 1, proc, 300, "the long run's first version")
        (pruned / STOP_REQUEST).write_text(json.dumps({"reason": REASON}))
        printed = proc.communicate(timeout=300)[0]
        ended_alone = {name: finish(job) for name, job in alone.items()}
    finally:
        for job in (proc, *alone.values()):
            if job.poll() is None:
                kill_tree(job.pid)
    assert proc.returncode == 1, printed[-3000:]  # a run ended early, as --seeds says of a seed (the table: which)

    kept, stopped = read_metrics(out / "kept"), read_metrics(pruned)
    assert kept["outcome"]["status"] == "completed" and kept["outcome"]["version"] == 6, kept["outcome"]
    assert stopped["outcome"]["status"] == "pruned" and stopped["outcome"]["reason"] == REASON, stopped["outcome"]
    assert stopped["outcome"]["version"] < 200
    assert (kept["config"]["training"]["local_lr"], kept["config"]["run"]["seed"]) == (0.05, 0)
    assert (stopped["config"]["training"]["local_lr"], stopped["config"]["run"]["seed"]) == (0.2, 5)
    assert stopped["config"]["federation"]["max_model_version"] == 200
    rows = [line.split()[:4] for line in printed.splitlines() if line.startswith(tuple(f"{n} " for n in RUNS))]
    assert [(r[0], r[3]) for r in rows] == [
        ("kept", "completed"), ("pruned", "pruned"), ("late", "completed"), ("last", "completed")
    ], printed[-3000:]  # fmt: skip
    assert "[edgesim] 2 runs at a time, in order: each later run joins the job when one ends" in printed
    said = [line for line in printed.splitlines() if line.startswith("[edgesim] run ")]  # each run's begin, end
    ends = [("kept", "completed"), ("pruned", "pruned"), ("late", "completed"), ("last", "completed")]
    assert len(said) == 6 and all(
        sum(line.startswith(f"[edgesim] run {name} {status} at version ") for line in said) == 1
        for name, status in ends
    ), said
    assert [line.split(":")[0] for line in said if " begins: " in line] == ["[edgesim] run late begins"] + [
        "[edgesim] run last begins"
    ], said

    server_log = next(out.glob("kept/nvflare/*/*/server/log.txt")).read_text()
    assert "starting 2 runs, 2 waiting for a place" in server_log
    joins = [line.split(" - ")[-1] for line in server_log.splitlines() if "joins the running job" in line]
    assert [j.split(":")[0] for j in joins] == ["run 2 joins the running job", "run 3 joins the running job"], joins
    for name, (code, printed) in ended_alone.items():
        assert code == 0, printed[-3000:]
        assert (out / name / EVENTS).read_text() == (tmp_path / name / EVENTS).read_text(), name
        packed, own = read_metrics(out / name)["versions"], read_metrics(tmp_path / name)["versions"]
        assert [r["version"] for r in packed] == [r["version"] for r in own]
        gap = max(abs(a["accuracy"] - b["accuracy"]) for a, b in zip(packed, own, strict=True))
        assert gap <= ACCURACY_TOLERANCE, (name, gap)
        # a joined run records the leaves' plans (made before it began) and its own leaf logs, as alone
        assert read_metrics(out / name)["leaf_plans"].keys() == {"site-1", "site-2"}, name
        assert sorted(p.name for p in (out / name).glob("leaf_*.jsonl")) == ["leaf_site-1.jsonl", "leaf_site-2.jsonl"]


def flags_of(run: dict) -> list[str]:
    return [word for flag, value in run.items() for word in (f"--{flag}", str(value))]


API_OPTIONS = {
    "num_leaf_nodes": 2, "devices_per_leaf": 4, "device_selection_size": 4, "num_updates_for_model": 2,
    "min_hole_to_fill": 1, "max_model_version": 6, "delays": "paper", "synthetic_size": 600, "subset_size": 40,
    "local_iters": 2, "local_batch_size": 16, "local_lr": 0.02, "global_lr": 1.0, "eval_backlog": "wait",
}  # fmt: skip


def test_the_apis_runs_run_as_one_job_each_with_its_own_options(tmp_path, capsys):
    from jobs.api import run

    result = run("fedbuff", runs={"slow": {"local_lr": 0.01}, "fast": {"local_lr": 0.1, "seed": 2}},
                 output=str(tmp_path / "pack"), **API_OPTIONS)  # fmt: skip
    assert result.exit_code == 0 and list(result.runs) == ["slow", "fast"]
    for name, (lr, seed) in {"slow": (0.01, 0), "fast": (0.1, 2)}.items():
        r = result.runs[name]
        assert r.output == str(tmp_path / "pack" / name) and r.outcome["status"] == "completed"
        assert (r.metrics["config"]["training"]["local_lr"], r.metrics["config"]["run"]["seed"]) == (lr, seed)
        assert len(r.accuracies) == 6
    printed = capsys.readouterr().out
    assert [line.split()[0] for line in printed.splitlines() if line.startswith(("slow ", "fast "))] == ["slow", "fast"]

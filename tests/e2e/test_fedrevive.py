"""A real asynchronous FedRevive run in SimEnv, with low warm-up thresholds so distillation really runs."""

import json
import subprocess

from benchmarks.lib.fedrevive_small import FEDREVIVE_SMALL
from tests.conftest import PYTHON, REPO, job_args


def test_fedrevive_distills_stale_updates_and_finishes(tmp_path):
    flags = job_args(
        tmp_path,
        "--method",
        "fedrevive",
        "--max-model-version",
        "8",
        # heterogeneous speeds on the virtual clock make updates stale
        "--speed-means",
        "10,40",
        "--speed-stds",
        "1,1",
        # small distillation settings so it runs on a CPU in seconds; phases from version 2 and 3
        *FEDREVIVE_SMALL,
    )
    proc = subprocess.run(
        [PYTHON, "jobs/pt_job_fedrevive.py", *flags], cwd=REPO, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    log = [json.loads(line) for line in open(out / "fedrevive_log.jsonl")]
    distilled = [e for e in log if e["phase"] == "distill"]
    assert distilled, {e["phase"] for e in log}
    assert all(e["kd_seconds"] > 0 and 0 < e["beta"] <= 1 and e["tau"] >= 1 for e in distilled)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["versions"][-1]["version"] >= 8  # async versions can overshoot: the server checks every 0.5 s
    kd_iters = FEDREVIVE_SMALL[FEDREVIVE_SMALL.index("--fr-kd-iters") + 1]
    assert metrics["config"]["method_settings"]["kd_iters"] == int(kd_iters)  # a method's flag reaches its config
    assert metrics["versions"][-1]["sim_seconds"] > 0
    # one version numbering: an update's log line names the version it goes into, as events.jsonl does
    events = [json.loads(line) for line in open(out / "events.jsonl")]
    assert [(e["version"], e["base_version"]) for e in log] == [(e["version"], e["base_version"]) for e in events]
    # the progress lines say where FedRevive stands and how much it revived
    revived = sum(e["phase"] == "distill" and e["beta"] > 0 for e in log if e["version"] <= 8)
    # between the warm-ups a stale update is blended with a zero distilled one, as both references do
    warm = [e for e in log if e["phase"] == "generator-warm-up" and e["tau"] > 0]
    assert warm and all(e["beta"] > 0 for e in warm), warm
    assert f"FedRevive revival, {revived} update(s) revived" in proc.stdout

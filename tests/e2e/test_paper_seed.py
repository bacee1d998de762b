"""The paper-seed instrument's CPU slice (``benchmarks/repro/paper_seed.py --device cpu --tiny``): three real jobs, their
phases taken from what the jobs record, and the estimate as its last line."""

import json
import re
import subprocess

from common.result_files import LEAF_LOGS
from tests.conftest import PYTHON, REPO


def test_the_tiny_slice_splits_each_methods_time_by_phase_and_ends_with_the_seed_estimate(tmp_path):
    proc = subprocess.run(
        [PYTHON, "benchmarks/repro/paper_seed.py", "--device", "cpu", "--tiny", "--output", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"seed estimate: [0-9.]+ min \(goal 30\)", last), last
    found = json.loads((tmp_path / "paper_seed.json").read_text())
    results = {r["method"]: r for r in found["results"]["today"]}
    assert sorted(results) == ["fedavg", "fedbuff", "fedrevive"]
    for method, r in results.items():
        assert r["exit"] == 0 and r["estimate_seconds"] > 0, (method, r)
        assert r["seed"]["updates"] > r["window"]["updates"] > 0, method  # the seed is bigger than its slice
    for method in ("fedavg", "fedbuff"):  # a FedRevive window of 3 updates may see no report come in
        assert results[method]["phases"]["device training"] > 0, method
    revive = results["fedrevive"]
    assert revive["phases"]["synthesis"] > 0 and revive["phases"]["distillation"] > 0
    assert revive["seed"]["distillations"] > 0 and revive["seed_phases"]["distillation"] > 0
    assert results["fedavg"]["seed"]["evaluations"] == results["fedavg"]["seed"]["versions"]  # every version
    # what the phases come from: the leaves' training seconds and the server's figures, in the jobs' own files
    out = tmp_path / "today" / "fedrevive" / "out"
    lines = [json.loads(line) for path in out.glob(LEAF_LOGS) for line in open(path)]
    assert lines and all(line["train_seconds"] > 0 for line in lines)
    records = json.loads((out / "metrics.json").read_text())["versions"]
    assert all(r["server"]["made_epoch"] > 0 for r in records)
    assert records[-1]["server"]["update_seconds"] > 0
    assert "GPU busy n/a (no GPU)" in proc.stdout and "engine floor:" in proc.stdout

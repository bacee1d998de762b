"""A real FedAvg run of the next-character task: LEAF's char-LSTM on generated text (``--dataset synthetic-text``),
token ids through the leaves' task processor and the server's evaluator (accuracy: the next character's)."""

import json

import pytest

from tests.conftest import job_args, run_guarded


@pytest.mark.slow
def test_fedavg_trains_the_char_lstm_on_generated_text_end_to_end(tmp_path):
    flags = job_args(
        tmp_path,
        "--dataset",
        "synthetic-text",
        "--model",
        "char_lstm",
        "--synthetic-size",
        "300",
        "--subset-size",
        "16",
        "--local-batch-size",
        "8",
        "--local-iters",
        "2",
        "--local-lr",
        "1e-2",
        "--max-model-version",
        "2",
    )
    out, rendered = run_guarded(tmp_path, "jobs/pt_job_fedavg.py", *flags)
    assert rendered == "", rendered[:4000]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["outcome"]["status"] == "completed", out[-3000:]
    assert metrics["config"]["data"]["dataset"] == "synthetic-text"
    # the planner counted the fused LSTM: one device at a time on the CPU (measured faster, bench_engine.py)
    assert (
        metrics["planner"]["engine"] == "per-device"
        and "MFLOP per training sample" in metrics["planner"]["engine_reason"]
    )
    versions = metrics["versions"]
    assert [r["version"] for r in versions] == [1, 2]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in versions)

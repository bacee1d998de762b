"""``python -m jobs.finish RESULTS_DIR``: evaluate what a run saved but did not evaluate, and complete its results.

A run's last version is saved (``global_model.pt``) as soon as its outcome is decided, before it is evaluated. When
the server died or was stopped during that evaluation, the run exits 3 (``jobs.run.driver.INCOMPLETE``) and
``metrics.json``'s summary lists the version under ``versions_unevaluated``. This command scores the saved version
with the run's own configuration (``metrics.json``'s ``config``: the same model, data, seed and test split as the
server's evaluator), adds its record (``"finished": true``; its ``wall_seconds`` is the last recorded one's, since
the run's clock has stopped) and the new summary to ``metrics.json`` (``evaluation.run_recorder.record_finished``),
and draws ``accuracy.png`` again. Only the version ``global_model.pt`` holds can be evaluated: an older unevaluated
version's weights were not kept, and stays listed. TensorBoard, MLflow and W&B are not updated.

Exit codes: 0 when the run's last version is evaluated (now or already), 2 for a folder that holds no run, 3 when
the last version still cannot be evaluated (nothing saved).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from common.result_files import ACCURACY_PLOT, GLOBAL_MODEL, METRICS
from evaluation.evaluator import Scorer
from evaluation.plots import plot_accuracy
from evaluation.run_recorder import record_finished, summary_of
from jobs.config import JobConfig

INCOMPLETE = 3  # as jobs.run.driver's: the last version is still unevaluated


def finished_record(metrics: dict, version: int, scores: tuple, seconds: float) -> dict:
    """The record of ``version`` evaluated after the run: its scores, and what the run knew of it (its simulated
    time from the outcome)."""
    accuracy, loss, spread = scores
    earlier = [r for r in metrics.get("versions", []) if r["version"] < version]
    outcome = metrics.get("outcome") or {}
    record = {
        "version": version,
        "accuracy": round(accuracy, 5),
        "loss": round(loss, 5),
        "wall_seconds": earlier[-1]["wall_seconds"] if earlier else 0.0,
        "eval_seconds": round(seconds, 3),
        "epoch": round(time.time(), 3),
        "finished": True,
    }
    if spread is not None:
        record["per_user"] = spread
    if outcome.get("version") == version and outcome.get("sim_seconds") is not None:
        record["sim_seconds"] = outcome["sim_seconds"]
    return record


def finish(results_dir: str, compute_device: str = "") -> int:
    """Evaluate ``results_dir``'s saved, unevaluated version and complete its results; the exit code."""
    try:
        with open(os.path.join(results_dir, METRICS)) as f:
            metrics = json.load(f)
        cfg = JobConfig.from_dict(metrics["config"])
    except (OSError, ValueError, KeyError, TypeError) as ex:
        print(f"error: {results_dir} holds no run's {METRICS} with its config ({ex})", file=sys.stderr)
        return 2
    summary = metrics.get("summary") or summary_of(results_dir, metrics)
    unevaluated, last = summary.get("versions_unevaluated") or [], summary["last_version"]
    saved = metrics.get("saved_version")
    if last not in unevaluated:
        print(f"[edgesim] {results_dir}: version {last}, the run's last, is evaluated already; nothing to finish")
        return 0
    model_path = os.path.join(results_dir, GLOBAL_MODEL)
    if saved != last or not os.path.exists(model_path):
        print(
            f"[edgesim] {results_dir}: version {last} was not saved ({GLOBAL_MODEL} holds "
            f"{f'version {saved}' if saved and os.path.exists(model_path) else 'nothing'}): it cannot be evaluated",
            file=sys.stderr,
        )
        return INCOMPLETE
    t = cfg.training
    print(f"[edgesim] evaluating version {last} of {results_dir} ({t.model}, seed {cfg.run.seed})")
    scorer = Scorer(t.model, cfg.data.to_dict(), cfg.run.seed, compute_device or t.compute_device, t.precision)
    weights = {k: v.numpy() for k, v in torch.load(model_path, map_location="cpu").items()}
    started = time.time()
    scores = scorer.score(weights)
    metrics = record_finished(results_dir, finished_record(metrics, last, scores, time.time() - started))
    plot_accuracy(metrics["versions"], os.path.join(results_dir, ACCURACY_PLOT), cfg.run.job_name)
    left = [v for v in metrics["summary"]["versions_unevaluated"] if v != last]
    print(f"[edgesim] version {last}: accuracy {scores[0]:.4f}; {METRICS} and {ACCURACY_PLOT} completed")
    if left:
        print(f"[edgesim] versions {', '.join(map(str, left))} stay unevaluated: their weights were not kept")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.finish", description=__doc__.split("\n\n")[0])
    parser.add_argument("results_dir", help="the run's results folder (its --output)")
    parser.add_argument("--compute-device", default="", help="evaluate on this device instead of the run's")
    args = parser.parse_args(argv)
    return finish(os.path.abspath(os.path.expanduser(args.results_dir)), args.compute_device)


if __name__ == "__main__":
    sys.exit(main())

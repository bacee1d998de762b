"""After a run: read ``metrics.json`` (written by the server's ``RunRecorder`` only), draw ``accuracy.png`` and
summarise for the console."""

from __future__ import annotations

import json
import os

from evaluation.monitor import format_summary as format_system_summary
from evaluation.run_recorder import run_summary


def read_metrics(results_dir: str) -> dict:
    """The run's ``metrics.json`` as written so far (``{}`` while there is none or it cannot be read)."""
    try:
        with open(os.path.join(results_dir, "metrics.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def plot_accuracy(records: list[dict], path: str, title: str) -> None:
    """Accuracy against model version, wall seconds and (when the run has it) simulated seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_sim = any(r.get("sim_seconds") for r in records)
    fig, axes = plt.subplots(1, 3 if has_sim else 2, figsize=(15 if has_sim else 10, 4))
    versions = [r["version"] for r in records]
    acc = [r["accuracy"] for r in records]
    axes[0].plot(versions, acc, marker="o")
    axes[0].set_xlabel("global model version")
    axes[1].plot([r["wall_seconds"] for r in records], acc, marker="o")
    axes[1].set_xlabel("wall-clock seconds since job start")
    if has_sim:
        axes[2].plot([r.get("sim_seconds", 0) for r in records], acc, marker="o")
        axes[2].set_xlabel("simulated seconds")
    for ax in axes:
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def finalize(results_dir: str, total_seconds: float) -> dict:
    """Draw the plot and return the run's summary (the recorder's, or one computed from the recorded versions when
    the run was interrupted before it wrote one), with ``total_seconds`` and the system summary under ``system``."""
    metrics_path = os.path.join(results_dir, "metrics.json")
    if not os.path.exists(metrics_path):
        raise RuntimeError(f"the job wrote no {metrics_path}: see the NVFlare logs in the workspace")
    with open(metrics_path) as f:
        metrics = json.load(f)
    records = metrics.get("versions", [])
    config = metrics.get("config") or {}
    updates = (config.get("federation") or {}).get("num_updates_for_model", 0)
    summary = {"total_seconds": round(total_seconds, 2)} | (metrics.get("summary") or run_summary(records, updates))
    if records:
        plot_accuracy(records, os.path.join(results_dir, "accuracy.png"), (config.get("run") or {}).get("job_name", ""))
    if metrics.get("system") is not None:
        summary["system"] = metrics["system"]
    return summary


def format_summary(summary: dict, results_dir: str) -> str:
    lines = [f"[edgesim] done in {summary['total_seconds']:.1f} s: {summary['versions_trained']} versions trained"]
    if summary.get("seconds_per_version") is not None:
        lines.append(
            f"[edgesim] {summary['seconds_per_version']:.2f} s per version, "
            f"{summary.get('devices_per_second') or 0:.1f} devices trained per second"
        )
    if summary.get("simulated_seconds") is not None:
        lines.append(f"[edgesim] simulated time: {summary['simulated_seconds']:.3f}")
    lines.append(f"[edgesim] final accuracy {summary['final_accuracy']}, best {summary['best_accuracy']}")
    system = summary.get("system")
    if system:
        lines.append(f"[edgesim] system: {format_system_summary(system) or 'no samples'}")
        lines += [f"[edgesim] WARNING: {w}" for w in system.get("warnings") or ()]
    lines.append(
        f"[edgesim] results: {results_dir} (metrics.json, events.jsonl, global_model.pt, accuracy.png, tensorboard/)"
    )
    return "\n".join(lines)

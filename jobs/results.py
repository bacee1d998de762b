"""After a run: merge the leaves' simulated clocks into ``metrics.json``, draw ``accuracy.png``, summarise."""

from __future__ import annotations

import glob
import json
import os

from common.jsonio import write_json_atomic
from evaluation.monitor import format_summary as format_system_summary
from evaluation.run_recorder import run_summary


def simulated_times(results_dir: str, records: list[dict]) -> None:
    """Give each evaluated version the simulated time at which it existed: the latest simulated finish time any
    leaf had reported by the version's wall-clock time (leaves keep separate clocks; we take the furthest)."""
    events = []
    for path in glob.glob(os.path.join(results_dir, "simclock_*.jsonl")):
        with open(path) as f:
            events += [json.loads(line) for line in f if line.strip()]
    if not events:
        return
    events.sort(key=lambda e: e["wall"])
    for rec in records:
        wall = rec.get("epoch")
        if wall is None:
            continue
        done = [e["sim"] for e in events if e["wall"] <= wall]
        rec["sim_seconds"] = round(max(done), 3) if done else 0.0


def plot_accuracy(records: list[dict], path: str, title: str) -> None:
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


def finalize(results_dir: str, total_seconds: float, updates_per_version: int) -> dict:
    """Complete ``metrics.json`` with simulated times and a summary; draw the plot. Returns the summary, with the
    evaluator's system summary and warnings under ``system`` when it wrote one (kept only at ``metrics["system"]``
    in the file)."""
    metrics_path = os.path.join(results_dir, "metrics.json")
    if not os.path.exists(metrics_path):
        raise RuntimeError(f"the job wrote no {metrics_path}: see the NVFlare logs in the workspace")
    with open(metrics_path) as f:
        metrics = json.load(f)
    records = metrics.get("versions", [])
    simulated_times(results_dir, records)
    summary = {"total_seconds": round(total_seconds, 2)} | run_summary(records, updates_per_version)
    metrics["summary"] = summary
    write_json_atomic(metrics_path, metrics)
    if records:
        title = (metrics.get("config", {}).get("run") or {}).get("job_name", "")
        plot_accuracy(records, os.path.join(results_dir, "accuracy.png"), title)
    if metrics.get("system") is not None:
        return summary | {"system": metrics["system"]}
    return summary


def format_summary(summary: dict, results_dir: str) -> str:
    lines = [f"[edgesim] done in {summary['total_seconds']:.1f} s: {summary['versions_trained']} versions trained"]
    if summary.get("seconds_per_version") is not None:
        lines.append(
            f"[edgesim] {summary['seconds_per_version']:.2f} s per version, "
            f"{summary.get('devices_per_second') or 0:.1f} devices trained per second"
        )
    if summary.get("simulated_seconds") is not None:
        lines.append(f"[edgesim] simulated time: {summary['simulated_seconds']:.1f} s")
    lines.append(f"[edgesim] final accuracy {summary['final_accuracy']}, best {summary['best_accuracy']}")
    system = summary.get("system")
    if system:
        lines.append(f"[edgesim] system: {format_system_summary(system) or 'no samples'}")
        lines += [f"[edgesim] WARNING: {w}" for w in system.get("warnings") or ()]
    lines.append(f"[edgesim] results: {results_dir} (metrics.json, global_model.pt, accuracy.png, tensorboard/)")
    return "\n".join(lines)

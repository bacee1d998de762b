"""``accuracy.png``: a run's accuracy against model version, wall seconds, (when it has them) simulated seconds,
(with compression or a bandwidth, ``common.compression``) the megabytes moved up and down, and (with differential
privacy) the epsilon spent, with an adaptive clip norm over the versions;
under an availability model also the devices online at each version, and the failure rate in the title; with
per-user test data the spread of the users' accuracies (10th to 90th percentile, and the median) by version.

Drawn by the server's run recorder at the end of the run (so an exported job run by ``nvflare simulator`` has it
too) and by the driver when a run was interrupted before its server could. Importing matplotlib costs about a
second of CPU (more on a loaded machine), which at END_RUN stood between a run's last version and its exit: the
recorder calls ``warm_up`` when the run's outcome is decided, so the import runs while the last version is being
evaluated and the leaves are idle, and the drawing at END_RUN finds matplotlib loaded.
"""

from __future__ import annotations

import threading

from common.jsonio import replacing
from evaluation.fleet import failure_rate


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported once per process)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def warm_up() -> threading.Thread:
    """Import matplotlib on a thread of its own (see the module docstring); a plot drawn meanwhile waits for the
    import (Python's import lock) rather than importing it twice."""
    thread = threading.Thread(target=_pyplot, name="plot-warm-up", daemon=True)
    thread.start()
    return thread


def plot_accuracy(records: list[dict], path: str, title: str) -> None:
    """Accuracy against model version, wall seconds and (when the run has them) simulated seconds, bytes moved and
    epsilon spent."""
    plt = _pyplot()

    has_sim = any(r.get("sim_seconds") for r in records)
    moved = [r for r in records if "bytes_up" in (r.get("fleet") or {})]  # compression or a bandwidth was on
    private = [r for r in records if (r.get("privacy") or {}).get("epsilon") is not None]
    panels = 2 + has_sim + bool(moved) + bool(private)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    versions = [r["version"] for r in records]
    acc = [r["accuracy"] for r in records]
    axes[0].plot(versions, acc, marker="o")
    spread = [(r["version"], r["per_user"]) for r in records if r.get("per_user", {}).get("users")]
    if spread:  # per-user test data: the middle 80% of the users' accuracies, and their median
        at = [v for v, _ in spread]
        axes[0].fill_between(at, [s["p10"] for _, s in spread], [s["p90"] for _, s in spread], alpha=0.2)
        axes[0].plot(at, [s["median"] for _, s in spread], linestyle=":", label="users: median, p10-p90")
        axes[0].legend(loc="lower right")
    axes[0].set_xlabel("global model version")
    fleet = [(r["version"], r["fleet"]) for r in records if r.get("fleet")]
    if fleet and any(f["online"] < f["devices"] for _, f in fleet):  # an availability model: who was online
        online = axes[0].twinx()
        online.plot([v for v, _ in fleet], [f["online"] for _, f in fleet], color="grey", linestyle="--")
        online.set_ylabel("devices online (dashed)")
    rate = failure_rate(records)
    if rate:
        title = f"{title} (failure rate {100 * rate:.1f}%)"

    axes[1].plot([r["wall_seconds"] for r in records], acc, marker="o")
    axes[1].set_xlabel("wall-clock seconds since job start")
    if has_sim:
        axes[2].plot([r.get("sim_seconds", 0) for r in records], acc, marker="o")
        axes[2].set_xlabel("simulated seconds")
    if moved:  # communication: the accuracy the bytes bought, uploads (what compression shrinks) and downloads
        ax = axes[2 + has_sim]
        accuracy = [r["accuracy"] for r in moved]
        ax.plot([r["fleet"]["bytes_up"] / 1e6 for r in moved], accuracy, marker="o", label="uploaded")
        ax.plot([r["fleet"]["bytes_down"] / 1e6 for r in moved], accuracy, linestyle="--", label="downloaded")
        ax.set_xlabel("megabytes moved by the fleet")
        ax.legend(loc="lower right")
    if private:  # differential privacy: the accuracy-privacy curve of the run
        axes[-1].plot([r["privacy"]["epsilon"] for r in private], [r["accuracy"] for r in private], marker="o")
        axes[-1].set_xlabel(f"epsilon spent (delta {private[-1]['privacy']['delta']:g})")
        adaptive = [r for r in private if "noised_unclipped_fraction" in r["privacy"]]
        if adaptive:  # the clip norm over the run, as adaptive clipping moved it
            norm = axes[0].twinx()
            norm.plot([r["version"] for r in adaptive], [r["privacy"]["clip_norm"] for r in adaptive], color="grey")
            norm.set_ylabel("clip norm (grey)")
    for ax in axes:
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    with replacing(path) as tmp:  # the server and the driver may both draw it
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)

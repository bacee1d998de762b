"""After a run: read ``metrics.json`` (written by the server's ``RunRecorder`` only), make sure ``accuracy.png``
is drawn, and summarise for the console, naming the result files that exist (``common.result_files``, and the
method's own: ``result_files_of``).

In SimEnv the driver draws ``accuracy.png`` (``PlotAhead``): drawn by the server, the plot stood between the run's
last version and NVFlare's shutdown (about a second of matplotlib, several on a loaded machine); drawn here it
overlaps that shutdown, and the driver waits for it before it returns, so ``--output`` is still complete then.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass

from common.result_files import ACCURACY_PLOT, METRICS, present, run_files
from evaluation.plots import plot_accuracy, warm_up
from evaluation.run_recorder import summary_of
from evaluation.utilisation import format_summary as format_system_summary
from jobs.methods import Method


def result_files_of(method: Method) -> tuple[str, ...]:
    """Every file (name or glob pattern) a run of ``method`` writes: every run's, then the method's own."""
    return run_files(method.result_files)


def read_metrics(results_dir: str) -> dict:
    """The run's ``metrics.json`` as written so far (``{}`` while there is none or it cannot be read)."""
    try:
        with open(os.path.join(results_dir, METRICS)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


@dataclass(frozen=True)
class RunResult:
    """Attributes:
    exit_code: 0 completed, 1 ended early (``outcome`` says why), 2 refused before start, 3 completed but its last
        version unevaluated or nothing saved (``python -m jobs.finish``), 130/143 interrupted.
    output: the results folder.
    metrics: ``metrics.json`` (empty when the run wrote none).
    """

    exit_code: int
    output: str
    metrics: dict

    @property
    def accuracies(self) -> list[tuple[int, float]]:
        return [(r["version"], r["accuracy"]) for r in self.metrics.get("versions", [])]

    @property
    def final_accuracy(self) -> float | None:
        return self.accuracies[-1][1] if self.accuracies else None

    @property
    def outcome(self) -> dict | None:
        return self.metrics.get("outcome")


def finalize(results_dir: str, total_seconds: float, drawn: int | None = None) -> dict:
    """Draw the plot unless it is drawn (by ``PlotAhead``: ``drawn`` versions, all of the run's; or by the server
    after the last change of ``metrics.json``) and return the run's summary (the recorder's, or one computed from
    what was recorded), with ``total_seconds`` and the system summary under ``system``."""
    metrics_path = os.path.join(results_dir, METRICS)
    if not os.path.exists(metrics_path):
        raise RuntimeError(f"the job wrote no {metrics_path}: see the NVFlare logs in the workspace")
    with open(metrics_path) as f:
        metrics = json.load(f)
    records = metrics.get("versions", [])
    config = metrics.get("config") or {}
    summary = metrics.get("summary") or summary_of(results_dir, metrics)
    summary = {"total_seconds": round(total_seconds, 2)} | summary
    plot = os.path.join(results_dir, ACCURACY_PLOT)
    stale = not os.path.exists(plot) or os.path.getmtime(plot) < os.path.getmtime(metrics_path)
    if records and stale and drawn != len(records):
        plot_accuracy(records, plot, (config.get("run") or {}).get("job_name", ""))
    if metrics.get("system") is not None:
        summary["system"] = metrics["system"]
    return summary


def format_summary(summary: dict, results_dir: str, files: tuple[str, ...]) -> str:
    """The end-of-run lines: versions made and evaluated, speed, accuracy, system, and which of the run's result
    ``files`` (``result_files_of``) exist."""
    trained, evaluated = summary["versions_trained"], summary.get("versions_evaluated")
    line = f"[edgesim] done in {summary['total_seconds']:.1f} s: {trained} version(s) trained"
    last, last_evaluated = summary.get("last_version"), summary.get("last_evaluated_version")
    if evaluated is not None:
        line += f", {evaluated} evaluated"
        if last_evaluated is not None and last is not None and last_evaluated < last:
            line += f" (the last evaluated is version {last_evaluated} of {last})"
    lines = [line]
    if summary.get("seconds_per_version") is not None:
        lines.append(
            f"[edgesim] {summary['seconds_per_version']:.2f} s per version, "
            f"{summary.get('devices_per_second') or 0:.1f} devices trained per second"
        )
    if summary.get("simulated_seconds") is not None:
        lines.append(f"[edgesim] simulated time: {summary['simulated_seconds']:.3f}")
    if summary.get("final_accuracy") is None:
        lines.append("[edgesim] no version evaluated")
    else:
        lines.append(
            f"[edgesim] final accuracy {summary['final_accuracy']:.4f} (version {last_evaluated}), "
            f"best {summary['best_accuracy']:.4f}"
        )
    system = summary.get("system")
    if system:
        lines.append(f"[edgesim] system: {format_system_summary(system) or 'no samples'}")
        lines += [f"[edgesim] WARNING: {w}" for w in system.get("warnings") or ()]
    lines.append(f"[edgesim] results: {results_dir} ({', '.join(present(results_dir, files)) or 'no result files'})")
    return "\n".join(lines)


def tail_keys(path: str, size: int = 8192) -> set[str]:
    """Which of ``outcome`` and ``summary`` ``metrics.json`` holds, from its last ``size`` bytes: the recorder writes
    them last, as top-level keys (indented by two spaces), so a long run's file is not parsed every second."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return set()
    return {key for key in ("outcome", "summary") if f'\n  "{key}": ' in tail}


class PlotAhead:
    """Draws a SimEnv run's ``accuracy.png`` on a thread of the driver as soon as the server has recorded the run's
    summary (at END_RUN), while NVFlare shuts down; imports matplotlib once the outcome is decided (the last
    version is then being evaluated). ``finish()`` waits for the drawing and says how many versions it holds
    (None: not drawn, e.g. a run stopped before its summary; ``finalize`` then draws it).

    Args:
        results_dir: the run's results folder.
        interval: seconds between looks at ``metrics.json`` once the outcome is decided (1 s before).
    """

    def __init__(self, results_dir: str, interval: float = 0.05):
        self.results_dir = results_dir
        self.interval = interval
        self.drawn: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plot-ahead", daemon=True)

    def __enter__(self) -> PlotAhead:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def finish(self) -> int | None:
        """Wait for a drawing under way; the versions drawn."""
        self._stop.set()
        self._thread.join()
        return self.drawn

    def _run(self) -> None:
        path, mtime, warmed = os.path.join(self.results_dir, METRICS), 0.0, False
        while True:
            stopped = self._stop.wait(self.interval if warmed else 1.0)  # one more look after the stop
            try:
                changed = os.path.getmtime(path)
            except OSError:
                changed = mtime
            if changed != mtime:
                mtime, keys = changed, tail_keys(path)
                if not warmed and keys & {"outcome", "summary"}:
                    warmed = bool(warm_up())
                metrics = read_metrics(self.results_dir) if "summary" in keys else {}
                if "summary" in metrics and metrics.get("versions"):
                    records, config = metrics["versions"], metrics.get("config") or {}
                    title = (config.get("run") or {}).get("job_name", "")
                    plot_accuracy(records, os.path.join(self.results_dir, ACCURACY_PLOT), title)
                    self.drawn = len(records)
                    return
            if stopped:
                return

"""What a tracker receives of a run, read from its result files: the figures of each evaluated version, accuracy
by simulated time, staleness by version, how the run ended, and the files kept as artefacts.

A version's figures are its ``metrics.json`` record's numbers (``evaluation.run_recorder``): ``accuracy``,
``loss``, ``devices_per_second``, ``seconds_per_version``, ``sim_seconds``, ``wall_seconds``, ``eval_seconds``,
``mean_group_size``, and grouped by prefix the record's ``system/*``, ``fleet/*``, ``per_user/*`` and the
method's ``method/*`` numbers (with compression or a bandwidth, ``fleet/bytes_up`` and ``fleet/bytes_down``: the
bytes the fleet moved so far). ``accuracy_vs_sim_ms`` is the accuracy again at step = simulated milliseconds
(trackers' steps are whole numbers), and ``accuracy_vs_kb_up`` at step = kilobytes uploaded (when counted). ``staleness/mean``, ``staleness/max`` and ``staleness/updates`` of a version
are those of the updates that went into it (``events.jsonl``'s ``tau``; failed ones excluded).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict

from common.result_files import ACCURACY_PLOT, EVENTS, GLOBAL_MODEL, METRICS

SIM_METRIC = "accuracy_vs_sim_ms"
BYTES_METRIC = "accuracy_vs_kb_up"
PLAIN = (
    "accuracy",
    "loss",
    "devices_per_second",
    "seconds_per_version",
    "sim_seconds",
    "wall_seconds",
    "eval_seconds",
    "mean_group_size",
)
GROUPS = {"system": "system", "fleet": "fleet", "per_user": "per_user", "method": "method"}
ARTEFACTS = (METRICS, EVENTS, ACCURACY_PLOT, GLOBAL_MODEL)
STATUS = {"completed": "FINISHED", "stopped": "FAILED", "interrupted": "KILLED", "pruned": "KILLED"}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def version_metrics(record: dict) -> dict[str, float]:
    """A ``metrics.json`` record's numbers, named as the module docstring says (missing and non-numbers left out)."""
    found = {k: v for k in PLAIN if (v := _number(record.get(k))) is not None}
    for key, prefix in GROUPS.items():
        for name, value in (record.get(key) or {}).items() if isinstance(record.get(key), dict) else ():
            if name != "num_samples" and (v := _number(value)) is not None:
                found[f"{prefix}/{name}"] = v
    return found


def sim_step(record: dict) -> int | None:
    """The record's simulated time in whole milliseconds (the step of ``accuracy_vs_sim_ms``), if it has one."""
    seconds = _number(record.get("sim_seconds"))
    return round(seconds * 1000) if seconds is not None else None


def bytes_step(record: dict) -> int | None:
    """The kilobytes the fleet had uploaded by the record's version (the step of ``accuracy_vs_kb_up``), when the
    run counted them (compression or a bandwidth on: ``fleet.bytes_up``)."""
    up = _number((record.get("fleet") or {}).get("bytes_up")) if isinstance(record.get("fleet"), dict) else None
    return round(up / 1000) if up is not None else None


class StalenessReader:
    """Staleness by version from a growing ``events.jsonl``: ``read`` returns the versions that are complete (a
    later version's update has been applied), ``read(final=True)`` every version so far. Each version once."""

    def __init__(self, results_dir: str, after: int = 0):
        self.path = os.path.join(results_dir, EVENTS)
        self.after = after  # versions up to this one were returned before (by an earlier attempt of the run)
        self._offset = 0
        self._taus: dict[int, list[int]] = defaultdict(list)
        self._counts: dict[int, int] = defaultdict(int)
        self._newest = 0

    def read(self, final: bool = False) -> dict[int, dict[str, float]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for its end
        self._offset += end
        for line in chunk[:end].splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            version = int(event["version"])
            self._newest = max(self._newest, version)
            self._counts[version] += 1
            if not event.get("failed"):
                self._taus[version].append(int(event["tau"]))
        done = sorted(v for v in self._counts if v > self.after and (final or v < self._newest))
        rows = {}
        for v in done:
            taus = self._taus.pop(v, [])
            self._counts.pop(v)
            if taus:
                rows[v] = {"staleness/mean": sum(taus) / len(taus), "staleness/max": float(max(taus))}
                rows[v]["staleness/updates"] = float(len(taus))
        if done:
            self.after = max(self.after, done[-1])
        return rows


def _flat(prefix: str, value, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}", v, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(value)[:5000]
    elif value is not None:
        out[prefix] = str(value)[:5000]


def end_tags(metrics: dict) -> dict[str, str]:
    """How the run ended, as tags: ``outcome`` (completed, stopped, interrupted, pruned), ``outcome.reason`` and the
    rest of the outcome, and the summary's figures (``summary.final_accuracy``, ``summary.system.*`` ...)."""
    tags: dict[str, str] = {}
    outcome = dict(metrics.get("outcome") or {})
    if outcome:
        tags["outcome"] = str(outcome.pop("status", ""))
        _flat("outcome", outcome, tags)
    _flat("summary", metrics.get("summary") or {}, tags)
    return tags


def end_status(metrics: dict) -> str:
    """MLflow's status word for how the run ended (FINISHED, FAILED or KILLED; FAILED when it decided nothing)."""
    return STATUS.get((metrics.get("outcome") or {}).get("status"), "FAILED")


def artefacts(results_dir: str) -> list[str]:
    """The result files a tracker keeps a copy of, those that exist: ``metrics.json``, ``events.jsonl``,
    ``accuracy.png`` and ``global_model.pt``."""
    return [p for name in ARTEFACTS if os.path.exists(p := os.path.join(results_dir, name))]

"""What a slice of a seed's run says about the whole seed: the pure part of ``benchmarks/repro/paper_seed.py``.

A slice is a real job stopped after its first versions. Its results folder holds everything needed, all of it
written by the job itself: ``metrics.json`` (each evaluated version's record, with ``server``: the wall seconds the
method's strategy took so far and when the version was made, ``aggregation.global_model.ServerWork``; its
evaluation seconds; the system monitor's GPU busy %), ``events.jsonl`` (which update went into which version), the
leaves' report lines (``leaf_<leaf>.jsonl``: each device's group and the wall seconds its training call took) and
FedRevive's log (each update's synthesis and distillation seconds).

``window`` picks the slice's steady stretch (between two evaluated versions, after start-up and, for FedRevive,
once revival runs); ``phases`` splits that stretch's wall time by phase; ``estimate`` extrapolates the whole seed
from the stretch's wall seconds per applied update and the seed's own counts (``seed_counts``, from the job's event
trace over the whole time budget, as ``--dry-run`` computes it).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

from common.result_files import EVENTS, LEAF_LOGS, METRICS
from fedrevive.config import LOG_FILE as FEDREVIVE_LOG


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass
class Slice:
    """One method's slice, as its job left it.

    Attributes:
        method: the method's name.
        metrics: its ``metrics.json``.
        events: its ``events.jsonl`` lines.
        reports: every leaf's report lines (``leaf_<leaf>.jsonl``), together.
        revive: FedRevive's log lines (empty for other methods).
        started: epoch seconds as the job's process started.
        ended: epoch seconds once it had exited.
        exit_code: the job's exit code (0: its versions done; 143: stopped at the slice's deadline).
    """

    method: str
    metrics: dict
    events: list[dict]
    reports: list[dict]
    revive: list[dict]
    started: float
    ended: float
    exit_code: int = 0

    @property
    def records(self) -> list[dict]:
        """Evaluated versions that carry the server's figures, in version order."""
        return sorted((r for r in self.metrics.get("versions", []) if r.get("server")), key=lambda r: r["version"])

    def updates_into(self, version: int) -> int:
        """Updates applied before ``version`` was made (those that went into it or an earlier one)."""
        return sum(1 for e in self.events if e["version"] <= version)


def read_slice(method: str, out: str, started: float, ended: float, exit_code: int = 0) -> Slice:
    """The slice a job wrote into ``out``."""
    metrics = {}
    if os.path.exists(os.path.join(out, METRICS)):
        with open(os.path.join(out, METRICS)) as f:
            metrics = json.load(f)
    reports = [line for path in sorted(glob.glob(os.path.join(out, LEAF_LOGS))) for line in read_jsonl(path)]
    events = read_jsonl(os.path.join(out, EVENTS))
    return Slice(
        method, metrics, events, reports, read_jsonl(os.path.join(out, FEDREVIVE_LOG)), started, ended, exit_code
    )


def seed_counts(events: list[dict], budget: float, synchronous: bool, revive: dict | None) -> dict:
    """What a whole seed does within ``budget`` simulated time units, from its event trace (``events.jsonl`` of
    ``--dry-run``): applied updates, versions, evaluations (every version for a synchronous method, every 10 for
    an asynchronous one, as ``reproduce_fedrevive.py`` runs them), and with ``revive`` (FedRevive's settings) its
    server's synthesis rounds and distillations, by the rule ``fedrevive.distill`` applies (a stale update, at the
    version before it goes in)."""
    applied = [e for e in events if e["arrival"] <= budget]
    versions = max((e["version"] for e in applied), default=1)
    counts = {
        "updates": len(applied),
        "versions": versions,
        "evaluations": versions if synchronous else versions // 10 + 1,
    }
    if revive:
        stale = [e["version"] - 1 for e in applied if e["tau"] > 0]
        every = revive["synth_every_versions"]
        counts["synthesis rounds"] = sum(1 for v in stale if v >= revive["distill_from_version"] and v % every == 0)
        counts["distillations"] = sum(1 for v in stale if v >= revive["kd_train_from_version"])
    return counts


@dataclass
class Window:
    """The steady stretch of a slice: from evaluated version ``first`` to ``last``.

    Attributes:
        first: the version it starts after (made at ``first_made``).
        last: the version it ends with.
        seconds: wall seconds between the two versions being made.
        updates: updates applied in between.
        steady: False when the slice had no stretch after start-up (the window then includes it).
    """

    first: int
    last: int
    first_made: float
    seconds: float
    updates: int
    steady: bool = True

    @property
    def per_update(self) -> float | None:
        return self.seconds / self.updates if self.updates else None


def window(s: Slice, steady_from: int) -> Window | None:
    """The stretch between the first evaluated version at or after ``steady_from`` and the last one (None: fewer
    than two evaluated versions)."""
    records = s.records
    if len(records) < 2:
        return None
    steady = [r for r in records if r["version"] >= steady_from]
    chosen = steady if len(steady) >= 2 else records[-2:] if len(records) >= 2 else records
    a, b = chosen[0], chosen[-1]
    made_a, made_b = a["server"]["made_epoch"], b["server"]["made_epoch"]
    updates = s.updates_into(b["version"]) - s.updates_into(a["version"])
    return Window(a["version"], b["version"], made_a, made_b - made_a, updates, steady=len(steady) >= 2)


@dataclass
class Phases:
    """Wall seconds of each phase within a window, with their counts (``phases``)."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    gpu_busy: float | None = None

    def per_unit(self, phase: str) -> float | None:
        n = self.counts.get(phase, 0)
        return self.seconds.get(phase, 0.0) / n if n else None


PHASES = (
    ("device training", "tasks", "the leaves' training calls, each group's once"),
    ("server intake", "updates", "the strategy's add_update, FedRevive's synthesis and distillation aside"),
    ("aggregation", "versions", "the strategy's make_version"),
    ("synthesis", "synthesis rounds", "FedRevive's generator rounds"),
    ("distillation", "distillations", "FedRevive's KD of the student"),
    ("evaluation", "evaluations", "the evaluator's thread, beside the rest"),
    ("server waiting", "", "the server's applier idle: the wire, or training still under way"),
)
"""(phase, its unit, what it measures), in the order they are printed."""


def phases(s: Slice, w: Window, samples_per_task: int) -> Phases:
    """The window's wall seconds by phase (``PHASES``). Device training sums each training call once (the leaves'
    workers run side by side, so it may exceed the window); the server's phases run one after another on its
    applier thread, and what is left of the window there is its waiting."""
    records = {r["version"]: r for r in s.records}
    a, b = records[w.first], records[w.last]
    end = w.first_made + w.seconds
    lines = [line for line in s.reports if w.first_made < line.get("wall", 0) <= end and line.get("ok", True)]
    revived = [e for e in s.revive if w.first < e["version"] <= w.last]
    evaluated = [r for r in s.metrics.get("versions", []) if w.first < r["version"] <= w.last]
    out = Phases()
    out.seconds["device training"] = sum(
        line.get("train_seconds", 0.0) / max(1, line.get("group", 1)) for line in lines
    )
    out.counts["device training"] = len(lines)
    out.samples = len(lines) * samples_per_task
    synthesis = sum(e.get("synth_seconds", 0.0) for e in revived)
    distillation = sum(e.get("distill_seconds", 0.0) for e in revived)
    update_seconds = b["server"]["update_seconds"] - a["server"]["update_seconds"]
    version_seconds = b["server"]["version_seconds"] - a["server"]["version_seconds"]
    out.seconds["server intake"] = update_seconds - synthesis - distillation
    out.counts["server intake"] = w.updates
    out.seconds["aggregation"] = version_seconds
    out.counts["aggregation"] = w.last - w.first
    out.seconds["synthesis"] = synthesis
    out.counts["synthesis"] = sum(1 for e in revived if "synth_seconds" in e)
    out.seconds["distillation"] = distillation
    out.counts["distillation"] = sum(1 for e in revived if "distill_seconds" in e)
    out.seconds["evaluation"] = sum(r.get("eval_seconds", 0.0) for r in evaluated)
    out.counts["evaluation"] = len(evaluated)
    out.seconds["server waiting"] = max(0.0, w.seconds - update_seconds - version_seconds)
    busy = [
        r["system"]["gpu_util_percent"]
        for r in evaluated
        if (r.get("system") or {}).get("gpu_util_percent") is not None
    ]
    out.gpu_busy = sum(busy) / len(busy) if busy else None
    return out


SEED_UNITS = {
    "device training": "updates",
    "server intake": "updates",
    "aggregation": "versions",
    "synthesis": "synthesis rounds",
    "distillation": "distillations",
    "evaluation": "evaluations",
}
"""Which of the seed's counts (``seed_counts``) each phase's per-unit cost is multiplied by."""


def seed_phase_seconds(p: Phases, counts: dict) -> dict[str, float | None]:
    """Each phase's work over the whole seed: its cost per unit in the window times the seed's units (phases
    overlap: the sum is not the seed's wall time)."""
    out: dict[str, float | None] = {}
    for phase, unit in SEED_UNITS.items():
        cost = p.per_unit(phase)
        out[phase] = None if cost is None or unit not in counts else cost * counts[unit]
    return out


@dataclass
class Estimate:
    """A method's whole seed in wall seconds: the slice's start-up, the seed's remaining updates at the window's
    pace (or its remaining evaluations at theirs, when evaluation falls behind), and the slice's ending.

    Attributes:
        start: wall seconds from the job's start to the window's first version.
        steady: the seed's updates after that version, at the window's seconds per update.
        evaluating: the seed's evaluations after that version, at the window's seconds per evaluation.
        tail: the slice's last version to the job's exit.
    """

    start: float
    steady: float
    evaluating: float
    tail: float

    @property
    def seconds(self) -> float:
        return self.start + max(self.steady, self.evaluating) + self.tail


def estimate(s: Slice, w: Window, p: Phases, counts: dict) -> Estimate:
    """The whole seed from the slice (``Estimate``), with the seed's ``counts``."""
    remaining = max(0, counts["updates"] - s.updates_into(w.first))
    evaluations_left = max(0, counts["evaluations"] - sum(1 for r in s.records if r["version"] <= w.first))
    last = max(s.metrics.get("versions", []), key=lambda r: r["version"])
    tail = max(0.0, s.ended - last.get("epoch", s.ended)) + last.get("eval_seconds", 0.0)
    per_eval = p.per_unit("evaluation") or 0.0
    return Estimate(w.first_made - s.started, remaining * (w.per_update or 0.0), evaluations_left * per_eval, tail)

"""What a trial scores, read from its ``metrics.json`` records (``evaluation.run_recorder``): each evaluated version's
``accuracy`` at its ``sim_seconds``.

* ``final_accuracy``: the last evaluated version's accuracy (maximised);
* ``accuracy_at``: the accuracy of the newest version made by the simulated-time budget (maximised);
* ``time_to_target``: the simulated seconds of the first version at or above the target accuracy (minimised;
  ``inf`` when never reached).

The pruner sees the curve on a grid of simulated time (``Objective.step`` seconds a step): step ``k`` holds the
accuracy of the newest version made by ``k * step`` simulated seconds. Two trials are thus compared at equal
simulated progress, whatever their wall time or the moments their versions happened to be made. A step is
reported only once a version made after it shows it is final.

A run's budget is the simulated time its objective is read at (``accuracy_at``'s budget) or, for another objective,
its own ``--max-sim-time``. A run that ended before it (its version cap, a stop, a crash) is marked with why
(``ended_early``): its objective holds its last version's accuracy, which is no fair comparison with runs that used
the whole budget. The sweep lifts the default version cap of such runs (``jobs.sweep.spec.budget_flags``), so only
a cap the spec gives, or a run that stopped, can end one early.

A candidate with repeats (``repeat:`` in the spec, e.g. three seeds) is scored and pruned on the mean over its
runs: its objective is the mean of their objectives, and step ``k`` is the mean of their values at ``k``, reported
once every run has it final (a run that has ended holds its last value for every later step; one not started yet
holds the candidate's reports back). So the pruner compares candidates' means at equal simulated time, never one
lucky or unlucky seed.
"""

from __future__ import annotations

import math

from jobs.sweep.spec import Objective


def _timed(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("sim_seconds") is not None and r.get("accuracy") is not None]


def accuracy_by(records: list[dict], seconds: float) -> float | None:
    """The accuracy of the newest version made by ``seconds`` simulated seconds (None: none yet)."""
    made = [r for r in _timed(records) if r["sim_seconds"] <= seconds + 1e-9]
    return made[-1]["accuracy"] if made else None


def score(objective: Objective, records: list[dict]) -> float | None:
    """The objective's value of a finished trial (None: it evaluated nothing that counts)."""
    if objective.metric == "final_accuracy":
        return records[-1]["accuracy"] if records else None
    if objective.metric == "accuracy_at":
        return accuracy_by(records, objective.budget)
    reached = [r for r in _timed(records) if r["accuracy"] >= objective.target]
    return reached[0]["sim_seconds"] if reached else (math.inf if records else None)


def step_value(objective: Objective, accuracy: float) -> float:
    """An intermediate value in the study's direction: accuracy, or (minimising) its shortfall ``1 - accuracy``."""
    return 1.0 - accuracy if objective.direction == "minimize" else accuracy


def final_steps(objective: Objective, records: list[dict], reported: int) -> list[tuple[int, float]]:
    """The steps after ``reported`` (the last step reported, -1: none) whose value is final now: every step before
    the newest version's own (a later version may still land in that one)."""
    return mean_steps(objective, [(records, False)], reported)


def mean_steps(objective: Objective, runs: list[tuple[list[dict], bool]], reported: int) -> list[tuple[int, float]]:
    """A candidate's steps after ``reported`` that are final for every one of its ``runs`` (each its records and
    whether it has ended), each the mean of the runs' values. A running run's steps are final up to its newest
    version's own; an ended run's, for ever (its last value held); a run with no version yet, none."""
    timed = [(_timed(records), ended) for records, ended in runs]
    horizons = []
    for records, ended in timed:
        if not records:
            return []
        newest = int(math.floor(records[-1]["sim_seconds"] / objective.step + 1e-9))
        horizons.append(None if ended else newest)
    running = [h for h in horizons if h is not None]
    if not running:
        return []  # every run has ended: the candidate's score is told, no more steps are needed
    out = []
    for k in range(reported + 1, min(running)):
        values = [accuracy_by(records, k * objective.step) for records, _ in timed]
        if any(v is None for v in values):
            continue
        out.append((k, sum(step_value(objective, v) for v in values) / len(values)))
    return out


def mean_score(objective: Objective, runs: list[list[dict]]) -> float | None:
    """A candidate's objective: the mean of its runs' (None when one of them scored nothing)."""
    values = [score(objective, records) for records in runs]
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def run_budget(objective: Objective, metrics: dict) -> float | None:
    """The simulated seconds a run must reach (``metrics``: its ``metrics.json``): the objective's budget, else the
    run's own ``--max-sim-time`` (None: it has none)."""
    if objective.metric == "accuracy_at":
        return objective.budget
    return ((metrics.get("config") or {}).get("federation") or {}).get("max_sim_time")


def ended_early(objective: Objective, metrics: dict) -> str | None:
    """Why a run ended before its budget (``run_budget``), in words; None when it reached it, has no budget, or
    has not ended. A run its ``--max-sim-time`` ended reached that time (no update arrived before it)."""
    budget, outcome = run_budget(objective, metrics), metrics.get("outcome")
    if budget is None or not outcome:
        return None
    records = _timed(metrics.get("versions", []))
    end = outcome.get("sim_seconds", records[-1]["sim_seconds"] if records else 0.0)
    if end >= budget - 1e-9:
        return None
    federation = (metrics.get("config") or {}).get("federation") or {}
    cap = federation.get("max_sim_time")
    if outcome.get("status") == "completed" and outcome.get("version", 0) < federation.get("max_model_version", 0):
        if cap is not None and cap >= budget - 1e-9:
            return None  # its budget of simulated time ended it: nothing arrived between its last update and then
    status, reason = outcome.get("status", "ended"), outcome.get("reason", "")
    return f"ended at {end:.4g} simulated s, before the budget {budget:g} s ({status}: {reason})"

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
    timed = _timed(records)
    if not timed:
        return []
    newest = int(math.floor(timed[-1]["sim_seconds"] / objective.step + 1e-9))
    out = []
    for k in range(reported + 1, newest):
        accuracy = accuracy_by(timed, k * objective.step)
        if accuracy is not None:
            out.append((k, step_value(objective, accuracy)))
    return out

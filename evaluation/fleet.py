"""The fleet's figures in a run's results: a version record's ``fleet`` (written by the evaluator from the schedule's
``ExactSchedule.fleet()``) and the failure rate the summary and ``accuracy.png`` give."""

from __future__ import annotations


def failure_rate(records: list[dict]) -> float | None:
    """Failed updates (devices that dropped out or counted nothing) over those applied, up to the last recorded
    version that has fleet figures (None: none has)."""
    fleet = next((r["fleet"] for r in reversed(records) if r.get("fleet")), None)
    if not fleet or not fleet.get("updates"):
        return None
    return round(fleet["failed"] / fleet["updates"], 4)

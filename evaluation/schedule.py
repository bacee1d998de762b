"""Which versions a run evaluates: 1, every ``--eval-frequency``-th, the last one asked for and the last one made.

The evaluator decides with it what to score (``is_scheduled``); the run's summary, with the run's saved config, which
scheduled versions have no record (``unevaluated_versions``: ``metrics.json``'s ``versions_unevaluated``, what
``python -m jobs.finish`` completes).
"""

from __future__ import annotations


def is_scheduled(version: int, eval_frequency: int, max_model_version: int) -> bool:
    """Whether ``version`` is scheduled for evaluation: 1, every ``eval_frequency``-th, and ``max_model_version``
    (the last version made is scheduled too: ``unevaluated_versions``)."""
    return (version - 1) % eval_frequency == 0 or bool(max_model_version and version >= max_model_version)


def unevaluated_versions(records: list[dict], last_version: int, eval_frequency: int = 1, max_version: int = 0):
    """The versions up to ``last_version`` scheduled for evaluation (the last one always) that have no record and
    were not skipped on purpose (a record's ``skipped_versions``), in order."""
    done = {r["version"] for r in records} | {v for r in records for v in r.get("skipped_versions") or ()}
    scheduled = [v for v in range(1, last_version + 1) if is_scheduled(v, max(1, eval_frequency), max_version)]
    return [v for v in sorted({*scheduled, last_version}) if v not in done]


def schedule_of(config: dict) -> tuple[int, int]:
    """``eval_frequency`` and ``max_model_version`` of a run's saved config (``metrics.json``'s ``config``)."""
    run, federation = config.get("run") or {}, config.get("federation") or {}
    return int(run.get("eval_frequency") or 1), int(federation.get("max_model_version") or 0)

"""The CPU cores this process may run on: its affinity mask where the OS has one (a container's or ``taskset``'s
limit), else every logical core. The planner, a sweep's packing and the evaluator's thread count all size by it."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (at least 1)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # not Linux: no affinity mask to read

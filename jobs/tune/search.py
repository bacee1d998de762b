"""The tuner's pure logic: trial points, the exploration of worker counts and group sizes, the recommendation
and its table (testable with fake trials; ``jobs.tune`` describes the whole tuner)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from simulation.fast_simulator import is_out_of_memory

MIB = 2**20
MIN_JOB_TIMEOUT = 60.0
JOB_TIMEOUT_FACTOR = 3.0
OK, NO_GAIN, OOM, ERROR = "ok", "no gain", "oom", "error"
MEASURED = (OK, NO_GAIN)  # statuses whose throughput is a real measurement


# -- data ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialPoint:
    """One point of the search space: W parallel workers, each training ``group_size`` devices at a time."""

    workers: int
    group_size: int = 1


@dataclass(frozen=True)
class TrialResult:
    workers: int
    group_size: int = 1
    devices: int = 0
    seconds: float = 0.0
    devices_per_s: float = 0.0
    peak_rss_bytes: int | None = None
    peak_cuda_bytes: int | None = None
    torch_threads: int | None = None
    status: str = OK  # ok | no gain | oom | error
    detail: str = ""

    @property
    def point(self) -> TrialPoint:
        return TrialPoint(self.workers, self.group_size)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Recommendation:
    num_workers: int | None
    group_size: int | None
    devices_per_s: float | None
    job_timeout: float | None  # None: not measured (keep the job's default)
    first_task_seconds: float | None
    reason: str
    engine: str | None = None  # set when trials compared engines (group size 1 vs larger groups)

    def flags(self) -> str:
        parts = []
        if self.engine is not None:
            parts.append(f"--engine {self.engine}")
        if self.group_size is not None and self.group_size > 1:
            parts.append(f"--group-size {self.group_size}")
        if self.num_workers is not None:
            parts.append(f"--num-workers {self.num_workers}")
        if self.job_timeout is not None:
            parts.append(f"--job-timeout {self.job_timeout:g}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["flags"] = self.flags()
        return d


# -- pure logic ----------------------------------------------------------------------------------------------------
def worker_steps(max_workers: int) -> list[int]:
    """1, 2, 4, ... up to ``max_workers``, with ``max_workers`` itself last when it is no power of two."""
    if max_workers < 1:
        raise ValueError(f"max_workers {max_workers}: must be >= 1")
    steps, w = [], 1
    while w < max_workers:
        steps.append(w)
        w *= 2
    return steps + [max_workers]


def candidate_points(max_workers: int, group_sizes: Sequence[int] = (1,)) -> list[TrialPoint]:
    """Every (workers, group size) point to try, branch by branch (group size), workers ascending."""
    return [TrialPoint(w, g) for g in group_sizes for w in worker_steps(max_workers)]


def explore(
    run_trial: Callable[[TrialPoint], TrialResult],
    candidates: Sequence[TrialPoint],
    min_gain: float = 0.05,
    log: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """Run trials in order; each group size is a branch whose workers should ascend.

    A branch stops after a trial that runs out of memory (an exception ``is_out_of_memory`` recognises, or a
    result with status ``oom``; recorded, never raised), that fails otherwise (status ``error``), or whose
    devices/s gain over the branch's best so far is below ``min_gain`` (kept as a measurement, status
    ``no gain``). Later candidates of a stopped branch are skipped; other branches go on.
    """
    results: list[TrialResult] = []
    stopped: set[int] = set()
    best: dict[int, float] = {}
    for point in candidates:
        if point.group_size in stopped:
            continue
        try:
            result = run_trial(point)
        except Exception as ex:  # a trial must never take the tuner down
            status = OOM if is_out_of_memory(ex) else ERROR
            result = TrialResult(point.workers, point.group_size, status=status, detail=f"{type(ex).__name__}: {ex}")
        if result.status in MEASURED:
            previous = best.get(point.group_size)
            if previous is not None and result.devices_per_s < previous * (1 + min_gain):
                gain = result.devices_per_s / previous - 1 if previous > 0 else 0.0
                result = replace(result, status=NO_GAIN, detail=f"({gain:+.1%} < {min_gain:.0%})")
            else:
                best[point.group_size] = result.devices_per_s
        if result.status != OK:
            stopped.add(point.group_size)
        results.append(result)
        if log is not None:
            log(result)
    return results


def recommend_job_timeout(first_task_seconds: float) -> float:
    """``max(60, 3 x measured)`` seconds, rounded up to a whole second."""
    if first_task_seconds < 0:
        raise ValueError(f"first_task_seconds {first_task_seconds}: must be >= 0")
    return float(math.ceil(max(MIN_JOB_TIMEOUT, JOB_TIMEOUT_FACTOR * first_task_seconds) - 1e-9))


def recommend(
    trials: Sequence[TrialResult], tolerance: float = 0.0, first_task_seconds: float | None = None
) -> Recommendation:
    """The measured point with the most devices/s; points within ``tolerance`` (a fraction) of the best count as
    ties, and ties go to fewer workers (then smaller groups): less memory for the same throughput."""
    timeout = recommend_job_timeout(first_task_seconds) if first_task_seconds is not None else None
    measured = [t for t in trials if t.status in MEASURED and t.devices_per_s > 0]
    if not measured:
        why = "; ".join(f"W={t.workers}: {t.status} {t.detail}".strip() for t in trials) or "no trials ran"
        return Recommendation(None, None, None, timeout, first_task_seconds, f"no trial measured a throughput ({why})")
    top = max(t.devices_per_s for t in measured)
    tolerance = min(max(tolerance, 0.0), 1.0)
    tied = [t for t in measured if t.devices_per_s >= top * (1 - tolerance)]
    pick = min(tied, key=lambda t: (t.workers, t.group_size))
    reason = f"{pick.devices_per_s:.2f} devices/s with {pick.workers} worker(s)"
    if pick.group_size > 1:
        reason += f" in groups of {pick.group_size}"
    engines_compared = len({t.group_size > 1 for t in measured}) > 1
    engine = ("vectorized" if pick.group_size > 1 else "per-device") if engines_compared else None
    if pick.devices_per_s < top:
        reason += f" (within {tolerance:.0%} of the best, {top:.2f}, with fewer workers)"
    if any(t.status == OOM for t in trials):
        reason += f"; out of memory at W={min(t.workers for t in trials if t.status == OOM)}"
    return Recommendation(
        pick.workers, pick.group_size, pick.devices_per_s, timeout, first_task_seconds, reason, engine
    )


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def format_table(trials: Sequence[TrialResult]) -> str:
    """One row per trial: workers, group size, devices/s, peak RSS (and CUDA) MiB, status."""
    cuda = any(t.peak_cuda_bytes is not None for t in trials)
    groups = any(t.group_size != 1 for t in trials)
    header = ["workers"] + (["group"] if groups else []) + ["threads", "devices/s", "peak MiB"]
    header += (["CUDA MiB"] if cuda else []) + ["status"]
    rows = []
    for t in trials:
        measured = t.status in MEASURED
        row = [str(t.workers)] + ([str(t.group_size)] if groups else [])
        row += [str(t.torch_threads or "-"), f"{t.devices_per_s:.2f}" if measured else "-", _mib(t.peak_rss_bytes)]
        detail = t.detail.strip().splitlines()[0][:80] if t.detail.strip() else ""
        row += ([_mib(t.peak_cuda_bytes)] if cuda else []) + [f"{t.status} {detail}".strip()]
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [c.rjust(w) for c, w in zip(r[:-1], widths, strict=False)] + [r[-1]]
        lines.append("  ".join(cells))
    return "\n".join(lines)

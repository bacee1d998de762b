"""Auto-tuner: measure, on this machine, the worker count a leaf should use and the ``--job-timeout`` it needs.

``python -m jobs.tune [job flags...]`` takes every flag of ``jobs/pt_job_fedavg.py`` (same parser) plus
tuner flags (``--trial-devices``, ``--max-workers``, ``--trial-cores``, ``--min-gain``, ``--skip-job-probe``,
``--probe-timeout``, ``--json``). It:

1. runs short trials: for worker counts 1, 2, 4, ... (up to a cap) it trains ``--trial-devices`` simulated
   devices for real (through the job's own task processor, ``jobs.components.make_task_processor``: its model,
   batch, optimizer, local iterations and each device's data partition) on a ``ThreadPoolExecutor`` of W workers,
   and measures devices per second and peak memory (process RSS sampled with psutil; on CUDA also
   ``torch.cuda.max_memory_allocated``). A branch stops at the first out-of-memory trial (recorded, not fatal)
   or when a trial gains less than ``--min-gain`` over the best so far;
2. measures how long a tiny real SimEnv job (same leaves and data, 1 trained version, 2 local iterations)
   takes from ``jobs.driver.run`` to the first device report of its slowest leaf, and recommends
   ``--job-timeout = max(60, 3 x that)``, rounded up;
3. prints a table and the recommended flags, and can write everything as JSON.

Pure logic (``worker_steps``, ``candidate_points``, ``explore``, ``recommend``, ``recommend_job_timeout``,
``format_table``) is separate from measurement (``PeakSampler``, ``make_device_trainer``, ``measure_trial``,
``probe_job_start``) so it is testable with fake trials.

Trials emulate one leaf: the job runs ``--num-leaf-nodes`` leaves on this host (sim / poc), so a trial is pinned
to one leaf's share of the cores (``--trial-cores``, default ``cores // leaves`` like the planner) and sets torch's
intra-op threads to ``max(1, cores // W)`` (``WorkerPlan.torch_threads``'s rule: oversubscribed OpenMP pools
made training 30x slower). Devices per second are therefore per leaf.

Search space: points are ``TrialPoint(workers, group_size)``; ``group_size`` is the number of devices one worker
trains together (1: the per-device engine; more: the vectorised engine, ``TrainingTaskProcessor.train_group``).
When the planner picks the vectorised engine, the tuner tries group size 1 and the planned group size, each a
branch of its own over worker counts, and recommends ``--engine`` and ``--group-size`` with the workers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

import torch

from common.result_files import LEAF_LOGS
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


# -- measurement ---------------------------------------------------------------------------------------------------
def process_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class PeakSampler:
    """Samples ``read()`` (default: this process's RSS in bytes) every ``interval`` s on a thread; ``peak`` is the
    highest value seen, including one read at start and one at stop."""

    def __init__(self, read: Callable[[], float] | None = None, interval: float = 0.005) -> None:
        self.read = read or process_rss
        self.interval = interval
        self.peak: float = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _take(self) -> None:
        try:
            self.peak = max(self.peak, float(self.read()))
            self.samples += 1
        except Exception:  # a failing source leaves the peak as it was
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._take()

    def __enter__(self) -> PeakSampler:
        self._take()
        self._thread = threading.Thread(target=self._run, name="tune-peak-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._take()


def make_device_trainer(cfg, plan, device: torch.device) -> Callable[[Sequence[str]], None]:
    """``train(device_ids)``: local training of a group of simulated devices by the job's own task processor
    (``jobs.components.make_task_processor``; one device: the per-device engine, more: the vectorised engine; each
    with its partition, seeded batch order, per-thread model and utilisation profile), from the job's initial
    global model. Loads the data and warms torch up (first-call initialisation) before returning."""
    from jobs.components import make_task_processor
    from processors.models import initial_model

    training = dataclasses.replace(cfg.training, compute_device=str(device))
    processor = make_task_processor(dataclasses.replace(cfg, training=training), plan, torch_threads=0)
    initial = initial_model(cfg.training.model, cfg.run.seed)
    weights = {k: v.numpy() for k, v in initial.state_dict().items()}

    def train(device_ids: Sequence[str]) -> None:
        if len(device_ids) == 1:
            processor.train(device_ids[0], weights, version=1)
        else:
            processor.train_group(list(device_ids), weights, version=1)

    train(["tune#warmup"])  # lazy initialisation (oneDNN / cuDNN / allocator) is no part of any trial
    return train


def measure_trial(
    point: TrialPoint,
    train_one: Callable[[str], object],
    device_ids: Sequence[str],
    cores: int,
    device: torch.device | None = None,
    read_memory: Callable[[], float] | None = None,
) -> TrialResult:
    """Train ``device_ids`` on a pool of ``point.workers`` threads, ``point.group_size`` devices per call of
    ``train_one``, and time it.

    Each worker first trains one untimed warm-up device (all W threads are started and hold their model before
    the clock starts); the timed part is the real devices. torch intra-op threads: ``max(1, cores // W)``.
    Exceptions (out of memory included) propagate; ``explore`` records them.
    """
    workers, g = point.workers, point.group_size
    groups = [tuple(device_ids[i : i + g]) for i in range(0, len(device_ids), g)]
    threads = max(1, cores // workers)
    torch.set_num_threads(threads)
    cuda = device is not None and device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    ready = threading.Barrier(workers)

    def warm(i: int) -> None:
        ready.wait(timeout=300)  # one warm-up per thread: every worker exists before timing starts
        train_one([f"tune#warm{i}-{j}" for j in range(g)])

    pool = ThreadPoolExecutor(workers, thread_name_prefix="tune")
    try:
        with PeakSampler(read_memory) as sampler:
            list(pool.map(warm, range(workers)))
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            list(pool.map(train_one, groups))
            if cuda:
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
    except Exception:
        pool.shutdown(wait=True, cancel_futures=True)  # after an OOM, do not start the devices still queued
        if cuda:
            torch.cuda.empty_cache()
        raise
    pool.shutdown(wait=True)
    peak_cuda = int(torch.cuda.max_memory_allocated(device)) if cuda else None
    return TrialResult(
        workers=workers,
        group_size=point.group_size,
        devices=len(device_ids),
        seconds=round(seconds, 4),
        devices_per_s=len(device_ids) / seconds if seconds > 0 else 0.0,
        peak_rss_bytes=int(sampler.peak),
        peak_cuda_bytes=peak_cuda,
        torch_threads=threads,
    )


@contextlib.contextmanager
def pinned_cores(count: int) -> Iterator[int]:
    """Restrict this process to ``count`` of its cores (Linux) for the block; yields the cores in use."""
    if not hasattr(os, "sched_getaffinity"):
        yield count
        return
    original = os.sched_getaffinity(0)
    if count >= len(original):
        yield len(original)
        return
    os.sched_setaffinity(0, sorted(original)[:count])
    try:
        yield count
    finally:
        os.sched_setaffinity(0, original)


def make_trial_runner(
    cfg, plan, device: torch.device, trial_devices: int, cores: int
) -> Callable[[TrialPoint], TrialResult]:
    """The real trial function ``explore`` calls: ``trial_devices`` devices per trial, in groups of the point's
    group size."""
    train_one = make_device_trainer(cfg, plan, device)
    device_ids = [f"tune#{i}" for i in range(trial_devices)]
    return lambda point: measure_trial(point, train_one, device_ids, cores, device)


# -- job start probe -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobProbe:
    first_task_seconds: float | None  # start -> first device report of the slowest leaf
    first_report_per_site: dict
    total_seconds: float
    returncode: int | None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


_PROBE_CHILD = """
import sys, time
from jobs.cli import build_parser, config_from_args
from jobs.driver import run
args = build_parser("probe").parse_args(sys.argv[2:])
cfg = config_from_args(args, "fedavg")
open(sys.argv[1], "w").write(repr(time.time()))
sys.exit(run(cfg))
"""


def probe_args(argv: Sequence[str], workdir: str, leaves: int, devices_per_leaf: int) -> list[str]:
    """The job's own flags followed by the probe's overrides (argparse keeps the last value of a flag)."""
    per_leaf = min(devices_per_leaf, 2)
    return [*argv] + [
        "--env",
        "sim",
        "--max-model-version",
        "2",
        "--local-iters",
        "2",
        "--devices-per-leaf",
        str(per_leaf),
        "--device-selection-size",
        str(per_leaf * leaves),
        "--num-updates-for-model",
        str(per_leaf * leaves),
        "--min-hole-to-fill",
        str(per_leaf * leaves),
        "--job-timeout",
        "600",  # measure the wait, never fail on it
        "--eval-frequency",
        "1",
        "--job-name",
        "edgesim_tune_probe",
        "--output",
        os.path.join(workdir, "out"),
        "--workspace",
        os.path.join(workdir, "ws"),
    ]


def first_reports(results_dir: str) -> dict[str, float]:
    """Wall time of each leaf's first device report, from its ``leaf_<site>.jsonl``."""
    firsts = {}
    prefix, suffix = LEAF_LOGS.split("*")
    for path in sorted(glob.glob(os.path.join(results_dir, LEAF_LOGS))):
        site = os.path.basename(path)[len(prefix) : -len(suffix)]
        with open(path) as f:
            walls = [json.loads(line)["wall"] for line in f if line.strip()]
        if walls:
            firsts[site] = min(walls)
    return firsts


def probe_job_start(argv: Sequence[str], cfg, timeout: float = 600.0) -> JobProbe:
    """Run a tiny real SimEnv job in a child process and measure start -> first device report.

    The start is taken in the child right before ``jobs.driver.run`` (after imports), the end is the slowest
    leaf's first report, so the number includes data loading, NVFlare start-up, job deployment, the first
    selection and one 2-iteration device task: an upper bound of the wait ``--job-timeout`` guards (which begins
    when a leaf's simulator starts). A child process keeps NVFlare's logging, threads and signal handlers out of
    the tuner, and a failed probe cannot take the tuner down."""
    with tempfile.TemporaryDirectory(prefix="edgesim_tune_") as workdir:
        start_file = os.path.join(workdir, "start")
        args = probe_args(argv, workdir, cfg.federation.num_leaf_nodes, cfg.federation.devices_per_leaf)
        began = time.time()
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PROBE_CHILD, start_file, *args],
                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            rc, tail = None, f"the probe job did not finish within --probe-timeout {timeout:g}s"
        total = time.time() - began
        firsts = first_reports(os.path.join(workdir, "out"))
        start = float(open(start_file).read()) if os.path.exists(start_file) else None
        if start is None or not firsts:
            return JobProbe(None, {}, round(total, 2), rc, f"no device report measured; job output: {tail}")
        per_site = {site: round(wall - start, 3) for site, wall in firsts.items()}
        detail = "" if len(firsts) == cfg.federation.num_leaf_nodes else f"only {len(firsts)} leaves reported"
        return JobProbe(round(max(per_site.values()), 3), per_site, round(total, 2), rc, detail)


# -- command line --------------------------------------------------------------------------------------------------
TUNER_FLAGS = {"trial_devices", "max_workers", "trial_cores", "min_gain", "skip_job_probe", "probe_timeout", "json"}


def build_tune_parser() -> argparse.ArgumentParser:
    from jobs.cli import build_parser

    p = build_parser(__doc__.splitlines()[0])
    t = p.add_argument_group("tuner")
    t.add_argument(
        "--trial-devices", type=int, default=None, help="devices trained per trial (default: max(32, 4 x the cap))"
    )
    t.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help="largest worker count tried (default: 2 x trial cores on CPU, 32 on GPU)",
    )
    t.add_argument(
        "--trial-cores",
        type=int,
        default=None,
        help="cores a trial may use (default: this host's cores / leaves, one leaf's share)",
    )
    t.add_argument(
        "--min-gain", type=float, default=0.05, help="stop when more workers gain less than this fraction of devices/s"
    )
    t.add_argument(
        "--skip-job-probe", action="store_true", help="do not run the tiny real job that measures --job-timeout"
    )
    t.add_argument("--probe-timeout", type=float, default=600.0, help="seconds the job probe may take")
    t.add_argument("--json", default=None, metavar="PATH", help="also write trials and recommendation as JSON")
    return p


def _job_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` without the tuner's own flags (the probe child only knows job flags)."""
    tuner_options = {s for a in parser._actions if a.dest in TUNER_FLAGS for s in a.option_strings}
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in tuner_options:
            takes_value = name != "--skip-job-probe" and "=" not in arg
            skip = takes_value and i + 1 < len(argv)
            continue
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    from common.choices import ConfigError
    from jobs.cli import config_from_args
    from jobs.plan import prepare
    from processors.data.sources import DatasetError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_tune_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args, "fedavg").validate()
        run_plan = prepare(cfg)
        plan, run_info, device = run_plan.workers, run_plan.run_info, run_plan.device
    except (ConfigError, DatasetError, ValueError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    host_cores = run_info["environment"]["cpu_cores"]
    leaves_on_host = cfg.federation.num_leaf_nodes if cfg.run.env in ("sim", "poc") else 1
    cores = args.trial_cores or max(1, host_cores // leaves_on_host)
    cap = args.max_workers or (32 if device.type == "cuda" else max(2, 2 * cores))
    group_sizes = (1, plan.group_size) if plan.engine == "vectorized" and plan.group_size > 1 else (1,)
    trial_devices = args.trial_devices or max(32, 4 * cap, 2 * group_sizes[-1])
    for flag, value in (("--trial-cores", cores), ("--max-workers", cap), ("--trial-devices", trial_devices)):
        if value < 1:
            parser.error(f"{flag} {value}: must be >= 1")
    cap = min(cap, trial_devices)  # more workers than devices measure nothing new
    print(
        f"[tune] {cfg.training.model}, batch {cfg.training.local_batch_size}, {cfg.training.optimizer}, "
        f"{cfg.training.local_iters} local iters on {device}; "
        f"{trial_devices} devices per trial on {cores} of {host_cores} cores (one leaf's share of {leaves_on_host})"
    )
    print(f"[tune] the planner would pick: {plan.describe()}")

    threads_before = torch.get_num_threads()
    with pinned_cores(cores) as cores:
        runner = make_trial_runner(cfg, plan, device, trial_devices, cores)
        trials = explore(
            runner,
            candidate_points(cap, group_sizes),
            args.min_gain,
            log=lambda t: print(
                f"[tune] W={t.workers}, group {t.group_size}: {t.devices_per_s:.2f} devices/s, {t.status} "
                f"{t.detail}".rstrip()
            ),
        )
    torch.set_num_threads(threads_before)

    probe = None
    if not args.skip_job_probe:
        if cfg.run.env != "sim":
            print("[tune] job probe runs on SimEnv only; measuring it there")
        print("[tune] job probe: running a tiny real SimEnv job ...")
        probe = probe_job_start(_job_argv(argv, parser), cfg, args.probe_timeout)
        if probe.first_task_seconds is None:
            print(f"[tune] job probe failed (rc {probe.returncode}): {probe.detail}")
        else:
            print(
                f"[tune] job probe: first device report after {probe.first_task_seconds:.1f} s (slowest leaf; "
                f"per leaf {probe.first_report_per_site}); whole probe {probe.total_seconds:.1f} s"
            )
    rec = recommend(trials, tolerance=args.min_gain, first_task_seconds=probe.first_task_seconds if probe else None)

    print()
    print(format_table(trials))
    print()
    print(f"[tune] recommendation: {rec.reason}")
    if rec.job_timeout is None:
        print(f"[tune] --job-timeout not measured; the job's default is {cfg.engine.job_timeout:g}")
    else:
        print(f"[tune] --job-timeout {rec.job_timeout:g} = max(60, 3 x {rec.first_task_seconds:.1f} s), rounded up")
    print(f"recommended flags: {rec.flags() or '(none)'}")
    if args.json:
        report = {
            "config": cfg.to_dict(),
            "environment": run_info["environment"],
            "planner": run_info["planner"],
            "tuner": {
                "trial_devices": trial_devices,
                "max_workers": cap,
                "trial_cores": cores,
                "min_gain": args.min_gain,
            },
            "trials": [t.to_dict() for t in trials],
            "job_probe": probe.to_dict() if probe else None,
            "recommendation": rec.to_dict(),
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"[tune] wrote {args.json}")
    return 0 if rec.num_workers is not None else 1


if __name__ == "__main__":
    sys.exit(main())

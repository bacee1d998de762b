"""The tuner's measurements: one trial trains real devices through the job's own task processor on a pool of
workers, pinned to one leaf's share of the cores, sampling peak memory."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from jobs.tune.search import TrialPoint, TrialResult


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
    (``jobs.run.components.make_task_processor``; one device: the per-device engine, more: the vectorised engine; each
    with its partition, seeded batch order, per-thread model and utilisation profile), from the job's initial
    global model. Loads the data and warms torch up (first-call initialisation) before returning."""
    from jobs.run.components import make_task_processor
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

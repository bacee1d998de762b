"""Background system monitor for a run: samples CPU, RAM and (when NVML works) per-GPU use, and explains low GPU use.

``SystemMonitor`` runs a daemon thread that takes one sample every ``interval`` seconds. A sample is::

    {"t": 1.0, "cpu_percent": 45.0, "ram_used_gb": 6.2, "ram_total_gb": 24.0,
     "gpus": [{"index": 0, "name": "NVIDIA H100", "util_percent": 87.0, "mem_used_gb": 3.1, "mem_total_gb": 80.0}]}

``gpus`` is ``None`` (``null`` in JSON), never zeros, when NVML is missing, finds no GPU or fails to start; a single
GPU field NVML cannot read (e.g. utilisation of a MIG device) is ``None`` too. GPU indices are NVML's (physical)
indices, which ignore ``CUDA_VISIBLE_DEVICES``.

What the samples say (summaries, a version's figures, the status string, TensorBoard scalars, the diagnosis of an
under-used GPU) is ``evaluation.utilisation``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from common.nvml import Nvml
from evaluation.utilisation import (
    DEFAULT_LOW_UTIL_THRESHOLD,
    DEFAULT_LOW_UTIL_WINDOW,
    GB,
    clean_gpu,
    diagnose,
    round_or_none,
)

logger = logging.getLogger(__name__)


class HostSource(Protocol):
    def read(self) -> dict[str, float]:
        """Return ``{"cpu_percent", "ram_used_gb", "ram_total_gb"}``."""
        ...


class GpuSource(Protocol):
    def read(self) -> list[dict[str, Any]] | None:
        """Return one dict per GPU (keys as in a sample's ``gpus``), or ``None`` when no GPU data is available."""
        ...


class PsutilSource:
    """Host CPU percent (all cores, since the previous read) and RAM (used = total - available) via psutil."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point; it always returns 0.0

    def read(self) -> dict[str, float]:
        vm = self._psutil.virtual_memory()
        return {
            "cpu_percent": float(self._psutil.cpu_percent(interval=None)),
            "ram_used_gb": (vm.total - vm.available) / GB,
            "ram_total_gb": vm.total / GB,
        }


class NvmlSource:
    """Per-GPU utilisation and memory, read through the project's NVML probe (``common.nvml``); ``read()`` returns
    ``None`` when NVML is unusable or finds no GPU."""

    def __init__(self) -> None:
        self._nvml = Nvml()

    @property
    def available(self) -> bool:
        return self._nvml.available

    def read(self) -> list[dict[str, Any]] | None:
        if not self._nvml.available:
            return None
        gpus = []
        for i, name in enumerate(self._nvml.names):
            mem = self._nvml.memory(i)
            gpus.append(
                {
                    "index": i,
                    "name": name,
                    "util_percent": self._nvml.utilisation(i),
                    "mem_used_gb": mem.used / GB if mem is not None else None,
                    "mem_total_gb": mem.total / GB if mem is not None else None,
                }
            )
        return gpus

    def close(self) -> None:
        self._nvml.close()


class SystemMonitor:
    """Samples host and GPU use every ``interval`` seconds on a daemon thread.

    ``gpu_source=None`` uses ``NvmlSource()`` and ``host_source=None`` uses ``PsutilSource()``; tests inject fakes
    (any object with a ``read()`` as in ``HostSource`` / ``GpuSource``). Use ``start()``/``stop()`` or ``with``.
    """

    def __init__(
        self,
        interval: float = 1.0,
        gpu_source: GpuSource | None = None,
        host_source: HostSource | None = None,
        low_util_threshold: float = DEFAULT_LOW_UTIL_THRESHOLD,
        low_util_window: int = DEFAULT_LOW_UTIL_WINDOW,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval {interval}: must be > 0")
        self.interval = interval
        self.low_util_threshold = low_util_threshold
        self.low_util_window = max(1, low_util_window)
        self._own_gpu_source = gpu_source is None
        self.gpu_source: GpuSource = gpu_source if gpu_source is not None else NvmlSource()
        self.host_source: HostSource = host_source if host_source is not None else PsutilSource()
        self._samples: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()
        self.start_walltime = time.time()  # epoch seconds at ``t == 0`` (TensorBoard walltime)

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def start(self) -> SystemMonitor:
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._t0 = time.monotonic()
        self.start_walltime = time.time()
        self._thread = threading.Thread(target=self._run, name="system-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 5 * self.interval))
            self._thread = None
        if self._own_gpu_source:
            close = getattr(self.gpu_source, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> SystemMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def elapsed(self) -> float:
        """Seconds since ``start()`` on the clock of the samples' ``t`` (to mark where a stretch of samples ends)."""
        return time.monotonic() - self._t0

    def samples_between(self, t0: float, t1: float | None = None) -> list[dict[str, Any]]:
        """Samples with ``t0 < t <= t1`` (``t1=None``: up to now)."""
        with self._lock:
            return [s for s in self._samples if s["t"] > t0 and (t1 is None or s["t"] <= t1)]

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    # -- sampling ----------------------------------------------------------------------------------------------------
    def sample_once(self) -> dict[str, Any]:
        """Take one sample now, store it and return it (the thread calls this; tests may too)."""
        t = time.monotonic() - self._t0
        try:
            host = self.host_source.read()
        except Exception as e:  # a monitor must never take the run down
            logger.debug("host read failed: %s", e)
            host = {}
        try:
            gpus = self.gpu_source.read()
        except Exception as e:
            logger.debug("GPU read failed: %s", e)
            gpus = None
        sample = {
            "t": round(t, 3),
            "cpu_percent": round_or_none(host.get("cpu_percent"), 1),
            "ram_used_gb": round_or_none(host.get("ram_used_gb"), 3),
            "ram_total_gb": round_or_none(host.get("ram_total_gb"), 3),
            "gpus": [clean_gpu(g) for g in gpus] if gpus else None,
        }
        with self._lock:
            self._samples.append(sample)
        return sample

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._samples)

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    # -- conveniences ------------------------------------------------------------------------------------------------
    def diagnose(self, context: dict[str, Any]) -> list[str]:
        return diagnose(self.samples(), context, threshold=self.low_util_threshold, window=self.low_util_window)

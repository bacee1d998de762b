"""The run's system monitor as an NVFlare component: samples the machine from START_RUN to END_RUN.

In SimEnv the server and every leaf run on this host, so one monitor sampling host-wide CPU/RAM and every GPU
covers the whole simulation. ``take_stretch`` hands the recorder the samples since the previous version; at
END_RUN the thread is joined and SYSTEM_SUMMARY_READY carries the summary and any low-GPU-use warnings
(``evaluation.utilisation.diagnose``), judged over the training stretch (from the first recorded version to the last).
"""

from __future__ import annotations

import math
import threading

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext

from evaluation.events import SYSTEM_SUMMARY, SYSTEM_SUMMARY_READY
from evaluation.monitor import SystemMonitor
from evaluation.utilisation import diagnose, summarize

LOW_UTIL_SECONDS = 10.0  # the GPU must stay under-used this long (in consecutive samples) before we warn


class SystemMonitorComponent(FLComponent):
    """Args:
    diagnose_context: what ``diagnose`` needs about the run (``compute_device``, ``engine``, ``num_workers``,
        ``cpu_cores``), from the driver's plan.
    interval: seconds between samples.
    """

    def __init__(self, diagnose_context: dict | None = None, interval: float = 0.5):
        super().__init__()
        self.diagnose_context = diagnose_context or {}
        self.interval = interval
        self._monitor: SystemMonitor | None = None
        self._lock = threading.Lock()
        self._mark = 0.0  # monitor time of the latest stretch: the next one starts here
        self._first_mark: float | None = None  # the first stretch's end: training starts after it
        self.register_event_handler(EventType.START_RUN, self._start)
        self.register_event_handler(EventType.END_RUN, self._finish)

    def make_monitor(self) -> SystemMonitor:
        """A started monitor (tests override this to inject fake sources)."""
        window = max(1, math.ceil(LOW_UTIL_SECONDS / self.interval))
        return SystemMonitor(interval=self.interval, low_util_window=window).start()

    def _start(self, _event: str, fl_ctx: FLContext) -> None:
        try:
            self._monitor = self.make_monitor()
        except Exception:  # psutil missing or broken: the run goes on without system figures
            self.log_warning(fl_ctx, "the system monitor could not start: no CPU/GPU figures will be recorded")

    @property
    def start_walltime(self) -> float | None:
        """Epoch seconds of the samples' ``t == 0`` (None before START_RUN)."""
        mon = self._monitor
        return mon.start_walltime if mon is not None else None

    def take_stretch(self) -> list[dict]:
        """Samples since the previous call (at least the latest one, for a version faster than one sample)."""
        with self._lock:
            mon = self._monitor
            if mon is None:
                return []
            now = mon.elapsed()
            samples = mon.samples_between(self._mark, now)
            self._mark = now
            if self._first_mark is None:
                self._first_mark = now
        if not samples:
            latest = mon.latest()
            samples = [latest] if latest else []
        return samples

    def _finish(self, _event: str, fl_ctx: FLContext) -> None:
        with self._lock:
            mon, self._monitor = self._monitor, None
        if mon is None:
            return
        mon.stop()
        samples = mon.samples()
        first = self._first_mark if self._first_mark is not None else 0.0
        last = self._mark if self._mark > first else None
        training = [s for s in samples if s["t"] > first and (last is None or s["t"] <= last)]
        warnings = diagnose(
            training, self.diagnose_context, threshold=mon.low_util_threshold, window=mon.low_util_window
        )
        summary = summarize(samples) | {"interval_s": mon.interval, "warnings": warnings}
        for warning in warnings:
            self.log_warning(fl_ctx, warning)
        self.fire_event_with_data(SYSTEM_SUMMARY_READY, fl_ctx, SYSTEM_SUMMARY, summary)

"""Evaluates every new global model on the test split of the project's own dataset source and records it.

Unlike NVFlare's ``GlobalEvaluator`` it neither embeds data in the job config nor downloads: it loads the same
``DatasetSpec`` the devices use. After each evaluated version it rewrites ``metrics.json`` (so nothing is lost
if the run dies), saves ``global_model.pt``, logs to TensorBoard, prints one progress line and advances a tqdm bar
(shown only when stderr is a terminal).

It also runs a ``SystemMonitor`` from START_RUN to END_RUN. In SimEnv the server and every leaf run on this host, so
one monitor sampling host-wide CPU/RAM and every GPU covers the whole simulation. Each version's record gets the
system figures of its interval (``system``: GPU utilisation and VRAM, CPU and RAM; GPU fields ``null`` without a
GPU) and its throughput (``seconds_per_version``, ``devices_per_second``); at the end ``metrics.json`` gets a
``system`` summary with ``warnings`` when the GPU stayed under-used during training (``simulation.monitor.diagnose``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from typing import Any

import numpy as np
import torch
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

from processors.data.sources import DatasetSpec, load_dataset
from processors.device import resolve_device
from processors.models import build_model
from processors.training import evaluate_accuracy
from simulation.monitor import (
    SystemMonitor,
    aggregate,
    diagnose,
    format_status,
    format_summary,
    summarize,
    system_fields,
    write_tensorboard,
)

LOW_UTIL_SECONDS = 10.0  # the GPU must stay under-used this long (in consecutive samples) before we warn


def write_json_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)


def version_record(
    version: int,
    accuracy: float,
    wall_seconds: float,
    eval_seconds: float,
    epoch: float,
    previous: dict | None,
    updates_per_version: int,
    stretch: dict | None,
) -> dict:
    """The ``metrics.json`` record of one evaluated version.

    ``previous`` is the record of the version evaluated before (``None`` for the first): ``seconds_per_version`` and
    ``devices_per_second`` (``updates_per_version`` per version over those seconds) cover the versions since then
    and are ``None`` for the first. ``stretch`` is ``simulation.monitor.aggregate`` of the samples since the previous
    evaluation; its figures go under ``system`` (see ``system_fields``; GPU fields ``None`` without GPU data).
    """
    seconds = devices = None
    if previous is not None and version > previous["version"]:
        steps = version - previous["version"]
        span = wall_seconds - previous["wall_seconds"]
        seconds = round(span / steps, 3)
        if updates_per_version and span > 0:
            devices = round(updates_per_version * steps / span, 3)
    return {
        "version": version,
        "accuracy": round(accuracy, 5),
        "wall_seconds": round(wall_seconds, 3),
        "eval_seconds": round(eval_seconds, 3),
        "epoch": round(epoch, 3),  # lets the driver line this record up with the leaves' clocks
        "seconds_per_version": seconds,
        "devices_per_second": devices,
        "system": system_fields(stretch),
    }


def diagnose_context(run_info: dict, compute_device: str) -> dict:
    """What ``diagnose`` needs to know about the run, read from the driver's ``run_info`` where present."""
    config = run_info.get("config") or {}
    environment = run_info.get("environment") or {}
    planner = run_info.get("planner") or {}
    engine = planner.get("engine") or config.get("engine")
    return {
        "compute_device": environment.get("compute_device") or compute_device,
        "engine": None if engine in (None, "auto") else engine,  # "auto": we cannot tell which one ran
        "num_workers": planner.get("num_workers", config.get("num_workers")),
        "cpu_cores": environment.get("cpu_cores"),
    }


def make_progress_bar(total: int) -> Any:
    """A tqdm bar over model versions on stderr; disabled (a no-op) when stderr is not a terminal, e.g. CI logs."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(
        total=total if total > 0 else None,
        desc="[edgesim] versions",
        unit="version",
        file=sys.stderr,
        disable=None,  # None: off on a non-TTY
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",  # no cumulative rate
        dynamic_ncols=True,
        leave=True,
    )


def emit(line: str) -> None:
    """Print a line to stdout without tearing a progress bar that may be drawn on the terminal."""
    try:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stdout)
    except ImportError:
        print(line)
    sys.stdout.flush()


class GlobalModelEvaluator(FLComponent):
    def __init__(
        self,
        model: str,
        dataset: dict,
        eval_frequency: int = 1,
        compute_device: str = "auto",
        results_dir: str = "",
        max_model_version: int = 0,
        updates_per_version: int = 0,
        run_info: dict | None = None,
        monitor: bool = True,
        monitor_interval: float = 0.5,
    ):
        super().__init__()
        self.model = model
        self.dataset = dataset
        self.eval_frequency = eval_frequency
        self.compute_device = compute_device
        self.results_dir = results_dir
        self.max_model_version = max_model_version
        self.updates_per_version = updates_per_version
        self.run_info = run_info or {}
        self.monitor = monitor
        self.monitor_interval = monitor_interval
        self._sysmon: SystemMonitor | None = None
        self._mark = 0.0  # monitor time of the latest evaluation: the next version's interval starts here
        self._first_mark: float | None = None  # monitor time of the first evaluation: training starts after it
        self._system: dict | None = None
        self._bar = None
        self._lock = threading.Lock()
        self._records: list[dict] = []
        self._start = None
        self._net = None
        self._data = None
        self._tb = None
        self._out = None
        self.register_event_handler(EventType.START_RUN, self._start_run)
        self.register_event_handler(AppEventType.GLOBAL_WEIGHTS_UPDATED, self._evaluate)
        self.register_event_handler(EventType.END_RUN, self._end_run)

    def _start_run(self, _event: str, fl_ctx: FLContext) -> None:
        self._start = time.time()
        self._out = self.results_dir or fl_ctx.get_prop(FLContextKey.APP_ROOT)
        os.makedirs(self._out, exist_ok=True)
        if self.monitor:
            self._sysmon = self._make_monitor()
            if self._sysmon is None:
                self.log_warning(fl_ctx, "the system monitor could not start: no CPU/GPU figures will be recorded")
        device = resolve_device(self.compute_device)
        self._net = build_model(self.model).to(device)
        data = load_dataset(DatasetSpec(**self.dataset))
        self._data = (data.x_test.to(device), data.y_test.to(device))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=os.path.join(self._out, "tensorboard"))
        except ImportError:  # tensorboard is a declared dependency; keep evaluating if someone removed it
            self.log_warning(fl_ctx, "tensorboard is not installed: no TensorBoard events will be written")
        self._bar = make_progress_bar(self.max_model_version - 1)

    def _make_monitor(self) -> SystemMonitor | None:
        """A started monitor (tests override this to inject fake sources); ``None`` if it cannot start."""
        try:
            window = max(1, math.ceil(LOW_UTIL_SECONDS / self.monitor_interval))
            return SystemMonitor(interval=self.monitor_interval, low_util_window=window).start()
        except Exception:  # psutil missing or broken: the run goes on without system figures
            return None

    def _evaluate(self, _event: str, fl_ctx: FLContext) -> None:
        version = int(fl_ctx.get_prop(AppConstants.CURRENT_ROUND) or 0)
        is_last = self.max_model_version and version >= self.max_model_version
        if (version - 1) % self.eval_frequency and not is_last:
            return
        learnable = fl_ctx.get_prop(AppConstants.GLOBAL_MODEL)
        weights = learnable["weights"] if "weights" in learnable else learnable
        with self._lock:
            started = time.time()
            state = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in weights.items()}
            device = next(self._net.parameters()).device
            own = self._net.state_dict()
            self._net.load_state_dict({k: state[k].to(device).view_as(own[k]) if k in state else own[k] for k in own})
            accuracy = evaluate_accuracy(self._net, *self._data)
            now = time.time()
            stretch_samples = self._take_stretch()
            stretch = aggregate(stretch_samples)
            if stretch is None and self._sysmon is not None:  # a version faster than one sample: the latest one
                stretch = aggregate([s for s in [self._sysmon.latest()] if s])
            record = version_record(
                version,
                accuracy,
                wall_seconds=now - self._start,
                eval_seconds=now - started,
                epoch=now,
                previous=self._records[-1] if self._records else None,
                updates_per_version=self.updates_per_version,
                stretch=stretch,
            )
            self._records.append(record)
            torch.save(
                {k: v.cpu() for k, v in self._net.state_dict().items()}, os.path.join(self._out, "global_model.pt")
            )
            self._write()
            if self._tb:
                self._tb.add_scalar("accuracy", accuracy, version)
                self._tb.add_scalar("accuracy_vs_wall_seconds", accuracy, int(record["wall_seconds"]))
                self._write_tensorboard(record, stretch_samples)
                self._tb.flush()
            status = format_status(stretch)
            emit(self._progress_line(record, status))
            self._advance_bar(record, status)

    def _take_stretch(self) -> list[dict]:
        """Samples since the previous evaluation; moves the mark to now."""
        if self._sysmon is None:
            return []
        now = self._sysmon.elapsed()
        samples = self._sysmon.samples_between(self._mark, now)
        self._mark = now
        if self._first_mark is None:
            self._first_mark = now
        return samples

    def _write_tensorboard(self, record: dict, samples: list[dict]) -> None:
        """Per-version ``system/*`` scalars next to accuracy (step = version) and the raw ``system_samples/*``."""
        version = record["version"]
        values = dict(record["system"])
        values.pop("num_samples", None)
        values["seconds_per_version"] = record["seconds_per_version"]
        values["devices_per_second"] = record["devices_per_second"]
        for tag, value in values.items():
            if value is not None:
                self._tb.add_scalar(f"system/{tag}", float(value), version)
        if samples and self._sysmon is not None:
            write_tensorboard(samples, self._tb, prefix="system_samples/", start_walltime=self._sysmon.start_walltime)

    def _progress_line(self, record: dict, status: str = "") -> str:
        version, wall = record["version"], record["wall_seconds"]
        line = f"[edgesim] version {version}"
        if self.max_model_version:
            line += f"/{self.max_model_version}"
        line += f" | accuracy {record['accuracy']:.4f} | {wall:.1f} s since start"
        if record.get("seconds_per_version") is not None:
            line += f" | {record['seconds_per_version']:.2f} s/version"
        if record.get("devices_per_second") is not None:
            line += f" | {record['devices_per_second']:.1f} devices/s"
        if status:
            line += f" | {status}"
        return line

    def _advance_bar(self, record: dict, status: str) -> None:
        if self._bar is None:
            return
        parts = [f"v{record['version']}", f"acc {record['accuracy']:.4f}"]
        if record.get("seconds_per_version") is not None:
            parts.append(f"{record['seconds_per_version']:.2f} s/version")
        if record.get("devices_per_second") is not None:
            parts.append(f"{record['devices_per_second']:.1f} devices/s")
        if status:
            parts.append(status)
        self._bar.set_postfix_str(" | ".join(parts), refresh=False)
        self._bar.update(max(0, record["version"] - 1 - self._bar.n))
        self._bar.refresh()

    def _write(self) -> None:
        payload = dict(self.run_info)
        payload["versions"] = self._records
        if self._system is not None:
            payload["system"] = self._system
        write_json_atomic(os.path.join(self._out, "metrics.json"), payload)

    def _finish_monitor(self) -> list[str]:
        """Stop the monitor (joins its thread), build the ``system`` summary and warnings; returns the warnings."""
        mon, self._sysmon = self._sysmon, None
        if mon is None:
            return []
        mon.stop()
        samples = mon.samples()
        if self._tb:
            rest = [s for s in samples if s["t"] > self._mark]
            write_tensorboard(rest, self._tb, prefix="system_samples/", start_walltime=mon.start_walltime)
        # training runs between the first evaluation (the initial model) and the last one
        last = self._mark if self._first_mark is not None and self._mark > self._first_mark else None
        first = self._first_mark if self._first_mark is not None else 0.0
        training = [s for s in samples if s["t"] > first and (last is None or s["t"] <= last)]
        context = diagnose_context(self.run_info, self.compute_device)
        warnings = diagnose(training, context, threshold=mon.low_util_threshold, window=mon.low_util_window)
        self._system = summarize(samples) | {"interval_s": mon.interval, "warnings": warnings}
        return warnings

    def _end_run(self, _event: str, fl_ctx: FLContext) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            warnings = self._finish_monitor()
            if self._system is not None:
                emit(f"[edgesim] system: {format_summary(self._system) or 'no samples'}")
            for warning in warnings:
                emit(f"[edgesim] WARNING: {warning}")
                self.log_warning(fl_ctx, warning)
            if self._out:
                self._write()
            if self._tb:
                self._tb.close()
                self._tb = None

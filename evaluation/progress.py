"""What a person watching a run sees: one line per recorded version and a tqdm bar (on a terminal only).

A line looks like ``[edgesim] version 3/10 | accuracy 0.4120 | 19.5 s since start | 5.1 s/version |
19.6 devices/s | CPU 100% | RAM 7.1/23.5 GB`` (GPU % and VRAM added when there is a GPU). At the end of the run
the system summary and any low-GPU-use warning follow.
"""

from __future__ import annotations

import sys
from typing import Any

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from tqdm import tqdm

from evaluation.events import SYSTEM_SAMPLES, SYSTEM_SUMMARY, SYSTEM_SUMMARY_READY, VERSION_RECORD, VERSION_RECORDED
from evaluation.monitor import format_status


def emit(line: str) -> None:
    """Print a line to stdout without tearing a progress bar that may be drawn on the terminal."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def progress_line(record: dict, stretch: dict | None = None, max_model_version: int = 0) -> str:
    """The line of one recorded version; ``stretch`` (``evaluation.monitor.aggregate``) adds its system figures."""
    line = f"[edgesim] version {record['version']}"
    if max_model_version:
        line += f"/{max_model_version}"
    line += f" | accuracy {record['accuracy']:.4f} | {record['wall_seconds']:.1f} s since start"
    if record.get("sim_seconds") is not None:
        line += f" | simulated {record['sim_seconds']:.1f} s"
    if record.get("seconds_per_version") is not None:
        line += f" | {record['seconds_per_version']:.2f} s/version"
    if record.get("devices_per_second") is not None:
        line += f" | {record['devices_per_second']:.1f} devices/s"
    status = format_status(stretch)
    return f"{line} | {status}" if status else line


def make_progress_bar(total: int) -> Any:
    """A tqdm bar over model versions on stderr; disabled (a no-op) when stderr is not a terminal, e.g. CI logs."""
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


class ProgressReporter(FLComponent):
    """Args:
    max_model_version: the last version (the bar's length; shown as ``version v/max``).
    """

    def __init__(self, max_model_version: int = 0):
        super().__init__()
        self.max_model_version = max_model_version
        self._bar = None
        self.register_event_handler(EventType.START_RUN, self._start)
        self.register_event_handler(VERSION_RECORDED, self._report_version)
        self.register_event_handler(SYSTEM_SUMMARY_READY, self._report_system)
        self.register_event_handler(EventType.END_RUN, self._close)

    def _start(self, _event: str, fl_ctx: FLContext) -> None:
        self._bar = make_progress_bar(self.max_model_version - 1)

    def _report_version(self, _event: str, fl_ctx: FLContext) -> None:
        record = fl_ctx.get_prop(VERSION_RECORD)
        stretch = getattr(fl_ctx.get_prop(SYSTEM_SAMPLES), "aggregate", None)
        line = progress_line(record, stretch, self.max_model_version)
        emit(line)
        self.logger.info(line)  # also in the server's log.txt: how a deployment's driver follows progress
        if self._bar is not None:
            self._bar.set_postfix_str(progress_line(record, stretch).removeprefix("[edgesim] "), refresh=False)
            self._bar.update(max(0, record["version"] - 1 - self._bar.n))
            self._bar.refresh()

    def _report_system(self, _event: str, fl_ctx: FLContext) -> None:
        """Low-GPU-use warnings as soon as they are known (the driver prints the system summary at the end)."""
        self._close(_event, fl_ctx)
        for warning in fl_ctx.get_prop(SYSTEM_SUMMARY).get("warnings") or ():
            emit(f"[edgesim] WARNING: {warning}")

    def _close(self, _event: str, fl_ctx: FLContext) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

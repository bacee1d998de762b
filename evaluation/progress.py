"""What a person watching a run sees: one line per recorded version and a tqdm bar (on a terminal only).

A line looks like ``[edgesim] version 3/10 | accuracy 0.4120 | 19.5 s since start | 5.1 s/version |
19.6 devices/s | CPU 100% | RAM 7.1/23.5 GB`` (GPU % and VRAM added when there is a GPU; ``mean group 1.2 devices
(low)`` when the leaves' vectorised engine trains its devices in far smaller groups than planned; with differential
privacy ``epsilon 1.234 at delta 1e-05 | 40% clipped``, and the clip norm when it adapts). At the end of the run
the system summary and any low-GPU-use warning follow. At the start, each leaf's bulk link is said once (its diffs
and versions through shared memory, or on NVFlare's wire and why: ``common.bulk_parent``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext
from tqdm import tqdm

from common.protocol import LEAF_INFO, RUN_JOINED, RUN_OUTCOME
from common.run_scope import PACK_RUN, scoped
from evaluation.events import SYSTEM_SAMPLES, SYSTEM_SUMMARY, SYSTEM_SUMMARY_READY, VERSION_RECORD, VERSION_RECORDED
from evaluation.utilisation import format_status


def emit(line: str) -> None:
    """Print a line to stdout without tearing a progress bar that may be drawn on the terminal."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def console_shows_info(logger: logging.Logger) -> bool:
    """Whether ``logger``'s INFO lines reach a console (a stream handler on stdout or stderr that lets INFO
    through), as under ``nvflare simulator``; our own SimEnv runs keep NVFlare's console at WARNING."""
    if not logger.isEnabledFor(logging.INFO):
        return False
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            stream = getattr(handler, "stream", None)
            if (
                type(handler) is logging.StreamHandler
                and stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
                and handler.level <= logging.INFO
            ):
                return True
        current = current.parent if current.propagate else None
    return False


def version_ranges(versions: list[int]) -> str:
    """``[3, 4, 5, 7, 9]`` -> ``"3-5, 7, 9"``."""
    runs: list[list[int]] = []
    for v in sorted(versions):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def progress_line(record: dict, stretch: dict | None = None, max_model_version: int = 0) -> str:
    """The line of one recorded version; ``stretch`` (``evaluation.utilisation.aggregate``) adds its system figures."""
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
    if record.get("groups_low"):  # devices train nearly alone: the vectorised engine does not pay
        line += f" | mean group {record['mean_group_size']:g} devices (low)"
    if record.get("privacy"):
        line += privacy_words(record["privacy"])
    if record.get("method"):
        line += f" | {record['method']}"
    if record.get("skipped"):
        which = version_ranges(record.get("skipped_versions", []))
        line += (
            f" | {record['skipped']} older version(s) not evaluated{f' ({which})' if which else ''}: evaluation "
            "behind, --eval-backlog skip (wait evaluates every one)"
        )
    status = format_status(stretch)
    return f"{line} | {status}" if status else line


def privacy_words(privacy: dict) -> str:
    """The privacy spent so far, and with adaptive clipping the clip norm and the noised share of the version's
    updates that were clipped (the exact share is never shown: it is not noised)."""
    eps = privacy.get("epsilon")
    words = f" | epsilon {eps:.3f} at delta {privacy['delta']:g}" if eps is not None else " | epsilon inf"
    unclipped = privacy.get("noised_unclipped_fraction")
    if unclipped is not None:  # adaptive clipping: the norm moves
        words += f" | ~{100 * (1 - unclipped):.0f}% clipped (noised) | clip norm {privacy['clip_norm']:.4g}"
    return words


BAR_COLUMNS, BAR_ROWS = 100, 24  # a terminal that reports no size (a pseudo-terminal of 0 x 0, ``script``)


def terminal_columns(stream) -> int:
    """The width of the terminal ``stream`` writes to; 0 when it reports none."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


def make_progress_bar(total: int) -> Any:
    """A tqdm bar over model versions on stderr; disabled (a no-op) when stderr is not a terminal, e.g. CI logs. On
    a terminal that reports no width (a pseudo-terminal left at 0 x 0) it is ``BAR_COLUMNS`` wide, not empty."""
    sized = terminal_columns(sys.stderr) > 0
    return tqdm(
        total=total if total > 0 else None,
        desc="[edgesim] versions",
        unit="version",
        file=sys.stderr,
        disable=None,  # None: off on a non-TTY
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",  # no cumulative rate
        dynamic_ncols=sized,
        ncols=None if sized else BAR_COLUMNS,
        nrows=None if sized else BAR_ROWS,
        leave=True,
    )


def bar_postfix(record: dict, stretch: dict | None) -> str:
    """The bar's short status: accuracy, speed and the machine's load."""
    parts = [f"acc {record['accuracy']:.3f}"]
    if (record.get("privacy") or {}).get("epsilon") is not None:
        parts.append(f"eps {record['privacy']['epsilon']:.2f}")
    if record.get("devices_per_second") is not None:
        parts.append(f"{record['devices_per_second']:.1f} dev/s")
    status = format_status(stretch)
    return " | ".join([*parts, status] if status else parts)


class ProgressReporter(FLComponent):
    """Args:
    max_model_version: the last version (the bar's length; shown as ``version v/max``).
    run: in a pack, the run whose versions it shows (``common.run_scope``); None: the job's one run.
    run_names: in a pack, every run's name: a line says when a run begins inside the running job (it waited for a
        place: ``--runs-at-once``) and when a run ends, so the console is not silent once the shown run has ended.
    """

    def __init__(self, max_model_version: int = 0, run: int | None = None, run_names: list[str] | None = None):
        super().__init__()
        self.run = run
        self.run_names = run_names
        self.max_model_version = max_model_version
        self._bar = None
        self.register_event_handler(EventType.START_RUN, self._start)
        self.register_event_handler(VERSION_RECORDED, scoped(run, self._report_version))
        self.register_event_handler(SYSTEM_SUMMARY_READY, self._report_system)
        self.register_event_handler(EventType.END_RUN, self._close)
        self.register_event_handler(LEAF_INFO, self._report_bulk)
        if run_names:
            self.register_event_handler(RUN_JOINED, self._report_joined)
            self.register_event_handler(RUN_OUTCOME, self._report_outcome)
        self._bulk: dict[str, str] = {}

    def _run_name(self, fl_ctx: FLContext) -> str:
        run = fl_ctx.get_prop(PACK_RUN)
        return self.run_names[run] if isinstance(run, int) and 0 <= run < len(self.run_names) else f"{run}"

    def _report_joined(self, _event: str, fl_ctx: FLContext) -> None:
        offset = (fl_ctx.get_prop(RUN_JOINED) or {}).get("offset", 0)
        self.say(
            f"[edgesim] run {self._run_name(fl_ctx)} begins: a place in the job is free (its release 1 is the "
            f"leaves' release {offset + 1})"
        )

    def _report_outcome(self, _event: str, fl_ctx: FLContext) -> None:
        o = fl_ctx.get_prop(RUN_OUTCOME) or {}
        self.say(
            f"[edgesim] run {self._run_name(fl_ctx)} {o.get('status')} at version {o.get('version')}, simulated "
            f"{float(o.get('sim_seconds') or 0):.1f} s: {o.get('reason')}"
        )

    def _report_bulk(self, _event: str, fl_ctx: FLContext) -> None:
        """Each leaf's bulk link, when it is settled or changes (``metrics.json`` records it too)."""
        for leaf, choice in sorted((fl_ctx.get_prop(LEAF_INFO).get("bulk") or {}).items()):
            if self._bulk.get(leaf) != choice:
                self._bulk[leaf] = choice
                how = "through shared memory" if choice == "shm" else f"on NVFlare's {choice.replace(': ', ' (', 1)})"
                self.say(f"[edgesim] {leaf}: diffs and versions {how}")

    def say(self, line: str) -> None:
        """A line in the server's log, and printed unless the console already shows that log (each line once)."""
        self.logger.info(line)
        if not console_shows_info(self.logger):
            emit(line)

    def _start(self, _event: str, fl_ctx: FLContext) -> None:
        self._bar = make_progress_bar(self.max_model_version - 1)

    def _report_version(self, _event: str, fl_ctx: FLContext) -> None:
        record = fl_ctx.get_prop(VERSION_RECORD)
        stretch = getattr(fl_ctx.get_prop(SYSTEM_SAMPLES), "aggregate", None)
        line = progress_line(record, stretch, self.max_model_version)
        # in the server's log (how a deployment's driver follows progress); printed as well unless the console
        # already shows that log line (nvflare simulator), so each line appears once
        self.say(line)
        if self._bar is not None:
            self._bar.set_postfix_str(bar_postfix(record, stretch), refresh=False)
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

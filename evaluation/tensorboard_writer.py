"""TensorBoard events for a run: accuracy per version, the version's system figures, and the raw system samples.

Tags: ``accuracy`` (step = version), ``accuracy_vs_wall_seconds``, ``system/*`` (the record's ``system`` fields,
``seconds_per_version``, ``devices_per_second``; step = version), with compression or a bandwidth
(``common.compression``) ``fleet/bytes_up`` and ``fleet/bytes_down`` (the bytes moved so far; step = version) and
``accuracy_vs_kb_up`` (step = kilobytes uploaded), and ``system_samples/*`` (every sample at its own wall time).

``torch.utils.tensorboard`` is imported when the run starts, not when the server loads its components: its import
(about 0.3 s) then overlaps the leaves' start instead of delaying the server's.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext

from common.output import output_dir
from common.result_files import TENSORBOARD
from common.run_scope import scoped
from evaluation.events import SYSTEM_SAMPLES, VERSION_RECORD, VERSION_RECORDED
from evaluation.utilisation import write_tensorboard

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class TensorBoardWriter(FLComponent):
    """Args:
    results_dir: the run's results folder; events go to its ``tensorboard/``.
    run: in a pack, the run whose versions it writes (``common.run_scope``); None: the job's one run.
    """

    def __init__(self, results_dir: str = "", run: int | None = None):
        super().__init__()
        self.results_dir = results_dir
        self.run = run
        self._writer: SummaryWriter | None = None
        self.register_event_handler(EventType.START_RUN, self._start)
        self.register_event_handler(VERSION_RECORDED, scoped(run, self._write_version))
        self.register_event_handler(EventType.END_RUN, self._close)

    def _start(self, _event: str, fl_ctx: FLContext) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=os.path.join(output_dir(self.results_dir, fl_ctx), TENSORBOARD))

    def _write_version(self, _event: str, fl_ctx: FLContext) -> None:
        if self._writer is None:
            return
        record = fl_ctx.get_prop(VERSION_RECORD)
        version = record["version"]
        self._writer.add_scalar("accuracy", record["accuracy"], version)
        self._writer.add_scalar("accuracy_vs_wall_seconds", record["accuracy"], int(record["wall_seconds"]))
        values = {k: v for k, v in record["system"].items() if k != "num_samples"}
        values["seconds_per_version"] = record["seconds_per_version"]
        values["devices_per_second"] = record["devices_per_second"]
        for tag, value in values.items():
            if value is not None:
                self._writer.add_scalar(f"system/{tag}", float(value), version)
        privacy = record.get("privacy") or {}  # differential privacy: epsilon spent, clipping
        for tag in ("epsilon", "clip_norm", "noised_unclipped_fraction"):
            if privacy.get(tag) is not None:
                self._writer.add_scalar(f"privacy/{tag}", float(privacy[tag]), version)
        fleet = record.get("fleet") or {}
        if "bytes_up" in fleet:  # compression or a bandwidth: the bytes moved, and the accuracy they bought
            self._writer.add_scalar("fleet/bytes_up", float(fleet["bytes_up"]), version)
            self._writer.add_scalar("fleet/bytes_down", float(fleet["bytes_down"]), version)
            self._writer.add_scalar("accuracy_vs_kb_up", record["accuracy"], round(fleet["bytes_up"] / 1000))
        stretch = fl_ctx.get_prop(SYSTEM_SAMPLES)
        if stretch is not None and stretch.samples:
            write_tensorboard(
                stretch.samples, self._writer, prefix="system_samples/", start_walltime=stretch.start_walltime
            )
        self._writer.flush()

    def _close(self, _event: str, fl_ctx: FLContext) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

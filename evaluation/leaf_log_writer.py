"""Writes each leaf's device-report lines into ``leaf_<leaf>.jsonl`` in the results folder, on the server.

Leaves send their lines up with their reports (``common.leaf_outbox``), so the file is written where the results
are, whether the leaves run on this machine (SimEnv) or on a deployment's. One line per device report, in the
order the leaf made them: ``{"wall", "device", "version", "selection", "ok", "group", "train_seconds"}`` (wall: the
leaf's clock; group: devices trained in the same call; train_seconds: the wall seconds that call took).
A fresh run starts the files anew; a resumed one appends to them.
"""

from __future__ import annotations

import glob
import os
import threading

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext

from common.jsonio import JsonlWriter
from common.output import output_dir
from common.protocol import LEAF_INFO
from common.result_files import LEAF_LOGS, leaf_log
from common.run_scope import scoped


class LeafLogWriter(FLComponent):
    """Args:
    results_dir: the results folder ("": the server app's run folder).
    resume: the run continues an earlier one (keep its lines).
    run: in a pack, the run whose lines it writes (``common.run_scope``); None: a standalone job's.
    """

    def __init__(self, results_dir: str = "", resume: bool = False, run: int | None = None):
        super().__init__()
        self.results_dir = results_dir
        self.resume = resume
        self.run = run  # NVFlare writes each argument from the attribute of its name
        self._out = ""
        self._writers: dict[str, JsonlWriter] = {}
        self._lock = threading.Lock()  # leaves report on several threads at once
        self.register_event_handler(EventType.START_RUN, self._start)
        self.register_event_handler(LEAF_INFO, scoped(run, self._write))
        self.register_event_handler(EventType.END_RUN, self._close)

    def _start(self, _event: str, fl_ctx: FLContext) -> None:
        self._out = output_dir(self.results_dir, fl_ctx)
        if not self.resume:
            for path in glob.glob(os.path.join(self._out, LEAF_LOGS)):
                os.remove(path)

    def _write(self, _event: str, fl_ctx: FLContext) -> None:
        for leaf, lines in (fl_ctx.get_prop(LEAF_INFO).get("reports") or {}).items():
            with self._lock:
                writer = self._writers.get(leaf)
                if writer is None:
                    writer = self._writers[leaf] = JsonlWriter(os.path.join(self._out, leaf_log(leaf)))
                writer.write_many(lines)

    def _close(self, _event: str, fl_ctx: FLContext) -> None:
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers = {}

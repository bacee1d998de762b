"""Saves the run's newest global model as ``global_model.pt`` (a state dict:
``Model().load_state_dict(torch.load(p))``).

It saves each recorded version, and the run's last version as soon as the outcome is decided
(``VERSION_MADE_LAST``, before that version is evaluated): a run whose last evaluation never ends (a killed server)
still has its last version on disk, and ``python -m jobs.finish`` can evaluate it afterwards. It never replaces a
newer version with an older one, nor saves one twice (with ``--eval-backlog wait`` older versions are recorded after the outcome). After
each write it fires ``MODEL_SAVED`` with the version the file holds, which ``metrics.json`` records
(``saved_version``).
"""

from __future__ import annotations

import os
import threading

import torch
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext

from common.jsonio import replacing
from common.output import output_dir
from common.result_files import GLOBAL_MODEL
from common.run_scope import scoped
from evaluation.evaluator import load_into
from evaluation.events import (
    MODEL_SAVED,
    SAVED_VERSION,
    VERSION_MADE_LAST,
    VERSION_RECORD,
    VERSION_RECORDED,
    VERSION_WEIGHTS,
)
from processors.models import build_model


class GlobalModelSaver(FLComponent):
    """Args:
    model: model name (``processors.models``).
    results_dir: where ``global_model.pt`` goes.
    run: in a pack, the run whose model it saves (``common.run_scope``); None: the job's one run.
    """

    def __init__(self, model: str, results_dir: str, run: int | None = None):
        super().__init__()
        self.run = run
        self.model = model
        self.results_dir = results_dir
        self._net = None
        self._saved = 0  # the version global_model.pt holds (0: none yet)
        # the last version is saved on the assessor's thread, recorded ones on the evaluator's: one at a time, so an
        # older version never lands over a newer one and ``saved_version`` is what the file holds
        self._lock = threading.Lock()
        self.register_event_handler(VERSION_RECORDED, scoped(run, self._save))
        self.register_event_handler(VERSION_MADE_LAST, scoped(run, self._save))

    def _save(self, _event: str, fl_ctx: FLContext) -> None:
        version = int((fl_ctx.get_prop(VERSION_RECORD) or {}).get("version") or 0)
        with self._lock:
            if version <= self._saved:  # saved already, or an older version recorded after the last one was saved
                return
            if self._net is None:
                self._net = build_model(self.model)
            state = load_into(self._net, fl_ctx.get_prop(VERSION_WEIGHTS)).state_dict()
            path = os.path.join(output_dir(self.results_dir, fl_ctx), GLOBAL_MODEL)
            with replacing(path) as tmp:
                torch.save({k: v.cpu() for k, v in state.items()}, tmp)
            self._saved = version
            self.fire_event_with_data(MODEL_SAVED, fl_ctx, SAVED_VERSION, version)  # in order, as saved

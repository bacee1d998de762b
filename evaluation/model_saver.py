"""Saves each recorded global model as ``global_model.pt`` (a state dict: ``Model().load_state_dict(torch.load(p))``)."""

from __future__ import annotations

import os

import torch
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext

from common.output import output_dir
from common.result_files import GLOBAL_MODEL
from evaluation.evaluator import load_into
from evaluation.events import VERSION_RECORDED, VERSION_WEIGHTS
from processors.models import build_model


class GlobalModelSaver(FLComponent):
    """Args:
    model: model name (``processors.models``).
    results_dir: where ``global_model.pt`` goes.
    """

    def __init__(self, model: str, results_dir: str):
        super().__init__()
        self.model = model
        self.results_dir = results_dir
        self._net = None
        self.register_event_handler(VERSION_RECORDED, self._save)

    def _save(self, _event: str, fl_ctx: FLContext) -> None:
        if self._net is None:
            self._net = build_model(self.model)
        state = load_into(self._net, fl_ctx.get_prop(VERSION_WEIGHTS)).state_dict()
        path = os.path.join(output_dir(self.results_dir, fl_ctx), GLOBAL_MODEL)
        torch.save({k: v.cpu() for k, v in state.items()}, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)

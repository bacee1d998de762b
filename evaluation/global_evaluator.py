"""Evaluates every new global model on the test split of the project's own dataset source and records it.

Unlike NVFlare's ``GlobalEvaluator`` it neither embeds data in the job config nor downloads: it loads the same
``DatasetSpec`` the devices use. After each evaluated version it rewrites ``metrics.json`` (so nothing is lost
if the run dies), saves ``global_model.pt``, logs to TensorBoard and prints one progress line.
"""

from __future__ import annotations

import json
import os
import threading
import time

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


def write_json_atomic(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)


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
        device = resolve_device(self.compute_device)
        self._net = build_model(self.model).to(device)
        data = load_dataset(DatasetSpec(**self.dataset))
        self._data = (data.x_test.to(device), data.y_test.to(device))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=os.path.join(self._out, "tensorboard"))
        except ImportError:  # tensorboard is a declared dependency; keep evaluating if someone removed it
            self.log_warning(fl_ctx, "tensorboard is not installed: no TensorBoard events will be written")

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
            record = {
                "version": version,
                "accuracy": round(accuracy, 5),
                "wall_seconds": round(time.time() - self._start, 3),
                "eval_seconds": round(time.time() - started, 3),
                "epoch": round(time.time(), 3),  # lets the driver line this record up with the leaves' clocks
            }
            self._records.append(record)
            torch.save(
                {k: v.cpu() for k, v in self._net.state_dict().items()}, os.path.join(self._out, "global_model.pt")
            )
            self._write()
            if self._tb:
                self._tb.add_scalar("accuracy", accuracy, version)
                self._tb.add_scalar("accuracy_vs_wall_seconds", accuracy, int(record["wall_seconds"]))
                self._tb.flush()
            print(self._progress_line(record), flush=True)

    def _progress_line(self, record: dict) -> str:
        version, wall = record["version"], record["wall_seconds"]
        trained_versions = max(version - 1, 0)
        line = f"[edgesim] version {version}"
        if self.max_model_version:
            line += f"/{self.max_model_version}"
        line += f" | accuracy {record['accuracy']:.4f} | {wall:.1f} s since start"
        if trained_versions:
            first = self._records[0]
            spans = version - first["version"]
            if spans:
                line += f" | {(wall - first['wall_seconds']) / spans:.2f} s/version"
            if self.updates_per_version:
                line += f" | {self.updates_per_version * trained_versions / wall:.1f} devices/s"
        return line

    def _write(self) -> None:
        payload = dict(self.run_info)
        payload["versions"] = self._records
        write_json_atomic(os.path.join(self._out, "metrics.json"), payload)

    def _end_run(self, _event: str, fl_ctx: FLContext) -> None:
        with self._lock:
            if self._out:
                self._write()
            if self._tb:
                self._tb.close()
                self._tb = None

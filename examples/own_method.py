"""Your own FL method, one file: FedBuff whose updates count less the staler they are.

The server strategy weights each buffered update by (1 + tau) ** -exponent (FedBuff's paper discusses such
staleness scaling); the method class names that strategy, its settings (``--sw-exponent`` on the command line,
``sw_exponent=`` in Python) and its presets. Everything else (exact simulated time, selection, B, events,
checkpoints, evaluation) is the project's.

    python examples/own_method.py                      # through the Python API, below
    python jobs/pt_job_fedrevive.py --method own_method:StalenessWeightedFedBuff --sw-exponent 1.0 ...
        (with this folder on PYTHONPATH)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregation.strategy import ModelHistory, ServerStrategy, Update, Weights
from jobs.methods import Method


class StalenessWeightedMean(ServerStrategy):
    """global + global_lr * sum(w_i * diff_i) / sum(w_i * count_i), w_i = (1 + tau_i) ** -exponent."""

    def __init__(self, global_lr: float = 1.0, exponent: float = 0.5):
        self.global_lr, self.exponent = global_lr, exponent
        self._sum: Weights | None = None
        self._weight = 0.0

    def add_update(self, update: Update, model: ModelHistory) -> None:
        w = np.float32((1.0 + update.tau) ** -self.exponent)
        scaled = {k: w * v for k, v in update.diff.items()}
        self._sum = scaled if self._sum is None else {k: self._sum[k] + scaled[k] for k in scaled}
        self._weight += float(w) * update.count

    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        scale = np.float32(self.global_lr / self._weight)
        new = {k: v + scale * self._sum[k] for k, v in model.current_weights.items()}
        self._sum, self._weight = None, 0.0
        return new

    def state_dict(self) -> dict:
        return {"sum": self._sum, "weight": self._weight}

    def load_state_dict(self, state: dict) -> None:
        self._sum, self._weight = state["sum"], state["weight"]


@dataclass(frozen=True)
class StalenessWeighting:
    """Staleness weighting of buffered updates.

    Attributes:
        exponent: an update of staleness tau counts (1 + tau) ** -exponent; 0 is plain FedBuff.
    """

    exponent: float = 0.5

    def __post_init__(self) -> None:
        if not self.exponent >= 0:
            raise ValueError(f"--sw-exponent {self.exponent}: must be >= 0 (0: plain FedBuff)")


class StalenessWeightedFedBuff(Method):
    """FedBuff with staleness-weighted buffers."""

    strategy = StalenessWeightedMean
    settings = StalenessWeighting
    flag_prefix = "sw"
    presets = {"device_selection_size": 100, "num_updates_for_model": 2, "min_hole_to_fill": 1, "global_lr": 0.05}

    def strategy_args(self, cfg) -> dict:
        return super().strategy_args(cfg) | {"exponent": cfg.method_settings.exponent}


if __name__ == "__main__":  # the job's processes import this file for the method: keep the run below the guard
    from jobs.api import run

    result = run(
        method=StalenessWeightedFedBuff,
        sw_exponent=1.0,
        delays="paper",
        num_leaf_nodes=2,
        devices_per_leaf=12,
        device_selection_size=8,
        max_model_version=12,
        synthetic_size=1500,
        subset_size=40,
        local_iters=2,
        local_batch_size=16,
        global_lr=0.5,
    )
    print(f"exit code {result.exit_code}, final accuracy {result.final_accuracy}, results in {result.output}")

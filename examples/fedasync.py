"""FedAsync (Xie et al. 2019, "Asynchronous Federated Optimization") as a method of one's own, in one file.

Every arrived update makes a new version (B = 1): the device's trained model x_new (the version it started from
plus its diff) is mixed in, x <- (1 - a_t) x + a_t x_new, with a_t = alpha * (1 + tau) ** -exponent (the paper's
polynomial staleness function s(tau) = (tau + 1) ** -a). Exact simulated time, selection, events, checkpoints
and evaluation are the project's.

    python examples/fedasync.py                                  # through the Python API, below
    PYTHONPATH=examples python jobs/pt_job_fedrevive.py --method fedasync:FedAsync --fa-alpha 0.8 ...
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aggregation.strategy import ModelHistory, ServerStrategy, Update, Weights
from jobs.methods import Method


class StalenessMixing(ServerStrategy):
    """x <- (1 - a_t) x + a_t (x_base + diff), a_t = alpha * (1 + tau) ** -exponent, for each update in turn."""

    def __init__(self, alpha: float = 0.6, exponent: float = 0.5):
        self.alpha, self.exponent = alpha, exponent
        self._next: Weights | None = None  # the mixed model since the last version

    def add_update(self, update: Update, model: ModelHistory) -> None:
        a = np.float32(self.alpha * (1.0 + update.tau) ** -self.exponent)
        current = self._next if self._next is not None else model.current_weights
        base = model.weights_of(update.base_version)
        self._next = {k: (1 - a) * v + a * (base[k] + update.diff[k] / update.count) for k, v in current.items()}

    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        new = self._next if self._next is not None else {k: v.copy() for k, v in model.current_weights.items()}
        self._next = None
        return new

    def state_dict(self) -> dict:
        return {"next": self._next}

    def load_state_dict(self, state: dict) -> None:
        self._next = state["next"]


@dataclass(frozen=True)
class FedAsyncSettings:
    """FedAsync's mixing.

    Attributes:
        alpha: the mixing weight of a fresh update, in (0, 1].
        exponent: the polynomial staleness exponent a: an update of staleness tau mixes in alpha * (1 + tau) ** -a.
    """

    alpha: float = 0.6
    exponent: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"--fa-alpha {self.alpha}: must be in (0, 1]")
        if not self.exponent >= 0:
            raise ValueError(f"--fa-exponent {self.exponent}: must be >= 0 (0: no staleness discount)")


class FedAsync(Method):
    """FedAsync: each update mixed into the global model as it arrives, discounted by its staleness."""

    strategy = StalenessMixing
    settings = FedAsyncSettings
    flag_prefix = "fa"
    presets = {"device_selection_size": 100, "num_updates_for_model": 1, "min_hole_to_fill": 1}

    def strategy_args(self, cfg) -> dict:
        s = cfg.method_settings
        return {"alpha": s.alpha, "exponent": s.exponent}


if __name__ == "__main__":  # the job's processes import this file for the method: keep the run below the guard
    from jobs.api import run

    result = run(
        method=FedAsync,
        fa_alpha=0.8,
        delays="paper",
        num_leaf_nodes=2,
        devices_per_leaf=12,
        device_selection_size=8,
        max_model_version=12,
        synthetic_size=1500,
        subset_size=40,
        local_iters=2,
        local_batch_size=16,
    )
    print(f"exit code {result.exit_code}, final accuracy {result.final_accuracy}, results in {result.output}")

"""FedNova (Wang et al. 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization"): each device's update normalised by its number of local steps, so devices that take more steps do
not pull the model towards their own objective.

Device i reports its local steps ``tau_i`` (``steps``) and its sample count ``n_i`` (the sum of its label
histogram, ``label_counts``), beside its diff ``y_i - x``. With plain SGD its normalising factor is
``a_i = tau_i``; with SGD momentum ``rho`` (``--momentum`` through ``jobs.api``),
``a_i = (tau_i - rho * (1 - rho^tau_i) / (1 - rho)) / (1 - rho)``. The server, after B updates, with
``p_i = n_i / sum_j n_j`` over them:

    tau_eff = sum_i p_i * a_i,    x <- x + eta_g * tau_eff * sum_i p_i * (y_i - x) / a_i

The model's data statistics are the devices' mean, as in FedAvg (``aggregation.buffered_mean``). The engines give
every device ``--local-iters`` steps, so ``tau_i`` is the same for all of them today and FedNova differs from
FedAvg by its ``n_i`` weights; the normalisation is exact for any ``tau_i`` a device reports.

    PYTHONPATH=examples python jobs/pt_job_fedrevive.py --method fednova:FedNova --optimizer sgd ...
"""

from __future__ import annotations

import numpy as np

from aggregation.buffered_mean import BufferedMean
from aggregation.strategy import ModelHistory, Update, Weights
from common.choices import ConfigError
from common.protocol import LABEL_COUNTS, STEPS
from jobs.methods import FedAvg


def normaliser(tau: float, momentum: float) -> float:
    """a_i: the sum of the weights local SGD (with momentum ``rho``) gives its ``tau`` gradients."""
    if momentum == 0:
        return tau
    return (tau - momentum * (1 - momentum**tau) / (1 - momentum)) / (1 - momentum)


class FedNovaStrategy(BufferedMean):
    """Args:
    global_lr: eta_g.
    momentum: the devices' SGD momentum (0: plain SGD).
    """

    def __init__(self, global_lr: float = 1.0, momentum: float = 0.0):
        super().__init__(global_lr)
        self.momentum = momentum
        self._normalised: Weights = {}  # sum_i n_i * (y_i - x) / a_i
        self._samples = 0.0  # sum_i n_i
        self._weighted_a = 0.0  # sum_i n_i * a_i

    def add_update(self, update: Update, model: ModelHistory) -> None:
        super().add_update(update, model)  # the statistics' mean
        n = float(update.reports[LABEL_COUNTS].sum())
        a = normaliser(float(update.reports[STEPS]), self.momentum)
        scale = np.float32(n / a)
        for k, v in update.diff.items():
            if k in self.context.statistics:
                continue
            if k in self._normalised:
                self._normalised[k] += scale * v
            else:
                self._normalised[k] = scale * v
        self._samples += n
        self._weighted_a += n * a

    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        new = super().make_version(model, sim_time)
        if self._samples > 0:
            tau_eff = self._weighted_a / self._samples
            scale = np.float32(self.global_lr * tau_eff / self._samples)
            for k, v in self._normalised.items():
                new[k] = model.current_weights[k] + scale * v
        self._normalised, self._samples, self._weighted_a = {}, 0.0, 0.0
        return new

    def state_dict(self) -> dict:
        return super().state_dict() | {"normalised": self._normalised, "n": self._samples, "na": self._weighted_a}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._normalised, self._samples, self._weighted_a = state["normalised"], state["n"], state["na"]


class FedNova(FedAvg):
    """Synchronous FedNova."""

    name = ""  # a user's method is named by its import path
    strategy = FedNovaStrategy
    presets = {"device_selection_size": 100, "global_lr": 1.0}

    def strategy_args(self, cfg) -> dict:
        return super().strategy_args(cfg) | {"momentum": cfg.training.momentum}

    def reports(self, cfg) -> tuple[str, ...]:
        return super().reports(cfg) + (STEPS, LABEL_COUNTS)

    def leaf_sums(self, cfg) -> bool:
        return False  # each device's own steps and samples

    def check(self, cfg) -> None:
        super().check(cfg)
        if cfg.training.optimizer != "sgd":
            raise ConfigError(
                f"FedNova normalises local SGD steps: give --optimizer sgd (not {cfg.training.optimizer})"
            )
